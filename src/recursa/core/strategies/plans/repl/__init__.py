"""REPL-side code: plain, typed Python modules whose source the runtime sends into the sandbox.

The functions a plan runs in the REPL live in real modules, so ruff and mypy check them like any
other; what is sent is their source, read back with `inspect`, with the lines that exist only
for the checkers taken out: the module docstring, imports (the REPL already holds `re`, `json`,
`collections` and its helpers), `if TYPE_CHECKING:` blocks and annotations (the names they use,
such as `Any`, are not in the REPL). A REPL-side module may use only what the REPL namespace
holds (`recursa.sandbox.worker.Repl`): the names `recursa.core.strategies.plans.repl.names` declares.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any


class _Strip(ast.NodeTransformer):
    """Annotations and checker-only statements out; what runs is unchanged."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None:
                arg.annotation = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:          # a declaration only
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_If(self, node: ast.If) -> ast.AST | None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return None
        self.generic_visit(node)
        return node

    def visit_Import(self, node: ast.Import) -> None:
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None


@cache
def source(part: ModuleType | Callable[..., Any]) -> str:
    """The REPL code of a REPL-side module (every statement but the checker-only ones) or of one
    function defined in a host module."""
    tree = ast.parse(inspect.getsource(part))
    body = tree.body
    if isinstance(part, ModuleType) and body and isinstance(body[0], ast.Expr) \
            and isinstance(body[0].value, ast.Constant):
        body = body[1:]          # the module docstring
    tree.body = body
    out = ast.fix_missing_locations(_Strip().visit(tree))
    return ast.unparse(out)


def sources(*parts: ModuleType | Callable[..., Any]) -> str:
    return "\n\n".join(source(p) for p in parts)
