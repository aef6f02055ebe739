"""The held-out families (issue 20): no grep, regex or constant passes them; the dev and test
splits share no seeds' instances, templates or haystack text; each family's gold is recomputed
from its meta; the demo's judge is strict."""

from __future__ import annotations

import re
from statistics import fmean

import pytest

from recursa.bench import estimate_tokens, get_task
from recursa.bench.baselines import BASELINES, baseline_answer, grep_answer, query_words
from recursa.bench.methods import context_text
from recursa.bench.record_baselines import applies
from recursa.bench.tasks import HELD_OUT
from recursa.bench.tasks import judge_agg as ja
from recursa.bench.tasks import judge_pairs as jp
from recursa.bench.tasks import para_niah as pn
from recursa.bench.tasks import two_hop as th
from recursa.bench.tasks._reviews import LABEL_WORDS, NEGATIVE, NEUTRAL, POSITIVE
from recursa.bench.tasks.split import halves, paragraph_split, split_corpus

GREP_PROOF = ["para_niah", "para_niah_mv", "two_hop", "judge_agg", "judge_pairs"]


def baseline_means(name: str, length: int, seeds: int = 50) -> dict[str, float]:
    task = get_task(name)
    # the three baselines these families were built against; a sentiment lexicon does pass
    # judge_agg's clear-cut synthetic reviews more often (docs/bench/README.md, issue 34)
    scores: dict[str, list[float]] = {b: [] for b in BASELINES[:3] if applies(b, name)}
    for seed in range(seeds):
        inst = task.generate(seed, length)
        text = context_text(inst.context)
        for b in scores:
            scores[b].append(task.score(baseline_answer(b, inst, text, seed), inst).score)
    return {b: fmean(v) for b, v in scores.items()}


@pytest.mark.parametrize("name", GREP_PROOF)
def test_no_baseline_passes_at_8k(name: str) -> None:
    """Over 50 test seeds, grep, regex and constant each score at most 0.2."""
    means = baseline_means(name, 8192)
    assert all(v <= 0.2 for v in means.values()), means


@pytest.mark.slow
@pytest.mark.parametrize("name", GREP_PROOF)
def test_no_baseline_passes_at_32k(name: str) -> None:
    means = baseline_means(name, 32768)
    assert all(v <= 0.2 for v in means.values()), means


def test_the_baselines_do_pass_sniah() -> None:
    """The same baselines on the old S-NIAH: regex finds its only 7-digit number, grep its
    needle (why the new families exist)."""
    means = baseline_means("sniah", 8192, seeds=10)
    assert means["regex"] == 1.0 and means["grep"] >= 0.9


@pytest.mark.parametrize("name", HELD_OUT)
@pytest.mark.parametrize("length", [8192, 16384, 32768])
def test_lengths_and_gold_scores_one(name: str, length: int) -> None:
    task = get_task(name)
    inst = task.generate(seed=7, length_tokens=length)
    assert abs(estimate_tokens(inst.context) - length) <= 0.05 * length
    assert inst.meta["split"] == "test"
    gold = inst.gold
    if name == "judge_pairs":
        gold = "\n".join(f"({a}, {b})" for a, b in gold)
    elif isinstance(gold, list):
        gold = " ".join(gold)
    assert task.score(str(gold), inst).score == 1.0
    assert task.score("", inst).score == 0.0
    assert task.generate(seed=7, length_tokens=length).model_dump() == inst.model_dump()


# ---------------------------------------------------------------- the dev / test protocol
@pytest.mark.parametrize("name", HELD_OUT)
def test_dev_and_test_instances_differ_for_the_same_seed(name: str) -> None:
    task = get_task(name)
    dev = task.generate(3, 8192, split="dev")
    test = task.generate(3, 8192, split="test")
    assert dev.meta["split"] == "dev" and test.meta["split"] == "test"
    assert dev.context != test.context and dev.id != test.id
    with pytest.raises(ValueError, match="split"):
        task.generate(3, 8192, split="train")


def test_splits_share_no_haystack_paragraph() -> None:
    dev, test = split_corpus(None, "dev"), split_corpus(None, "test")
    assert dev.paragraphs and test.paragraphs
    assert not set(dev.paragraphs) & set(test.paragraphs)
    assert 0.2 < len(dev.paragraphs) / (len(dev.paragraphs) + len(test.paragraphs)) < 0.45
    # an instance's filler comes from its own split only
    inst = get_task("para_niah").generate(0, 8192, split="dev")
    paras = [p for p in inst.context.split("\n\n") if len(p) > 300]
    test_set = set(test.paragraphs)
    assert paras and not any(p[:300] in "".join(test_set) for p in paras[:3])
    assert all(paragraph_split("", p) in ("dev", "test") for p in paras)


@pytest.mark.parametrize("templates", [
    pn.QUESTIONS, pn.QUESTIONS_MV, pn.NEEDLES, pn.NOISE, th.HOPS, th.QUESTIONS, ja.QUESTIONS,
    ja.DEFINE, jp.TEXT, jp.DEFINE])
def test_templates_are_disjoint_between_splits(templates: dict) -> None:
    dev, test = templates["dev"], templates["test"]
    def as_set(x: object) -> set[str]:
        if isinstance(x, str):
            return {x}
        return set(map(str, x.values() if isinstance(x, dict) else x))  # type: ignore[attr-defined]
    dev_set, test_set = as_set(dev), as_set(test)
    assert dev_set and test_set and not dev_set & test_set


@pytest.mark.parametrize("words", [pn.PLACES, pn.OBJECTS, th.ITEMS, POSITIVE, NEGATIVE])
def test_word_lists_are_split_disjointly(words: list) -> None:
    h = halves(words)
    assert h["dev"] and h["test"] and not set(map(str, h["dev"])) & set(map(str, h["test"]))
    assert len(h["dev"]) + len(h["test"]) == len(words)


def test_test_instances_use_only_test_phrasings() -> None:
    dev_frames = [f.split("{")[0] for f in pn.NEEDLES["dev"]]
    for seed in range(10):
        inst = get_task("para_niah").generate(seed, 8192)
        for needle in inst.meta["needles"] + inst.meta["distractors"]:
            assert any(_frame_matches(f, needle) for f in pn.NEEDLES["test"]), needle
            assert not any(needle.startswith(d) and d for d in dev_frames if len(d) > 5)


def _frame_matches(frame: str, text: str) -> bool:
    pat = re.escape(frame)
    for slot in ("p", "o", "v"):
        pat = pat.replace(re.escape("{" + slot + "}"), ".+?")
    return re.fullmatch(pat, text) is not None


# ---------------------------------------------------------------- family properties
STOP = {"the", "at", "in", "of", "a", "to", "by", "on", "that", "is", "what", "which", "once",
        "me", "into", "there", "than", "one", "every", "all", "them", "are", "they", "it",
        "with", "only", "s"}


def _content(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP}


@pytest.mark.parametrize("name", ["para_niah", "para_niah_mv"])
@pytest.mark.parametrize("split", ["dev", "test"])
def test_needle_shares_no_content_word_with_the_question(name: str, split: str) -> None:
    task = get_task(name)
    for seed in range(30):
        inst = task.generate(seed, 8192, split=split)
        q = _content(inst.query)
        for needle in inst.meta["needles"]:
            assert not q & _content(needle), (inst.query, needle)
            assert needle in inst.context
        codes = re.findall(r"(?<!\d)\d{7}(?!\d)", inst.context)
        assert len(set(codes)) >= 40            # many values of the answer's shape
        # grep of the query's rarest words never lands on a needle
        assert not any(n in grep_answer(inst.query, inst.context) for n in inst.meta["needles"])


def test_para_niah_distractors_are_near_and_same_shaped() -> None:
    inst = get_task("para_niah").generate(4, 16384)
    needle_at = inst.context.index(inst.meta["needles"][0])
    near = [abs(inst.context.index(d) - needle_at) for d in inst.meta["distractors"]]
    assert len(near) >= 6 and sorted(near)[2] < 0.12 * len(inst.context)
    pq, oq = inst.meta["key_needle"]
    for d in inst.meta["distractors"]:    # the place or the object, never both
        assert (pq in d) != (oq in d)


def test_two_hop_hops_are_far_apart_and_grep_finds_only_the_first() -> None:
    task = get_task("two_hop")
    for seed in range(20):
        inst = task.generate(seed, 16384)
        chain = inst.meta["chains"][0]
        text = inst.context
        first = text.index(chain["who"])
        second = text.index(f"{chain['item']}")
        assert abs(second - first) > 0.1 * len(text)
        found = grep_answer(inst.query, text)
        assert str(chain["number"]) in found or chain["who"] not in found
        assert task.score(found, inst).score == 0.0


def test_review_texts_never_name_the_label() -> None:
    for sentence in POSITIVE + NEGATIVE + NEUTRAL:
        words = set(re.findall(r"[a-z]+", sentence.lower()))
        assert not words & set(LABEL_WORDS), sentence
    inst = get_task("judge_agg").generate(1, 16384)
    body = inst.context.lower().split("\n", 1)[1]
    assert not any(re.search(rf"\b{w}\b", body) for w in LABEL_WORDS)


def test_judge_agg_gold_recomputed_and_groups_balanced() -> None:
    task = get_task("judge_agg")
    seen = set()
    for seed in range(40):
        inst = task.generate(seed, 8192)
        m = inst.meta
        seen.add(m["question_type"])
        col = m["shops"] if m["group"] == "shop" else m["products"]
        names = m["shop_names"] if m["group"] == "shop" else m["product_names"]
        c = {n: 0 for n in names}
        for g, lab in zip(col, m["labels"], strict=True):
            c[g] += lab == "complaint"
        qt = m["question_type"]
        if qt == "count":
            expect: object = sum(c.values())
        elif qt == "count_group":
            expect = c[m["g"]]
        elif qt == "diff":
            expect = c[m["a"]] - c[m["b"]]
        elif qt == "most_group":
            expect = max(c, key=c.__getitem__)
        else:
            expect = min(c, key=c.__getitem__)
        assert str(expect) == inst.gold
        # every group occurs equally often (+-1 over the records kept)
        counts = [col.count(n) for n in names]
        assert max(counts) - min(counts) <= 1
    assert seen == set(ja.QUESTION_TYPES)


def test_judge_agg_count_tolerance_is_stated_and_applied() -> None:
    task = get_task("judge_agg")
    inst = task.generate(0, 16384, question="count")
    gold, tol = int(inst.gold), inst.meta["tolerance"]
    assert tol == int(0.05 * gold)
    assert task.score(str(gold + tol), inst).score == 1.0
    assert task.score(str(gold + tol + 1), inst).score == 0.0
    assert task.score(f"{gold} or {gold + 1}", inst).score == 0.0      # a hedge


def test_judge_pairs_gold_recomputed_and_sparse() -> None:
    task = get_task("judge_pairs")
    for seed in range(20):
        inst = task.generate(seed, 16384)
        m = inst.meta
        stats: dict[int, dict[str, int]] = {}
        for cust, lab in zip(m["customers"], m["labels"], strict=True):
            stats.setdefault(cust, {"complaint": 0, "praise": 0})[lab] += 1
        pairs = jp.pairs_for(stats, m["condition"], m["k"])
        assert [list(p) for p in pairs] == inst.gold
        n = len(stats)
        assert 2 <= len(pairs) <= max(3, 0.08 * n * (n - 1) / 2)


def test_meta_counts_lines_as_splitlines_does() -> None:
    task = get_task("meta")
    inst = task.generate(0, 8192, question="line_count")
    text = inst.context
    assert text.endswith("\n") and int(inst.gold) == len(text.splitlines())
    assert task.score(str(len(text.split("\n"))), inst).score == 0.0   # the off-by-one
    rec = task.generate(0, 8192, question="record_count")
    assert int(rec.gold) == sum(1 for ln in rec.context.splitlines() if ln.startswith("ID-"))
    lng = task.generate(0, 8192, question="longest")
    lines = {ln.split(":", 1)[0]: len(ln.split(":", 1)[1]) for ln in lng.context.splitlines()
             if ln.startswith("ID-")}
    assert lng.gold == max(lines, key=lambda k: lines[k])


def test_query_words_drop_boilerplate() -> None:
    assert query_words("What is the special magic number for amber-anchor? Answer with the "
                       "number only.") == ["special", "magic", "amber-anchor"]


# ---------------------------------------------------------------- the demo's judge
def test_demo_check_is_strict() -> None:
    from recursa.demos.outage import CAUSES, FIXERS, make_case
    case = make_case(3, chars=20_000)
    surname = case.fixer.split()[-1]
    assert case.check(f"{case.cause_word}s; {case.fixer} fixed it.")
    assert case.check(f"The cause was {case.cause_word}. It was fixed by {surname}.")
    hedge = " or ".join(w for w, _ in CAUSES) + "; fixed by " + " or ".join(FIXERS)
    assert not case.check(hedge)                                   # every suspect named
    other = next(w for w, _ in CAUSES if w != case.cause_word)
    assert not case.check(f"{case.cause_word} or {other}; {case.fixer}")
    assert not case.check(f"generator{case.cause_word}x trouble; {case.fixer}")   # not a word
    assert not case.check(case.context[:2000])                     # a dump
