"""Task families by name: the one registry the bench, the environments and the demos look
families up in (`get_task("sniah")`).

A family turns a seed into an instance (a query over a context, with its gold answer) and scores
an answer against one. Every family declares the kinds of answer it asks for (`answer_kinds`,
from ANSWER_KINDS) and gives each instance's answer shape (`answer_shape(inst)`: the kind and
what it needs, e.g. the candidates of a choice), which the no-model baselines read instead of
asking which family an instance came from.

recursa's own families are the rows of the bench's family table, which reaches this registry
through recursa's own entry point in the `recursa.task_tables` group (pyproject.toml), so this
floor names no front end. Another package adds a family through the `recursa.tasks` group:

    [project.entry-points."recursa.tasks"]
    mytask = "recursa_mytask:MyTask"       # a TaskFamily class, or a factory of one

and `register_task(MyTask)` adds one for this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple, Protocol, get_args

from recursa.base.plugins import PluginError, Registry

# The kinds of answer a family asks for:
#   digits      one code of n digits          digits_set  several codes of n digits, one a line
#   number      a count or a quantity         choice      one of the candidates (a label)
#   pairs       pairs of ids, "(a, b)" a line text        free text (a passage, a copy, code)
AnswerKind = Literal["digits", "digits_set", "number", "choice", "pairs", "text"]
ANSWER_KINDS: tuple[str, ...] = get_args(AnswerKind)

TABLE_GROUP = "recursa.task_tables"     # recursa's own table of families
GROUP = "recursa.tasks"                 # one family per entry point (other packages)


class TaskInstance(Protocol):
    """One generated problem (recursa's families make a recursa.bench.tasks.base.Instance)."""

    id: str
    task: str
    query: str
    context: Any
    gold: Any
    meta: dict[str, Any]
    length_tokens: int


class TaskFamily(Protocol):
    """What the bench, the environments and the demos need of a family (recursa's own derive
    from recursa.bench.tasks.base.Task)."""

    name: str
    description: str
    answer_kinds: tuple[str, ...]

    def generate(self, seed: int = 0, length_tokens: int | None = None,
                 **options: Any) -> TaskInstance:
        """The instance for `seed`."""

    def score(self, prediction: str, inst: Any) -> Any:
        """How well `prediction` answers `inst` (an object with `score` in [0, 1])."""

    def answer_shape(self, inst: Any) -> dict[str, Any]:
        """`{"kind": <one of answer_kinds>, ...}`: what an answer to `inst` looks like."""


class FamilyEntry(NamedTuple):
    """A registered family: its name and what makes it (a class, or a factory)."""

    name: str
    factory: Callable[[], TaskFamily]


def _recursa_tables() -> Iterable[tuple[str, FamilyEntry]]:
    """recursa's own families, table by table (the group's entry points are read once)."""
    from importlib.metadata import entry_points
    for ep in entry_points(group=TABLE_GROUP):
        try:
            table = ep.load()
        except Exception as e:
            raise PluginError(f"the task family table {ep.value!r} (group {TABLE_GROUP!r}) "
                              f"cannot be loaded: {type(e).__name__}: {e}") from e
        for factory in table:
            yield factory.name, FamilyEntry(factory.name, factory)


FAMILIES: Registry[FamilyEntry] = Registry(GROUP, "task family", _recursa_tables, FamilyEntry)
_made: dict[str, TaskFamily] = {}     # families are stateless: one of each per process


def task_names() -> list[str]:
    """Every family's name: recursa's own in their table's order, then the others sorted."""
    return FAMILIES.names()


def get_task(name: str) -> TaskFamily:
    """The family called `name`; KeyError naming the known ones if there is none."""
    family = _made.get(name)
    if family is not None:
        return family
    entry = FAMILIES.get(name)
    if entry is None:
        known = ", ".join(task_names()) or (
            f"none: recursa's own come through its entry point in group {TABLE_GROUP!r}; "
            "install recursa (pip install -e .) so that its metadata is there")
        raise KeyError(f"unknown task {name!r}; known: {known}")
    family = check_family(name, entry.factory())
    _made[name] = family
    return family


def check_family(name: str, family: Any) -> TaskFamily:
    """`family` if it is one called `name` that declares its answer kinds; else PluginError."""
    missing = [m for m in ("generate", "score", "answer_shape")
               if not callable(getattr(family, m, None))]
    if missing:
        raise PluginError(f"task family {name!r} has no {', '.join(missing)}")
    if getattr(family, "name", None) != name:
        raise PluginError(f"task family {name!r} calls itself {getattr(family, 'name', None)!r}")
    kinds = getattr(family, "answer_kinds", None)
    if not kinds or not isinstance(kinds, tuple) or not set(kinds) <= set(ANSWER_KINDS):
        raise PluginError(f"task family {name!r} must declare answer_kinds, a tuple of "
                          f"{', '.join(ANSWER_KINDS)}; got {kinds!r}")
    return family     # type: ignore[no-any-return]


def register_task(factory: Callable[[], TaskFamily], *, replace: bool = False) -> None:
    """Add a family (its class, or a factory of one) for this process, under its `name`."""
    name = factory.name      # type: ignore[attr-defined]
    FAMILIES.register(name, FamilyEntry(name, factory), replace=replace)
    _made.pop(name, None)


def unregister_task(name: str) -> None:
    FAMILIES.unregister(name)
    _made.pop(name, None)
