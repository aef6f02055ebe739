"""Scorers on hand-checked cases."""

from __future__ import annotations

import math

import pytest

from recursa.bench import Instance, Score, get_task
from recursa.bench.scoring import (
    char_accuracy,
    copy_score,
    levenshtein_similarity,
    match_choice,
    math_equivalent,
    math_score,
    numeric_score,
    pairs_f1,
    parse_choice_letter,
    parse_pairs,
)


def _inst(task: str, gold, **meta) -> Instance:
    return Instance(id="x", task=task, query="q", context="", gold=gold, meta=meta, length_tokens=0)


def test_score_model_bounds() -> None:
    with pytest.raises(ValueError):
        Score(score=1.5)


# ---------------------------------------------------------------- sniah
@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        ("1234567", 1.0),
        ("The special magic number for amber-anchor is: 1234567.", 1.0),
        ("Answer: 1,234,567", 1.0),
        ("It is a 7-digit number: 1234567", 1.0),
        ("1234568", 0.0),
        ("Either 1234567 or 7654321", 0.0),  # hedging is not an answer
        ("I could not find it.", 0.0),
    ],
)
def test_sniah_scoring(pred: str, expected: float) -> None:
    inst = _inst("sniah", "1234567")
    assert get_task("sniah").score(pred, inst).score == expected


# ---------------------------------------------------------------- oolong
def _oolong(gold: str, answer_type: str, **meta) -> Instance:
    base = {"answer_type": answer_type, "label_space": ["People", "Geography", "Physical sciences"],
            "users": [11111, 22222, 33333], "dates": ["2023-03-01", "2024-01-09"]}
    base.update(meta)
    return _inst("oolong", gold, **base)


def test_oolong_numeric_partial_credit() -> None:
    task = get_task("oolong")
    inst = _oolong("10", "numeric")
    assert task.score("10", inst).score == 1.0
    assert task.score("There are 12 such records.", inst).score == pytest.approx(0.75**2)
    assert task.score("Answer: 7", inst).score == pytest.approx(0.75**3)
    assert task.score("I counted 3 chunks... final answer: 9", inst).score == pytest.approx(0.75)
    assert task.score("no idea", inst).score == 0.0
    assert numeric_score(8, 10) == pytest.approx(0.5625)


def test_oolong_label_user_month() -> None:
    task = get_task("oolong")
    lab = _oolong("Physical sciences", "label")
    assert task.score("physical sciences", lab).score == 1.0
    assert task.score("The most common label is **Physical Sciences**.", lab).score == 1.0
    assert task.score("People", lab).score == 0.0
    assert task.score("People or Physical sciences", lab).score == 0.0
    user = _oolong("22222", "user")
    assert task.score("User 22222 has the most.", user).score == 1.0
    assert task.score("11111", user).score == 0.0
    month = _oolong("March 2023", "month")
    assert task.score("Answer: March 2023", month).score == 1.0
    assert task.score("January 2024", month).score == 0.0


def test_match_choice_prefers_longer_choice() -> None:
    s, parsed = match_choice("It is Physical sciences.", "Physical sciences", ["sciences", "People"])
    assert s == 1.0 and parsed == "Physical sciences"


# ---------------------------------------------------------------- oolong_pairs
def test_pairs_parsing_formats() -> None:
    text = "(12, 45)\n13-46\n[17, 18]\nuser 20 and user 21\n45, 12"
    assert parse_pairs(text) == {(12, 45), (13, 46), (17, 18), (20, 21)}
    assert parse_pairs('[[30, 31], [32, 33]]') == {(30, 31), (32, 33)}


def test_pairs_parsing_ignores_non_ids() -> None:
    valid = {12345, 23456, 34567}
    text = "Found 2 pairs in 2023:\n(12345, 23456)\n5\n23456 - 34567\n(12345, 12345)"
    assert parse_pairs(text, valid) == {(12345, 23456), (23456, 34567)}


def test_pairs_f1_hand_set() -> None:
    gold = [(1, 2), (1, 3), (2, 3), (3, 4)]
    # 3 predicted, 2 correct: P = 2/3, R = 2/4, F1 = 2PR/(P+R) = 4/7
    s = pairs_f1("(1, 2), (3, 1), (5, 6)", gold)
    assert s.metrics["precision"] == pytest.approx(2 / 3)
    assert s.metrics["recall"] == pytest.approx(0.5)
    assert s.score == pytest.approx(4 / 7)
    assert pairs_f1("(2,1) (3,1) (3,2) (4,3)", gold).score == 1.0
    assert pairs_f1("none", gold).score == 0.0
    inst = _inst("oolong_pairs", [[1, 2], [3, 4]], users=[1, 2, 3, 4])
    assert get_task("oolong_pairs").score("1-2\n3-4", inst).score == 1.0


# ---------------------------------------------------------------- codeqa
@pytest.mark.parametrize(
    ("pred", "letter"),
    [
        ("B", "B"), ("(C)", "C"), ("D) SubprocessProtocol", "D"), ("Answer: A", "A"),
        ("The correct option is B.", "B"), ("I pick choice (c)", "C"), ("A or B", None),
        ("It is defined in genericpath.py", "C"),
    ],
)
def test_choice_letter_parsing(pred: str, letter: str | None) -> None:
    choices = ["os.py", "posixpath.py", "genericpath.py", "ntpath.py"]
    assert parse_choice_letter(pred, choices) == letter


def test_codeqa_accuracy() -> None:
    inst = _inst("codeqa", "C", choices=["a", "b", "c", "d"])
    assert get_task("codeqa").score("Answer: C", inst).score == 1.0
    assert get_task("codeqa").score("Answer: A", inst).score == 0.0


# ---------------------------------------------------------------- browsecomp
def test_browsecomp_normalised_match() -> None:
    inst = _inst("browsecomp", "Plain Nectar Guild",
                 candidates=["Plain Nectar Guild", "Plain Nectar Company", "Cadash Beacon Institute"])
    task = get_task("browsecomp")
    assert task.score("the plain nectar guild", inst).score == 1.0
    assert task.score("Answer: It is the Plain Nectar Guild.", inst).score == 1.0
    assert task.score("Plain Nectar Company", inst).score == 0.0
    year = _inst("browsecomp", "1869", candidates=["1869", "1725", "1764"])
    assert task.score("It was founded in 1869.", year).score == 1.0
    assert task.score("1725", year).score == 0.0


# ---------------------------------------------------------------- verbatim_copy
def test_verbatim_metrics() -> None:
    gold = "abcdefghij"
    s = copy_score(gold, gold)
    assert s.score == 1.0 and s.metrics["char_accuracy"] == 1.0
    s = copy_score("abcdefghiX", gold)
    assert s.score == 0.0
    assert s.metrics["char_accuracy"] == pytest.approx(0.9)
    assert s.metrics["levenshtein_similarity"] == pytest.approx(0.9)
    # a deletion shifts every later position: char accuracy drops, edit similarity does not
    s = copy_score("bcdefghij", gold)
    assert s.metrics["char_accuracy"] == pytest.approx(0.0)
    assert s.metrics["levenshtein_similarity"] == pytest.approx(0.9)
    assert copy_score("```text\nabcdefghij\n```", gold).score == 1.0
    assert char_accuracy("", "") == 1.0
    assert levenshtein_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)


# ---------------------------------------------------------------- math_python
@pytest.mark.parametrize(
    ("pred", "gold", "ok"),
    [
        ("1/2", "1/2", True), ("0.5", "1/2", True), ("\\frac{1}{2}", "1/2", True),
        ("\\dfrac{1}{2}", "1/2", True), ("2/4", "1/2", True), ("-\\frac{3}{4}", "-3/4", True),
        ("x = 7/2", "7/2", True), ("3.5", "7/2", True), ("3", "4", False), ("1/3", "1/2", False),
    ],
)
def test_math_equivalence(pred: str, gold: str, ok: bool) -> None:
    assert math_equivalent(pred, gold) is ok


def test_math_score_extraction() -> None:
    assert math_score("so the result is \\boxed{\\frac{1}{2}}.", "1/2").score == 1.0
    assert math_score("First 1/3, then finally 0.5", "1/2").score == 1.0
    assert math_score("Answer: 210", "210").score == 1.0
    assert math_score("\\boxed{211}", "210").score == 0.0
    assert math_score("", "210").score == 0.0


def test_math_fallback_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from recursa.bench.tasks import math_python

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("math_verify"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert math_python.equivalent("\\frac{1}{2}", "1/2")
    assert math_python.equivalent("0.5", "1/2")
    assert not math_python.equivalent("0.4", "1/2")
    assert math_python.verifier_name() == "sympy"
    assert math.isclose(float(math_python._to_fraction("-\\frac{3}{4}")), -0.75)


# ---------------------------------------------------------------- strict rules (issue 20)
from recursa.bench.tasks.strict import (  # noqa: E402
    MAX_ANSWER_WORDS,
    contains_words,
    strict_choice,
    strict_digits,
    strict_number,
    strict_set,
)


def test_strict_whole_words_only() -> None:
    assert contains_words("Rats had nested in the generator", "generator")
    assert not contains_words("the generator failed", "rat")          # not inside a word
    assert strict_choice("generator", "rat", ["rat", "frost"]).score == 0.0
    assert strict_choice("It was the rat.", "rat", ["rat", "frost"]).score == 1.0
    assert strict_number("41273", 12).score == 0.0                    # '12' is not in 41273
    assert strict_digits("code 14827193", "4827193").score == 0.0     # 8 digits, not 7


def test_strict_hedge_scores_zero() -> None:
    labels = ["kettle", "toaster", "blender"]
    assert strict_choice("kettle", "kettle", labels).score == 1.0
    assert strict_choice("kettle or toaster", "kettle", labels).score == 0.0
    assert strict_choice("kettle, toaster, blender", "kettle", labels).score == 0.0
    assert strict_digits("4827193", "4827193").score == 1.0
    assert strict_digits("4827193 or 5551234", "4827193").score == 0.0
    assert strict_number("12 or 13", 12).score == 0.0
    assert strict_number("between 10 and 14", 12, abs_tol=2).score == 0.0


def test_strict_passage_dump_scores_zero() -> None:
    passage = " ".join(["filler"] * MAX_ANSWER_WORDS) + " The code is 4827193."
    assert strict_digits(passage, "4827193").score == 0.0
    assert strict_choice(passage + " kettle", "kettle", ["kettle"]).score == 0.0
    assert strict_number(passage.replace("4827193", "12"), 12).score == 0.0
    # a short sentence around the answer is an answer, not a dump
    assert strict_digits("The combination for the safe is 4,827,193.", "4827193").score == 1.0


def test_strict_numbers_exact_or_within_stated_tolerance() -> None:
    assert strict_number("Answer: 40", 40).score == 1.0
    assert strict_number("41", 40).score == 0.0                       # exact by default
    assert strict_number("42", 40, abs_tol=2).score == 1.0
    assert strict_number("43", 40, abs_tol=2).score == 0.0
    assert strict_number("104", 100, rel_tol=0.05).score == 1.0
    assert strict_number("106", 100, rel_tol=0.05).score == 0.0
    assert strict_number("1,200", 1200).score == 1.0
    assert strict_number("no idea", 3).score == 0.0


def test_strict_multi_value_f1() -> None:
    gold = ["1111111", "2222222", "3333333"]
    assert strict_set("1111111, 2222222, 3333333", gold, n_digits=7).score == 1.0
    two = strict_set("1111111 and 2222222", gold, n_digits=7).score
    assert 0.7 < two < 0.9                                            # 2/3 recall, precise
    hedge = " ".join(gold + [str(4444444 + i) for i in range(20)])
    assert strict_set(hedge, gold, n_digits=7).score < 0.3            # every number listed
