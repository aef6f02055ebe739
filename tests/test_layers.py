"""The layer contract of src/recursa (docs/architecture.md), checked over the import graph.

Every import counts: at module level, inside functions, under TYPE_CHECKING and relative ones. A
unit is a top-level package or module of recursa (recursa.core, recursa.frontend, ...); the root
package `recursa` is a unit of its own. The lower layers may not even name a module above them in
a string (what importlib.import_module would load); the front ends' lazy command table
(recursa.cli.COMMANDS) names their modules by string on purpose and is no import edge.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "recursa"

# unit -> the units it may import (besides itself); a unit not named here is a front end, which
# may import anything below it
LOWER: dict[str, set[str]] = {
    "recursa.base": set(),
    "recursa.obs": {"recursa.base"},
    "recursa.models": {"recursa.base"},
    "recursa.sandbox": {"recursa.base"},
    "recursa.documents": {"recursa.base", "recursa.sandbox"},
    "recursa.core": {"recursa.base", "recursa.obs", "recursa.models", "recursa.sandbox",
                     "recursa.documents"},
    # the front ends' floor: what they share (options, contexts, the console, the task
    # registry); every front end may import it, it imports no front end
    "recursa.frontend": {"recursa.base", "recursa.obs", "recursa.models", "recursa.sandbox",
                         "recursa.documents", "recursa.core"},
    # the provider conformance kit a plugin's tests run (pytest inside): beside the floor,
    # and imported by no module of recursa (test_nothing_in_recursa_imports_the_testing_kit)
    "recursa.testing": {"recursa.base", "recursa.models", "recursa.core"},
}
FLOOR = "recursa.frontend"
TESTING = "recursa.testing"
# where one front end may import another: `python -m recursa` runs the command, and the demos
# are cases of the bench's task families. Anything else two front ends share lives in the
# floor (the environments reach the task families through its registry).
SIDEWAYS: dict[str, set[str]] = {
    "recursa.__main__": {"recursa.cli"},
    "recursa.demos": {"recursa.bench"},
}
# the old import paths retired after their one release (docs/architecture.md)
RETIRED = ("recursa.rlm", "recursa.types", "recursa.trace", "recursa.session", "recursa.console",
           "recursa.otel", "recursa.context", "recursa.images", "recursa.budget",
           "recursa.notebook", "recursa.batch.run")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports_of(module: str, path: Path, strings: bool = False) -> set[str]:
    """The recursa modules `module` imports, by any route; with `strings`, also the ones a string
    literal names (a logger's name aside)."""
    known = modules()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:      # recursa.x.Name -> recursa.x
            target = target.rpartition(".")[0]
        if target.startswith("recursa"):
            found.add(target)

    tree = ast.parse(path.read_text(), str(path))
    loggers = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call)
               and getattr(n.func, "attr", getattr(n.func, "id", "")) == "getLogger"
               for a in n.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                add(f"{base}.{alias.name}")
        elif (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and "." in node.value and node.value in known and id(node) not in loggers):
            add(node.value)
    found.discard(module)
    return found


@cache      # parsed once for the tests below that share it
def graph(strings: bool = False) -> dict[str, set[str]]:
    return {name: imports_of(name, path, strings) for name, path in modules().items()}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    bad = []
    for module, targets in graph(strings=True).items():
        allowed = LOWER.get(unit(module))
        if allowed is None:
            continue
        for target in sorted(targets):
            if unit(target) != unit(module) and unit(target) not in allowed:
                bad.append(f"{module} -> {target}")
    assert not bad, "imports across the layers the wrong way (docs/architecture.md):\n" + \
        "\n".join(bad)


def test_no_import_cycle_between_units() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph().items():
        for target in targets:
            if unit(target) != unit(module):
                edges[unit(module)].add(unit(target))
    cycles = [c for c in strongly_connected(edges) if len(c) > 1]
    assert not cycles, f"import cycles between packages: {cycles}"


def test_front_ends_share_through_the_floor_not_sideways() -> None:
    """A front end imports another front end only where SIDEWAYS says; what two of them share
    lives in the floor."""
    bad = []
    for module, targets in graph().items():
        if unit(module) in LOWER or unit(module) == "recursa":
            continue
        for target in sorted(targets):
            other = unit(target)
            if (other != unit(module) and other not in LOWER and other != "recursa"
                    and other not in SIDEWAYS.get(unit(module), set())):
                bad.append(f"{module} -> {target}")
    assert not bad, "front ends importing each other (move what they share into " \
        f"{FLOOR}, docs/architecture.md):\n" + "\n".join(bad)


def test_nothing_in_recursa_imports_the_testing_kit() -> None:
    """recursa.testing (which imports pytest) is for tests only: no module outside it names it,
    so neither `import recursa` nor any command loads pytest."""
    bad = [f"{module} -> {target}" for module, targets in graph(strings=True).items()
           if unit(module) != TESTING for target in sorted(targets) if unit(target) == TESTING]
    assert not bad, f"modules importing {TESTING} (tests only):\n" + "\n".join(bad)


def test_the_retired_old_paths_are_gone() -> None:
    """The old paths are gone, not forwarded: importing one fails, and nothing in the package
    is left at those names (recursa.batch is the `recursa batch` command, no re-export)."""
    import importlib

    import pytest

    import recursa.batch
    for name in RETIRED:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)
        assert name not in modules()
    assert not hasattr(recursa.batch, "BatchBudget")


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative enough for a few dozen nodes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


# Within the core: the engine (every recursa.core module outside recursa.core.strategies) reaches
# the strategies only through their seam, the package `recursa.core.strategies` (Strategy,
# strategy_for); a strategy never imports the loop that calls it.
STRATEGIES = "recursa.core.strategies"


def test_the_engine_meets_the_strategies_only_at_their_seam() -> None:
    bad = []
    for module, targets in graph(strings=True).items():
        inside = module == STRATEGIES or module.startswith(STRATEGIES + ".")
        for target in sorted(targets):
            if not inside and target.startswith(STRATEGIES + "."):
                bad.append(f"{module} -> {target} (use {STRATEGIES}.strategy_for)")
            if inside and target == "recursa.core.loop":
                bad.append(f"{module} -> {target} (a strategy sees the run's Protocol)")
    assert not bad, "the engine and the strategies cross (docs/architecture.md):\n" + \
        "\n".join(bad)
