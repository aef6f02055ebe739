"""The prompts recursa sends (the root's system prompt and worked example, the planner's plans and
examples, the answer steps, the leaf questions) use no task family's words: its labels, its
record fields, the content words of its queries. A worked example in a family's own words tunes
the method to that family (the planner's example was judge_agg's "complaint" / "praise" / "Shop",
and the root copied "praise" into 13 of 30 test plans whose question never said it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from recursa import core
from recursa.bench.baselines import STOPWORDS
from recursa.bench.tasks import TASKS, get_task
from recursa.core import combinators, prompts
from recursa.core.strategies import plan as planner
from recursa.core.strategies.plans import KINDS
from recursa.core.strategies.plans import answer_steps as plan_answers
from recursa.core.strategies.plans.repl import answers, common, sources

# English function words, and words every prompt about records and questions needs, whatever
# the family: neither says which family a prompt was written for
GENERIC = STOPWORDS | frozenset("""
that what with when from have many most only such each list them into several nothing must
same does done make made like just also than then were will shall your yours over upon onto
whose whom within without across along among because since until unless though although
data example examples input output words word name names final read calls code json
collections judge written object contain contains common pair pairs either counted round
choice details thing things often
""".split()) | frozenset("""
about above after again answer answers asked before being below between context could count
counts digits every first found given label labels least line lines long longer longest model
number numbers other piece pieces question questions record records shortest short should text
their there these those three times under using where which while whole would write right
again against entry entries exactly files first found language python program pieces person
people value values
""".split())


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z][A-Za-z-]{3,}", text)}


def family_vocabulary(name: str, seeds: range = range(6)) -> set[str]:
    """A family's own words: the labels and names in its instances' meta, the field names of
    its records, and the content words of its queries (the words every prompt needs aside)."""
    task = get_task(name)
    vocab: set[str] = set()
    for seed in seeds:
        try:
            inst = task.generate(seed, 4000, split="dev")
        except TypeError:
            inst = task.generate(seed, 4000)
        vocab |= _words(inst.query)
        ctx = inst.context if isinstance(inst.context, str) else ""
        vocab |= {f.lower() for f in re.findall(r"(?:^|\| |\|\| )([A-Z][A-Za-z]{3,20}):", ctx,
                                                re.M)}
        for key in ("labels", "label_space", "shops", "products", "sites", "kinds"):
            v = inst.meta.get(key)
            if isinstance(v, list | tuple):
                vocab |= {w for x in v if isinstance(x, str) for w in _words(x)}
    return vocab - GENERIC


def repl_code() -> str:
    """All the REPL-side code the plans send (its strings reach leaves as instructions)."""
    return sources(common, answers, *(f for k in KINDS.values() for f in k.repl))


def prompt_texts() -> dict[str, str]:
    """Every fixed text recursa writes into a model's prompt."""
    return {
        "root system": prompts.system_prompt(context_type="str", max_output_chars=8192),
        "root system (sources)": prompts.system_prompt(context_type="str",
                                                       max_output_chars=8192, sources=True),
        "first user": prompts.FIRST_USER, "continue": prompts.CONTINUE,
        "last turn": prompts.LAST_TURN, "no code": prompts.NO_CODE,
        "plan system": planner.PLAN_SYSTEM, "plan user": planner.PLAN_USER,
        "plan results": planner.RESULTS, "plan answer": planner.ANSWER_SYSTEM,
        "plan code's texts": " ".join(
            n.value for n in ast.walk(ast.parse(repl_code()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)),
        "query leaf": planner.QUERY_LEAF,
        "count system": plan_answers.COUNT_SYSTEM,
        "count ops": " ".join(plan_answers.COUNT_OPS.values()),
        "pair system": plan_answers.PAIR_SYSTEM, "rank leaf": combinators.RANK_PROMPT,
    }


@pytest.mark.parametrize("family", sorted(TASKS))
def test_no_prompt_uses_a_task_familys_words(family):
    vocab = family_vocabulary(family)
    found = {where: sorted(vocab & _words(text)) for where, text in prompt_texts().items()}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"{family}'s words in recursa's prompts: {found}"


def test_the_vocabulary_check_can_fail():
    """judge_agg's own words are found where they are used (so an empty result above means
    something)."""
    vocab = family_vocabulary("judge_agg")
    assert {"shop", "complaint"} <= vocab
    assert {"shop", "complaint"} <= _words("Which Shop had the most complaint records?")


CORE = Path(core.__file__).parent


def core_names_of_families(text: str) -> list[str]:
    """The task families `text` names and the seeds it cites."""
    found = [n for n in sorted(TASKS)
             if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
    return found + re.findall(r"(?i)\b(?:dev|test) seeds? \d+|\bseeds? \d+", text)


def test_the_core_names_no_task_family_and_cites_no_seed():
    """The core's source (code, comments, REPL-side modules) says why without naming the
    benchmark that showed it: a family's name or seed in the core ties the method to it."""
    found = {str(p.relative_to(CORE)): hits for p in sorted(CORE.rglob("*.py"))
             if (hits := core_names_of_families(p.read_text()))}
    assert not found, f"task families or seeds named in recursa.core: {found}"


def test_the_family_name_check_can_fail():
    assert core_names_of_families("overflowed (judge_pairs test seed 4)") == [
        "judge_pairs", "test seed 4"]
    assert core_names_of_families("a two_hop plan, para_niah_mv") == ["para_niah_mv", "two_hop"]
