"""`make demo`'s case (recursa.demos.reviews): no baseline without a model answers it, its
judge is strict, and its seeds are split. No model runs here."""

from __future__ import annotations

from collections import Counter

from recursa.bench.tasks._reviews import LABEL_WORDS
from recursa.bench.tasks.strict import mentioned
from recursa.demos.reviews import MARGIN, N_SHOPS, QUERY, TEST_SEEDS_FROM, make_case


def _shops(context: str) -> Counter[str]:
    return Counter(line.split("| Shop: ", 1)[1].split(" |", 1)[0]
                   for line in context.splitlines() if "| Shop: " in line)


def test_no_baseline_without_a_model_answers_it() -> None:
    seeds = range(TEST_SEEDS_FROM, TEST_SEEDS_FROM + 50)
    cases = [make_case(s) for s in seeds]
    assert sum(c.check(c.grep_answer()) for c in cases) == 0
    assert sum(c.check(c.regex_answer()) for c in cases) == 0
    # the commonest answer over other seeds (the `constant` baseline) is right by chance only
    dev = Counter(make_case(s).shop for s in range(50))
    assert sum(c.check(dev.most_common(1)[0][0]) for c in cases) <= 0.2 * len(cases)


def test_every_shop_is_named_equally_often_and_the_answer_leads_clearly() -> None:
    for seed in (TEST_SEEDS_FROM, TEST_SEEDS_FROM + 1, 5):
        case = make_case(seed)
        names = _shops(case.context)
        assert len(names) == N_SHOPS and len(set(names.values())) == 1
        ranked = sorted(case.complaints.values(), reverse=True)
        assert case.complaints[case.shop] == ranked[0] and ranked[0] - ranked[1] >= MARGIN
        assert case.regex_answer() == ""             # a tie: the names carry no signal
        assert 4_000 < len(case.context) / 4 < 5_000


def test_no_review_states_its_verdict_in_the_questions_words() -> None:
    case = make_case(TEST_SEEDS_FROM)
    texts = [line.split("| Text: ", 1)[1] for line in case.context.splitlines()
             if "| Text: " in line]
    assert len(texts) == case.records
    assert not [t for t in texts if mentioned(t, list(LABEL_WORDS))]


def test_the_judge_is_strict() -> None:
    case = make_case(TEST_SEEDS_FROM + 2)
    other = next(s for s in case.shops if s != case.shop)
    assert case.check(case.shop) and case.check(f"The shop is {case.shop}.")
    assert not case.check(other)
    assert not case.check(f"{case.shop} or {other}")                      # a hedge
    assert not case.check(" ".join(["filler"] * 50) + f" {case.shop}")   # a pasted passage


def test_dev_and_test_seeds_share_no_shop_and_ask_in_other_words() -> None:
    dev = {s for seed in range(20) for s in make_case(seed).shops}
    test = {s for seed in range(TEST_SEEDS_FROM, TEST_SEEDS_FROM + 20)
            for s in make_case(seed).shops}
    assert not dev & test
    assert make_case(0).query == QUERY["dev"] and make_case(TEST_SEEDS_FROM).query == QUERY["test"]
