"""The task family registry (recursa.frontend.tasks): every family declares the kinds of answer
it asks for and gives each instance's shape; a new family is one class plus one registration
(a row, an entry point or `register_task`), and the bench, the environments and the baselines
use it with no branch on its name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from recursa.base.plugins import PluginError
from recursa.bench.baselines import regex_answer, shape_of
from recursa.bench.tasks import SPLIT_FAMILIES, TASKS, Instance, Score, Task, get_task
from recursa.envs.base import Env
from recursa.frontend import tasks as registry


class Tally(Task):
    """A family made up here: count the lines that say 'tick'."""

    name = "tally_test"
    description = "count the ticks"
    complexity = "linear"
    answer_kinds: ClassVar[tuple[str, ...]] = ("number",)

    def generate(self, seed: int = 0, length_tokens: int | None = None, **options: Any) -> Instance:
        rng = self.rng(seed, length_tokens or 100)
        lines = [rng.choice(["tick", "tock"]) for _ in range(20)]
        return Instance(id=self.make_id(seed, length_tokens or 100), task=self.name,
                        query="How many lines say tick?", context="\n".join(lines),
                        gold=str(lines.count("tick")), length_tokens=length_tokens or 100)

    def score(self, prediction: str, inst: Instance) -> Score:
        return Score(score=float(prediction.strip() == inst.gold))


@pytest.fixture
def tally():
    registry.register_task(Tally)
    yield
    registry.unregister_task("tally_test")


def test_every_family_declares_its_answer_kinds() -> None:
    assert list(TASKS)[:3] == ["sniah", "oolong", "oolong_pairs"]     # the table's order
    for name in TASKS:
        kinds = get_task(name).answer_kinds
        assert kinds and set(kinds) <= set(registry.ANSWER_KINDS), name


@pytest.mark.slow      # 11 s here (2 busy cores): some families read their corpora first
def test_every_familys_instances_keep_to_its_answer_kinds() -> None:
    for name in TASKS:
        family = get_task(name)
        split = {"split": "dev"} if name in SPLIT_FAMILIES else {}
        for seed in range(3):
            inst = family.generate(seed, 2048, **split)
            assert shape_of(inst)["kind"] in family.answer_kinds, (name, seed)


def test_a_new_family_is_one_class_and_one_registration(tally: None) -> None:
    family = get_task("tally_test")
    assert "tally_test" in TASKS and TASKS["tally_test"] is family
    inst = family.generate(3)
    assert shape_of(inst) == {"kind": "number"}
    assert regex_answer(inst, "0") == "0"           # the baselines read the shape, not the name
    env = Env(name="tally", task="tally_test", description="", tips="", default_length=100)
    assert env.reward(inst.gold, env.instance(3)) == 1.0     # the environments reach it too
    with pytest.raises(ValueError, match="already registered"):
        registry.register_task(Tally)


def test_a_family_without_answer_kinds_or_unknown_is_refused_by_name() -> None:
    class Vague(Tally):
        name = "vague_test"
        answer_kinds = ()

    registry.register_task(Vague)
    try:
        with pytest.raises(PluginError, match="'vague_test' must declare answer_kinds"):
            get_task("vague_test")
    finally:
        registry.unregister_task("vague_test")
    with pytest.raises(KeyError, match="unknown task 'nope'; known: sniah, oolong"):
        get_task("nope")


def test_another_package_adds_a_family_through_the_entry_point(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """A real installed distribution's entry point in the `recursa.tasks` group (metadata on
    sys.path), not a registration in this process."""
    (tmp_path / "recursa_tally.py").write_text(
        "from recursa.bench.tasks import Instance, Score, Task\n\n\n"
        "class Tally(Task):\n"
        "    name = 'tally_test'\n"
        "    description = 'count the ticks'\n"
        "    complexity = 'linear'\n"
        "    answer_kinds = ('number',)\n\n"
        "    def generate(self, seed=0, length_tokens=None, **options):\n"
        "        return Instance(id=str(seed), task=self.name, query='How many ticks?',\n"
        "                        context='tick tock tick', gold='2', length_tokens=3)\n\n"
        "    def score(self, prediction, inst):\n"
        "        return Score(score=float(prediction.strip() == inst.gold))\n")
    dist = tmp_path / "recursa_tally-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: recursa-tally\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[recursa.tasks]\ntally_test = recursa_tally:Tally\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    registry.FAMILIES.refresh()
    try:
        assert "tally_test" in registry.task_names()
        family = get_task("tally_test")
        assert type(family).__module__ == "recursa_tally"
        assert family.score("2", family.generate(1)).score == 1.0
    finally:
        monkeypatch.undo()
        sys.modules.pop("recursa_tally", None)
        registry.FAMILIES.refresh()
        registry._made.pop("tally_test", None)
    assert "tally_test" not in registry.task_names()
