"""recursa: Recursive Language Models.

The names below load on first use (PEP 562), so `import recursa` and the `recursa` command's
`--version` / `--help` cost no more than they use; `from recursa import RLM` works as always.
Importing recursa changes nothing process-wide: no thread, no exit or fork hook, no import
hook, the garbage collector left as it is (what recursa keeps running is started on use and
owned by `recursa.base.background`).
"""

from __future__ import annotations

TYPE_CHECKING = False     # typing's constant, as mypy reads it, without importing typing
if TYPE_CHECKING:
    from typing import Any

    from recursa.base.images import Image
    from recursa.base.types import (
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
    from recursa.core.budget import Budget
    from recursa.core.config import (
        ConfigError,
        ModelsConfig,
        RLMConfig,
        SandboxConfig,
        StrategyConfig,
        TracingConfig,
    )
    from recursa.core.rlm import RLM, acompletion, completion

# public name -> the module that defines it
_EXPORTS = {
    "RLM": "recursa.core.rlm",
    "Budget": "recursa.core.budget",
    "RLMConfig": "recursa.core.config",
    "ModelsConfig": "recursa.core.config",
    "SandboxConfig": "recursa.core.config",
    "TracingConfig": "recursa.core.config",
    "StrategyConfig": "recursa.core.config",
    "ConfigError": "recursa.core.config",
    "Image": "recursa.base.images",
    "acompletion": "recursa.core.rlm",
    "completion": "recursa.core.rlm",
    "BudgetExceeded": "recursa.base.types",
    "Cell": "recursa.base.types",
    "Completion": "recursa.base.types",
    "ContextError": "recursa.base.types",
    "Event": "recursa.base.types",
    "ModelError": "recursa.base.types",
    "RecursaError": "recursa.base.types",
    "Result": "recursa.base.types",
    "SandboxError": "recursa.base.types",
    "Usage": "recursa.base.types",
}

__all__ = [
    "RLM",
    "Budget",
    "RLMConfig",
    "ModelsConfig",
    "SandboxConfig",
    "TracingConfig",
    "StrategyConfig",
    "ConfigError",
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
