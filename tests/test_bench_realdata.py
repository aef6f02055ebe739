"""The real-label snapshots (recursa.bench.realdata): pinned bytes, records, labels, halves, and
the demo's site case."""

from __future__ import annotations

import gzip
import hashlib
from collections import Counter

import pytest

from recursa.bench import realdata
from recursa.bench.realdata import (
    DATA_DIR,
    RECORDS_FILE,
    SNAPSHOTS,
    SnapshotError,
    load_records,
    records,
    sentiment_site_case,
    split_of,
)


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_snapshot_matches_its_pin_and_has_its_licence(name: str) -> None:
    raw = gzip.decompress((DATA_DIR / name / RECORDS_FILE).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == SNAPSHOTS[name].records_sha256
    assert len(load_records(name)) == SNAPSHOTS[name].n_records
    assert (DATA_DIR / name / "NOTICE").stat().st_size > 500
    assert SNAPSHOTS[name].source_sha256 in (DATA_DIR / name / "README.md").read_text()


def test_a_changed_snapshot_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SNAPSHOTS["sentiment"]
    monkeypatch.setitem(SNAPSHOTS, "sentiment", type(spec)(**{**spec.__dict__,
                                                              "records_sha256": "0" * 64}))
    with pytest.raises(SnapshotError, match="SHA-256"):
        realdata.records_bytes("sentiment")


def test_sentiment_records_and_labels() -> None:
    recs = load_records("sentiment")
    assert Counter(r.source for r in recs) == {"amazon": 1000, "imdb": 1000, "yelp": 1000}
    assert Counter(r.label for r in recs) == {"negative": 1500, "positive": 1500}
    assert all(r.text.strip() for r in recs)
    assert len({r.id for r in recs}) == len(recs)
    # a record read from the UCI data with the label its publishers gave it
    by_id = {r.id: r for r in recs}
    assert by_id["amazon-0002"].text == "Good case, Excellent value."
    assert by_id["amazon-0002"].label == "positive"
    assert by_id["amazon-0001"].label == "negative"


def test_wordnet_records_and_labels() -> None:
    recs = load_records("wordnet")
    counts = Counter(r.label for r in recs)
    assert set(counts) == {"noun.animal", "noun.plant", "noun.food", "noun.person",
                           "noun.artifact", "noun.location", "noun.body", "noun.communication"}
    assert set(counts.values()) == {500}
    assert all(8 <= len(r.text.split()) <= 60 and '"' not in r.text for r in recs)


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_halves_follow_the_hash_rule_and_are_disjoint(name: str) -> None:
    recs = load_records(name)
    assert all(r.split == split_of(r.text) for r in recs)
    dev, test = records(name, "dev"), records(name, "test")
    assert len(dev) + len(test) == len(recs)
    assert not {r.text for r in dev} & {r.text for r in test}
    assert 0.4 < len(dev) / len(recs) < 0.6
    with pytest.raises(ValueError, match="split"):
        records(name, "train")


def test_site_case_truth_comes_from_the_labels() -> None:
    for seed in (0, 1, 2, 1000, 1001):
        context, query, site, neg = sentiment_site_case(seed, 4096)
        assert sentiment_site_case(seed, 4096) == (context, query, site, neg)
        assert abs(len(context) / 4 - 4096) <= 0.05 * 4096
        half = "test" if seed >= 1000 else "dev"
        by_text = {(realdata.SITES[r.source], r.text): r for r in records("sentiment", half)}
        recount: Counter[str] = Counter()
        for line in context.splitlines():
            _, site_part, text = line.split(" | ", 2)
            rec = by_text[(site_part.removeprefix("Site: "), text)]   # KeyError: wrong half
            recount[site_part.removeprefix("Site: ")] += rec.label == "negative"
            assert "negative" not in line.lower().split(" | ")[1]
        assert dict(recount) == {k: v for k, v in neg.items() if v}
        ranked = sorted(neg.values(), reverse=True)
        assert max(neg, key=lambda s: neg[s]) == site and ranked[0] - ranked[1] >= 4
        assert "Amazon" in query and "Yelp" in query


def test_site_answer_names_one_site_deterministically() -> None:
    from recursa.bench.record_baselines import site_answer
    context, _, site, _ = sentiment_site_case(0, 1024)
    ans = site_answer("lexicon", context)
    assert ans in realdata.SITES.values() and ans == site_answer("lexicon", context)
    lines = "Review 1 | Site: Yelp | Awful, rude staff.\nReview 2 | Site: IMDb | Loved it.\n"
    assert site_answer("lexicon", lines) == "Yelp"
    assert site_answer("lexicon", lines, "positive") == "IMDb"
