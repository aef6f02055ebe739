"""Process-wide locks shared by layers that must not import each other."""

from __future__ import annotations

import threading

# CPython before 3.11.9 / 3.12.3 keeps the AST converter's recursion depth per interpreter, not
# per thread: two threads parsing at once can fail with "SystemError: AST constructor recursion
# depth mismatch" (python/cpython#106905). In-process sandboxes compile cells in many threads while
# the event loop parses replies, so every parse in this process takes this lock (the in-process
# sandbox hands it to the worker module it loads).
AST_LOCK = threading.Lock()
