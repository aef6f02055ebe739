"""Drop-in front ends for programs written against other RLM libraries.

- `recursa.compat.rlms`: the reference library `rlms` 0.1.3 (`from rlm import RLM`), on
  recursa's engine and sandbox (docs/migrating-from-rlms.md).
"""
