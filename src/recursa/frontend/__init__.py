"""The front ends' floor: what the commands, the server, the bench and the environments share
(the model options, reading contexts, the stderr console and notices, the answer schema, the
command line's lean imports, the task family registry). It sits between the core and the front
ends: every front end may import it, it imports no front end (tests/test_layers.py).

Importing this package imports nothing: `recursa --version` pays only for what it uses.
"""
