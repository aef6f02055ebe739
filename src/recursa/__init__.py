"""recursa: Recursive Language Models."""

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

__all__ = [
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
