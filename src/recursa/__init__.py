"""recursa: Recursive Language Models.

The names below load on first use (PEP 562), so `import recursa` and the `recursa` command's
`--version` / `--help` cost no more than they use; `from recursa import RLM` works as always.
Importing recursa changes nothing process-wide: no thread, no exit or fork hook, no import
hook, the garbage collector left as it is (what recursa keeps running is started on use and
owned by `recursa.background`).
"""

from __future__ import annotations

TYPE_CHECKING = False     # typing's constant, as mypy reads it, without importing typing
if TYPE_CHECKING:
    from typing import Any

    from recursa.budget import Budget
    from recursa.images import Image
    from recursa.rlm import RLM, acompletion, completion
    from recursa.types import (
        BudgetExceeded,
        Cell,
        Completion,
        ContextError,
        Event,
        ModelError,
        RecursaError,
        Result,
        SandboxError,
        Usage,
    )

# public name -> the module that defines it
_EXPORTS = {
    "RLM": "recursa.rlm",
    "Budget": "recursa.budget",
    "Image": "recursa.images",
    "acompletion": "recursa.rlm",
    "completion": "recursa.rlm",
    "BudgetExceeded": "recursa.types",
    "Cell": "recursa.types",
    "Completion": "recursa.types",
    "ContextError": "recursa.types",
    "Event": "recursa.types",
    "ModelError": "recursa.types",
    "RecursaError": "recursa.types",
    "Result": "recursa.types",
    "SandboxError": "recursa.types",
    "Usage": "recursa.types",
}

__all__ = [
    "RLM",
    "Budget",
    "Image",
    "acompletion",
    "completion",
    "BudgetExceeded",
    "Cell",
    "Completion",
    "ContextError",
    "Event",
    "ModelError",
    "RecursaError",
    "Result",
    "SandboxError",
    "Usage",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'recursa' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value        # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
