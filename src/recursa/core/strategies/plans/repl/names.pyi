# The names every REPL cell holds (recursa.sandbox.worker.Repl), and the ones the plan code
# itself leaves there, declared for ruff and mypy; REPL-side modules import them only under
# TYPE_CHECKING.
from typing import Any

context: Any
answer: dict[str, Any]

def llm_query(prompt: Any, model: str | None = ..., images: Any = ..., **opts: Any) -> str: ...
def llm_map(instruction: Any, items: Any, labels: Any = ..., output: Any = ...,
            dry_run: bool = ..., max_tokens: Any = ..., model: Any = ...) -> Any: ...
def llm_filter(question: Any, items: Any, dry_run: bool = ..., model: Any = ...) -> Any: ...
def search(query: Any, k: int = ..., mode: str = ...) -> list[dict[str, Any]]: ...
def chunk(text: Any, size: Any = ..., overlap: int = ...) -> list[str]: ...
def pairs(items: Any, labels: Any = ..., keep: Any = ..., where: Any = ...,
          limit: int = ...) -> list[Any]: ...

# what the plan code leaves in the REPL for the steps after it
plan_read: list[tuple[str, str]]
records: list[str]
plan_labels: list[str]
record_labels: Any
label_counts: Any
id_counts: dict[str, Any]
id_unlabelled: Any
