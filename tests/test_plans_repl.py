"""The REPL-side plan code (recursa.core.strategies.plans.repl and each kind's functions) is sent as source:
what is sent compiles, carries nothing only the checkers need, and reads no name the REPL does
not hold (recursa.sandbox.worker.Repl's namespace, the code's own definitions, or what an earlier
plan step leaves there)."""

from __future__ import annotations

import ast
import builtins
import sys

import pytest

from recursa.core.strategies import plan as planner
from recursa.core.strategies.plans import KINDS, parse, plan_code
from recursa.core.strategies.plans import answer_steps as plan_answers
from recursa.core.strategies.plans.repl import answers, common, source
from recursa.sandbox.worker import Repl, StreamRouter

PLANS = {
    "retrieve_read": {"plan": "retrieve_read", "question": "Where?", "keywords": ["kiln"]},
    "chained_lookup": {"plan": "chained_lookup", "first_question": "Who?", "second_question": "{answer}?"},
    "label_count": {"plan": "label_count", "label": "cracked", "opposite": "intact",
                    "group_by": "Kiln"},
    "pairs": {"plan": "pairs", "instruction": "Label.", "labels": ["a", "b"], "keep": ["a"],
              "id_prefix": "id"},
}
# left in the REPL by the plan cell before an answer step
LEFT = {"label_counts", "group_counts", "id_counts", "id_unlabelled", "record_labels",
        "plan_read", "records", "plan_labels"}


def repl_names() -> set[str]:
    repl = Repl(lambda kind, args: None, StreamRouter(sys.stdout, "stdout"),
                StreamRouter(sys.stderr, "stderr"))
    return set(repl.globals) | set(dir(builtins))


def unbound(code: str) -> set[str]:
    """Global names `code` reads that it never binds at module level or by `global`."""
    tree = ast.parse(code)
    bound = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in ast.walk(n)
             if isinstance(t, ast.Name)}
    bound |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    bound |= {x for n in ast.walk(tree) if isinstance(n, ast.Global) for x in n.names}
    local = {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
             for a in [*n.args, *n.kwonlyargs, *n.posonlyargs, n.vararg, n.kwarg] if a}
    local |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    local |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound - local


def sent_codes() -> dict[str, str]:
    out = {}
    for name, raw in PLANS.items():
        plan = parse(__import__("json").dumps(raw))
        for dry in (True, False):
            out[f"{name} dry={dry}"] = plan_code(plan, dry=dry, query="How many cracked?")
    rule = plan_answers.parse_pair_rule(
        '{"first_label": "a", "first_min": 1, "second_label": "b", "second_min": 0}', ["a", "b"])
    assert rule is not None
    out["count answer"] = plan_answers.count_code("how_many", "How many?", "a")
    out["pair answer"] = plan_answers.pair_code(rule)
    out["sources"] = planner.source_code("Kiln B")
    return out


def test_every_kind_is_registered_with_code_or_none():
    assert list(KINDS) == ["retrieve_read", "label_count", "chained_lookup", "pairs", "code"]
    assert set(PLANS) == {k for k, v in KINDS.items() if v.body is not None}


@pytest.mark.parametrize("where", sorted(sent_codes()))
def test_sent_code_compiles_and_reads_only_the_repls_names(where):
    code = sent_codes()[where]
    compile(code, where, "exec")
    tree = ast.parse(code)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)
                or (isinstance(n, ast.arg) and n.annotation is not None)
                or (isinstance(n, ast.FunctionDef) and n.returns is not None)]
    missing = unbound(code) - repl_names() - LEFT
    assert not missing, f"{where} reads names the REPL does not hold: {sorted(missing)}"


def test_the_name_check_can_fail():
    assert unbound("def f(x):\n    return x + y\nz = f(1)") == {"y"}


def test_a_repl_module_is_sent_without_its_checker_lines():
    code = source(common)
    assert "TYPE_CHECKING" not in code and "import" not in code.split("\n", 1)[0]
    assert code.startswith("plan_read = []")         # the docstring and imports are not sent
    assert "def _plan_retrieve(question, keywords, dry):" in code
    assert "def _plan_sourced(final):" in source(answers._plan_sourced)


def test_the_planning_prompt_and_schema_are_built_from_the_registry():
    """A kind's row is all the planner needs: its prompt line, in the registry's order, and its
    model in the schema the root's reply is constrained by."""
    from recursa.core.strategies.plans import plan_schema
    lines = [k.prompt for k in KINDS.values()]
    assert planner.PLAN_SYSTEM.endswith("\n".join(lines))
    at = [planner.PLAN_SYSTEM.index(x) for x in lines]
    assert at == sorted(at)
    consts = [v["properties"]["plan"]["const"] for v in plan_schema()["oneOf"]]
    assert consts == list(KINDS)
