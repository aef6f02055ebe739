"""The harder demo's case (recursa.demos.paraphrase): a grep cannot answer it, and its judge is
strict. No model runs here."""

from __future__ import annotations

import re

from recursa.bench.baselines import grep_answer, query_words
from recursa.demos.paraphrase import CAUSES, FIXERS, QUERY, TEST_SEEDS_FROM, make_case


def _power_report(text: str) -> str:
    start = text.index("MAINTENANCE REPORT - loss of power")
    end = text.find("maintenance budget", start)
    return text[start:end]


def test_the_question_shares_no_content_word_with_its_report() -> None:
    for seed in range(5):
        report = _power_report(make_case(seed, chars=30_000).context).lower()
        shared = [w for w in query_words(QUERY) if re.search(rf"\b{re.escape(w)}", report)]
        assert not shared, (seed, shared)


def test_the_grep_baseline_never_answers_it() -> None:
    right = sum(make_case(s, chars=30_000).check(grep_answer(QUERY, make_case(s, chars=30_000)
                                                             .context))
                for s in range(TEST_SEEDS_FROM, TEST_SEEDS_FROM + 20))
    assert right == 0


def test_five_reports_of_the_same_shape_with_their_own_people() -> None:
    case = make_case(3, chars=30_000)
    assert case.context.count("MAINTENANCE REPORT - ") == 5
    assert case.context.count("On the third day the contractor ") == 5
    assert len(case.context) == 30_000 or abs(len(case.context) - 30_000) < 3_000


def test_the_judge_is_strict() -> None:
    case = make_case(7, chars=30_000)
    surname = case.fixer.split()[-1]
    assert case.check(f"{case.fixer} got it running again; {case.cause_word}s had knocked it out.")
    assert case.check(f"It was {case.cause_word}, and {surname} fixed it.")
    assert not case.check(f"{case.fixer}")                                   # no cause
    other = next(f for f in FIXERS if f != case.fixer)
    assert not case.check(f"{case.fixer} or {other}; {case.cause_word}")      # a hedge
    wrong = next(w for w, _ in CAUSES if w != case.cause_word)
    assert not case.check(f"{case.fixer}; {case.cause_word} or {wrong}")
    assert not case.check(" ".join(["filler"] * 70) + f" {case.fixer} {case.cause_word}")  # dump
    for word in case.others:                  # another report's cause is a wrong answer too
        assert not case.check(f"{case.fixer}; {word}")
