"""The runtime_env for the tests' Ray instances on this machine, wherever the checkout lives.

Ray (2.60) starts a worker that has a runtime_env through `bash -c "exec <py_executable> ..."`
with the interpreter's path unquoted, so from a venv whose path has a space no such worker ever
starts. `py_executable` is documented as a command, so this interpreter, shell-quoted, is the
default made safe (only on this machine: a cluster's nodes have interpreters of their own).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent


def local_runtime_env(**env_vars: str) -> dict[str, Any]:
    """`env_vars` for the workers, which also import test modules from tests/."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
    return {"py_executable": shlex.quote(sys.executable),
            "env_vars": {"PYTHONPATH": path, **env_vars}}
