"""The real-label families (tasks/real.py), their record-labelling baselines, the report's
best-baseline rule with its paired test, and the sealed test split."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from recursa.bench import estimate_tokens, get_task
from recursa.bench.baselines import NO_LABEL_BASELINES, baseline_answer
from recursa.bench.realdata import SITES, load_records, split_of
from recursa.bench.record_baselines import applies, label_texts
from recursa.bench.report import Cell, best_baselines, markdown, sign_test, summarise, versus
from recursa.bench.sealed import SealedError, check_run, draw_seeds, load_log, record_run
from recursa.bench.tasks import REAL, SPLIT_FAMILIES
from recursa.bench.tasks import real as rt

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # nothing here may reach a model hub


def _label_of() -> dict[str, str]:
    return {r.id: r.label for name in ("sentiment", "wordnet") for r in load_records(name)}


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("length", [4096, 8192, 16384])
def test_sizes_determinism_and_truth_from_the_labels(name: str, length: int) -> None:
    task = get_task(name)
    labels = _label_of()
    for seed in (3, 1003):
        inst = task.generate(seed, length)
        assert inst.meta["split"] == ("test" if seed >= 1000 else "dev")
        assert abs(estimate_tokens(inst.context) - length) <= 0.05 * length
        assert task.generate(seed, length).model_dump() == inst.model_dump()
        assert [labels[i] for i in inst.meta["record_ids"]] == inst.meta["labels"]
        lines = inst.context.splitlines()
        assert len(lines) == len(inst.meta["record_ids"]) == len(rt.records_in(inst.context))
        # the label is never written in a record
        assert not any(lab.split(".")[-1] in {"negative", "positive"} and
                       ("| " + lab) in ln for ln, lab in zip(lines, inst.meta["labels"],
                                                           strict=True))
        assert task.score(str(inst.gold), inst).score == 1.0
        if inst.meta["question_type"] == "count":
            target = inst.meta["target"]
            assert int(inst.gold) == sum(lab == target for lab in inst.meta["labels"])
        else:
            counts = inst.meta["counts"]
            ranked = sorted(counts.values(), reverse=True)
            assert max(counts, key=lambda k: counts[k]) == inst.gold
            assert ranked[0] - ranked[1] >= rt.MARGIN


@pytest.mark.parametrize("name", REAL)
def test_dev_and_test_draw_from_disjoint_halves(name: str) -> None:
    task = get_task(name)
    by_id = {r.id: r for n in ("sentiment", "wordnet") for r in load_records(n)}
    dev_ids: set[str] = set()
    test_ids: set[str] = set()
    for seed in range(3):
        dev_ids |= set(task.generate(seed, 4096, split="dev").meta["record_ids"])
        test_ids |= set(task.generate(1000 + seed, 4096, split="test").meta["record_ids"])
    assert not dev_ids & test_ids
    assert {split_of(by_id[i].text) for i in dev_ids} == {"dev"}
    assert {split_of(by_id[i].text) for i in test_ids} == {"test"}
    assert name in SPLIT_FAMILIES
    with pytest.raises(ValueError, match="test seeds .* start at 1000"):
        task.generate(5, 4096, split="test")
    with pytest.raises(ValueError, match="dev seeds"):
        task.generate(1005, 4096, split="dev")


def test_truths_vary_between_seeds() -> None:
    """No constant answer is right often: counts spread, every site / kind wins somewhere."""
    counts = [int(get_task("real_sentiment_count").generate(s, 4096).gold) for s in range(20)]
    assert len(set(counts)) >= 12
    sites = Counter(get_task("real_sentiment_most").generate(s, 4096).gold for s in range(30))
    kinds = Counter(get_task("real_wordnet_most").generate(s, 4096).gold for s in range(30))
    assert set(sites) == set(SITES.values()) and max(sites.values()) <= 18
    per_site = get_task("real_sentiment_most").generate(1, 8192).meta["per_site"]
    assert len(set(per_site.values())) == 1       # naming a site often says nothing
    assert len(kinds) == 4 and max(kinds.values()) <= 18


def test_phrasings_split_and_keep_to_their_family() -> None:
    for table in (rt.SENTIMENT_COUNT, rt.SENTIMENT_MOST):
        dev = {q for qs in table["dev"].values() for q in qs}
        test = {q for qs in table["test"].values() for q in qs}
        assert dev and test and not dev & test
        assert not any(w in q.lower() for q in dev | test
                       for w in ("animal", "plant", "food", "person", "people", "definition"))
    for wtable in (rt.WORDNET_COUNT, rt.WORDNET_MOST):
        assert not set(wtable["dev"]) & set(wtable["test"])
        assert not any(w in q.lower() for q in wtable["dev"] + wtable["test"]
                       for w in ("negative", "positive", "review", "amazon", "yelp", "imdb"))


def test_count_scoring_is_15_percent_and_strict() -> None:
    task = get_task("real_sentiment_count")
    inst = task.generate(1, 4096)
    g = int(inst.gold)
    assert task.score(str(int(g * 1.15)), inst).score == 1.0
    assert task.score(str(int(g * 1.15) + 2), inst).score == 0.0
    assert task.score(f"{g} or maybe {g + 3}", inst).score == 0.0          # a hedge
    sc = task.score(str(g + 5), inst)
    assert sc.metrics["abs_error"] == 5 and sc.metrics["rel_error"] == pytest.approx(5 / g)


def test_choice_scoring_is_strict() -> None:
    inst = get_task("real_sentiment_most").generate(1, 4096)
    task = get_task("real_sentiment_most")
    other = next(s for s in SITES.values() if s != inst.gold)
    assert task.score(f"Answer: {inst.gold}", inst).score == 1.0
    assert task.score(f"{inst.gold} or {other}", inst).score == 0.0
    w = get_task("real_wordnet_most")
    winst = w.generate(1, 4096)
    singular = winst.gold.rstrip("s") if winst.gold != "people" else "person"
    assert w.score(singular, winst).score == 1.0
    assert w.score("animals and plants and foods and people", winst).score == 0.0
    wrong = next(k for k in rt.KIND_CHOICES if k != winst.gold)
    assert w.score(wrong, winst).score == 0.0


# ---------------------------------------------------------------- baselines
def test_record_baselines_apply_where_they_can_read_the_records() -> None:
    assert applies("lexicon", "real_wordnet_count") and applies("grep", "judge_agg")
    assert applies("embed", "judge_agg") and not applies("embed", "judge_pairs")
    assert not applies("classifier", "sniah") and not applies("lexicon", "para_niah")
    assert "classifier" not in NO_LABEL_BASELINES and "embed" in NO_LABEL_BASELINES
    # one code among look-alikes: embed retrieves by meaning; a set of codes: not yet
    assert applies("embed", "para_niah") and applies("embed", "sniah")
    assert not applies("embed", "para_niah_mv")


def test_which_record_baselines_run_follows_the_family_s_declared_record_kind() -> None:
    # the decision reads the family's `record_kind`, not its name: a copy of judge_agg under
    # another name gets judge_agg's baselines and answers, and with no declaration none
    from recursa.bench.record_baselines import record_answer
    from recursa.bench.tasks.judge_agg import JudgeAgg
    from recursa.frontend.tasks import register_task, unregister_task

    class Renamed(JudgeAgg):
        name = "renamed_reviews"

    class Undeclared(JudgeAgg):
        name = "undeclared_reviews"
        record_kind = None

    register_task(Renamed)
    register_task(Undeclared)
    try:
        assert applies("lexicon", "renamed_reviews") and applies("embed", "renamed_reviews")
        assert not applies("classifier", "renamed_reviews")
        assert not any(applies(b, "undeclared_reviews") for b in ("lexicon", "embed"))
        inst = get_task("judge_agg").generate(1, 2048, split="dev")
        same = inst.model_copy(update={"task": "renamed_reviews"})
        assert record_answer("lexicon", same, same.context) == \
            record_answer("lexicon", inst, inst.context)
    finally:
        unregister_task("renamed_reviews")
        unregister_task("undeclared_reviews")


def test_embed_names_the_code_of_the_sentence_nearest_the_question() -> None:
    from recursa.bench.lookup_baselines import nearest_code
    text = ("The harbour office opens its gate with 4471902. Lunch is served at noon. "
            "The code 1234567 works on the garden shed. The doctor's strongbox keypad takes "
            "8813406. Reference 55512 is filed.")
    assert nearest_code("Which number opens the safe at the physician's office?", text, 7) \
        == "8813406"
    assert nearest_code("anything", "no codes here at all.", 7) == ""


def test_lexicon_and_embed_also_judge_judge_agg_reviews() -> None:
    task = get_task("judge_agg")
    assert applies("lexicon", "judge_agg") and not applies("classifier", "judge_agg")
    right = 0
    for seed in range(6):
        inst = task.generate(seed, 2048, split="dev")
        for b in ("lexicon", "embed"):
            a = baseline_answer(b, inst, inst.context, seed)
            assert a == baseline_answer(b, inst, inst.context, seed)
            if inst.meta["answer_shape"]["kind"] == "number":
                assert a.lstrip("-").isdigit()
            else:
                assert a in inst.meta["answer_shape"]["choices"]
            right += b == "lexicon" and task.score(a, inst).score == 1.0
    assert right >= 2       # VADER reads these clear-cut reviews well (0.91 a review on dev)


def test_lexicons_read_the_text() -> None:
    assert label_texts("lexicon", "sentiment", ["I loved it, great value.",
                                                 "Terrible, it broke in a day."]) == \
        ["positive", "negative"]
    assert label_texts("lexicon", "wordnet", [
        "a small songbird with brown feathers", "a tall tree with evergreen leaves",
        "a person who writes novels", "a measure of distance"]) == \
        ["noun.animal", "noun.plant", "noun.person", "other"]


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("baseline", ["lexicon", "classifier", "embed"])
def test_record_baselines_answer_deterministically(name: str, baseline: str) -> None:
    task = get_task(name)
    inst = task.generate(2, 1024)
    a = baseline_answer(baseline, inst, inst.context, 2)
    assert a == baseline_answer(baseline, inst, inst.context, 2)
    if inst.meta["question_type"] == "count":
        assert a.isdigit() and int(a) <= len(inst.meta["labels"])
    else:
        assert a in inst.meta["answer_shape"]["choices"]


def test_embed_refuses_a_file_that_is_not_the_pinned_one(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from recursa.bench import embed
    monkeypatch.setattr(embed, "TOKENIZER", (embed.TOKENIZER[0], embed.TOKENIZER[1], "0" * 64))
    with pytest.raises(embed.EmbedUnavailable, match="refusing"):
        embed.pinned_file(*embed.TOKENIZER)
    with pytest.raises(embed.EmbedUnavailable, match="not installed"):
        embed.pinned_file("no-such-dist-xyz", "a", "0")


def test_embed_vectors_are_unit_and_mean_something() -> None:
    from recursa.bench.embed import encoder
    v = encoder().encode(["a small brown dog", "a puppy", "a tax form"])
    norms = (v * v).sum(axis=1)
    assert v.shape == (3, 384) and all(abs(n - 1) < 1e-4 for n in norms)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_classifier_never_scores_dev_records_with_a_model_that_saw_them() -> None:
    """A dev record of fold k is labelled by the model trained on the other fold only."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from recursa.bench import record_baselines as rb
    dev = [r for r in load_records("sentiment") if r.split == "dev"]
    for held in (0, 1):
        vocab = set(rb._model("sentiment", held).named_steps["tfidfvectorizer"].vocabulary_)
        train = [r.text for r in dev if rb._fold(r.text) != held]
        test = [r.text for r in dev if rb._fold(r.text) == held]
        assert vocab == set(TfidfVectorizer(ngram_range=(1, 2)).fit(train).vocabulary_)
        assert set(TfidfVectorizer(ngram_range=(1, 2)).fit(test).vocabulary_) - vocab
    texts = [dev[0].text, dev[1].text]
    assert rb._classify("sentiment", texts) == [
        str(rb._model("sentiment", rb._fold(t)).predict([t])[0]) for t in texts]


# ---------------------------------------------------------------- report
def _rows(method: str, scores: list[float], task: str = "real_wordnet_count") -> list[dict]:
    return [{"task": task, "method": method, "length": 4096, "seed": 1000 + i, "score": s,
             "model": "m" if method == "rlm" else "none", "key": f"{method}{i}"}
            for i, s in enumerate(scores)]


def test_best_baseline_excludes_the_classifier_and_beats_carries_a_sign_test() -> None:
    rows = (_rows("rlm", [1.0] * 18 + [0.0] * 2) + _rows("lexicon", [0.0] * 17 + [1.0] * 3)
            + _rows("embed", [0.0] * 20) + _rows("classifier", [1.0] * 20))
    cells = summarise(rows, resamples=200)
    best = best_baselines(cells)
    assert best[("real_wordnet_count", 4096)].method == "lexicon"
    rlm = next(c for c in cells if c.method == "rlm" and c.length == 4096)
    text = versus(rlm, best)
    assert text.startswith("beats lexicon 0.15") and "sign test 17+/2-" in text
    w, lo, p = sign_test(rlm.by_seed, best[("real_wordnet_count", 4096)].by_seed)
    assert (w, lo) == (17, 2) and p < 0.001
    md = markdown(cells, rows)
    assert "labelled ref." in md and "| rlm | 4k | 20 |" in md
    assert md.count("| 1.00 |") >= 1      # the classifier's mean beside the RLM's row


def test_sign_test_values() -> None:
    a = {i: 1.0 for i in range(10)}
    b = {i: 0.0 for i in range(10)}
    assert sign_test(a, b)[2] == pytest.approx(2 / 1024)
    assert sign_test(a, a) == (0, 0, 1.0)
    assert isinstance(Cell, type)


# ---------------------------------------------------------------- the sealed test split
def _specs(seed: int, n: int, method: str = "rlm") -> list[dict]:
    from recursa.bench.methods import MethodConfig
    from recursa.bench.runner import make_specs
    return make_specs(["real_sentiment_count"], [4096], range(seed, seed + n),
                      [MethodConfig(method=method, model="local:x")], None, split="test",
                      baselines=["lexicon"])


def test_sealed_seeds_refuse_a_second_run_until_fresh_seeds_are_drawn(tmp_path: Path) -> None:
    log = tmp_path / "sealed.json"
    with pytest.raises(SealedError, match="not drawn"):
        check_run(log, _specs(1000, 5), "out1", "v1")
    d = draw_seeds(log, ["real_sentiment_count"], [4096], 5, "v1", "first")
    assert d["seed"] == 1000
    check_run(log, _specs(1000, 5), "out1", "v1")
    record_run(log, _specs(1000, 5), "out1", "v1")
    check_run(log, _specs(1000, 5), "out1", "v1")            # a resume: same dir, same commit
    with pytest.raises(SealedError, match="already ran on test seeds 1000-1004"):
        check_run(log, _specs(1000, 5), "out1", "v2")         # changed code, same seeds
    with pytest.raises(SealedError, match="already ran"):
        check_run(log, _specs(1002, 2), "out2", "v1")
    check_run(log, _specs(1000, 5, method="direct"), "out2", "v1")   # another cell: fine
    d2 = draw_seeds(log, ["real_sentiment_count"], [4096], 5, "v2", "after a change")
    assert d2["seed"] == 1100
    check_run(log, _specs(1100, 5), "out3", "v2")
    saved = json.loads(log.read_text())
    assert [r["seed"] for r in saved["runs"]] == [1000] and saved["draws"][1]["commit"] == "v2"
    assert load_log(tmp_path / "none.json") == {"draws": [], "runs": []}


def test_the_committed_log_is_valid() -> None:
    log = load_log(Path(__file__).resolve().parent.parent / "docs/bench/sealed-seeds.json")
    assert isinstance(log["draws"], list) and isinstance(log["runs"], list)


def test_bench_run_sealed_refuses_undrawn_seeds(tmp_path: Path) -> None:
    from recursa.cli import main
    log = tmp_path / "sealed.json"
    rc = main(["bench", "run", "--task", "real_sentiment_count", "--lengths", "4096",
               "--method", "lexicon", "--model", "local:qwen2.5-coder-1.5b", "-n", "2",
               "--seed", "1000", "--out", str(tmp_path / "o"), "--sealed", str(log),
               "--no-progress"])
    assert rc == 0          # only baselines: not sealed, nothing refused
    rc = main(["bench", "seeds", "draw", "--task", "real_sentiment_count", "--lengths", "4k",
               "-n", "3", "--log", str(log)])
    assert rc == 0 and load_log(log)["draws"][0]["seed"] == 1000
