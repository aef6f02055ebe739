"""Real records with labels nobody in this project wrote, from pinned snapshots in the package.

Two snapshots (src/recursa/bench/data/<name>/, each with its licence and README):

- ``sentiment``: the UCI "Sentiment Labelled Sentences" (Kotzias et al., KDD 2015, CC BY 4.0),
  1,000 one-sentence reviews from each of Amazon, IMDb and Yelp labelled positive / negative by
  their publishers, as shipped in the npm package ``sentiment@5.0.2`` (test/fixtures/*.json);
- ``wordnet``: WordNet 3.0 noun glosses with the lexicographer file of their synset
  (noun.animal, noun.plant, ...) as the label, from Debian's ``wordnet-base=1:3.0-37``.

``benchmarks/data/rebuild_<name>.py`` rebuilds a snapshot from its registry package (checking
the package's pinned SHA-256); loading checks the snapshot's own SHA-256 here, so a changed file
fails loudly instead of quietly changing every instance.

Each record belongs to the ``dev`` or the ``test`` half by a hash of its text (`split_of`),
fixed when the snapshot was built and stored in the record: identical texts always share a half.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
RECORDS_FILE = "records.jsonl.gz"
SPLITS = ("dev", "test")
TEST_SEED_BASE = 1000        # the demo's and the real families' test seeds are >= 1000


@dataclass(frozen=True)
class SnapshotSpec:
    name: str
    records_sha256: str      # of the decompressed records.jsonl (gzip bytes vary by zlib)
    n_records: int
    source: str              # the registry package it was built from
    source_sha256: str
    license: str


SNAPSHOTS: dict[str, SnapshotSpec] = {
    "sentiment": SnapshotSpec(
        name="sentiment",
        records_sha256="0049f9d0f585c6e99948c2b38186c99d96a1c9889021e5913f5bb3de8b37fc6e",
        n_records=3000,
        source="npm sentiment@5.0.2 (https://registry.npmjs.org/sentiment/-/sentiment-5.0.2.tgz)",
        source_sha256="89302eb03d2005d03b214fe65814bb48adb7d3c42c8ca80bdee6a3ecb7e4480f",
        license="CC BY 4.0 (UCI Sentiment Labelled Sentences, Kotzias et al. 2015)"),
    "wordnet": SnapshotSpec(
        name="wordnet",
        records_sha256="d8fca96fdba79595b749b61c16f4ccf02d2adc250561e92915120c03029a9194",
        n_records=4000,
        source="Debian wordnet-base=1:3.0-37 (wordnet-base_3.0-37_all.deb)",
        source_sha256="61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
        license="WordNet 3.0 licence (BSD-like; NOTICE in the snapshot's folder)"),
}


@dataclass(frozen=True)
class Record:
    id: str
    text: str
    label: str
    split: str
    source: str = ""         # sentiment: amazon / imdb / yelp; wordnet: the synset's lemma


class SnapshotError(RuntimeError):
    """A snapshot file is missing or is not the pinned one."""


def split_of(text: str) -> str:
    """The half a record belongs to: the first byte of SHA-256 of its text, even -> dev."""
    return "dev" if hashlib.sha256(text.encode("utf-8")).digest()[0] % 2 == 0 else "test"


def records_bytes(name: str) -> bytes:
    """The decompressed records.jsonl of a snapshot, checked against its pinned SHA-256."""
    spec = _spec(name)
    path = DATA_DIR / name / RECORDS_FILE
    if not path.is_file():
        raise SnapshotError(f"snapshot {name!r} missing: {path} (rebuild it with "
                            f"benchmarks/data/rebuild_{name}.py)")
    return checked(gzip.decompress(path.read_bytes()), spec.records_sha256,
                   f"snapshot {name!r} at {path}",
                   f"; rebuild it with benchmarks/data/rebuild_{name}.py or update the pin on "
                   "purpose")


def checked(raw: bytes, pinned: str, what: str, fix: str = "") -> bytes:
    """`raw`, or SnapshotError when its SHA-256 is not the `pinned` one (`what` names the file,
    `fix` says how to mend it)."""
    got = hashlib.sha256(raw).hexdigest()
    if got != pinned:
        raise SnapshotError(f"{what} has SHA-256 {got}, pinned {pinned}: the file changed{fix}")
    return raw


@cache
def load_records(name: str) -> tuple[Record, ...]:
    """Every record of a snapshot, in file order."""
    out = []
    for line in records_bytes(name).decode("utf-8").splitlines():
        d = json.loads(line)
        out.append(Record(id=d["id"], text=d["text"], label=d["label"], split=d["split"],
                          source=d.get("source", "")))
    return tuple(out)


def records(name: str, split: str) -> tuple[Record, ...]:
    """The records of one half (``dev`` or ``test``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return tuple(r for r in load_records(name) if r.split == split)


def split_for_seed(seed: int) -> str:
    """The demo's rule: seeds below 1000 draw dev records, seeds from 1000 test records."""
    return "test" if seed >= TEST_SEED_BASE else "dev"


def _spec(name: str) -> SnapshotSpec:
    try:
        return SNAPSHOTS[name]
    except KeyError:
        raise KeyError(f"unknown snapshot {name!r}; known: {', '.join(SNAPSHOTS)}") from None


# ---------------------------------------------------------------- the demo's case
SITES = {"amazon": "Amazon", "imdb": "IMDb", "yelp": "Yelp"}
SITE_MARGIN = 4              # the leader's lead in true negatives over the runner-up
SITE_ATTEMPTS = 500
SITE_QUERY = ("Which site's reviews are most often negative here: Amazon, IMDb or Yelp? "
              "Answer with the site's name only.")


def review_line(n: int, rec: Record) -> str:
    return f"Review {n} | Site: {SITES[rec.source]} | {rec.text}"


def sentiment_site_case(seed: int, tokens: int) -> tuple[str, str, str, dict[str, int]]:
    """A "which site's reviews are most often negative?" case for the demo: ``(context, query,
    answer_site, negatives per site)``. About ``tokens`` tokens (4 characters each) of
    "Review N | Site: X | text" lines over Amazon, IMDb and Yelp, drawn from the dev half for
    seeds below 1000 and the test half from 1000; redrawn until the site with the most negative
    reviews (by the data's own labels) leads the next by at least 4 and also has the highest
    share of negatives among its own reviews."""
    if tokens < 200:
        raise ValueError(f"tokens must be at least 200, got {tokens}")
    pool = records("sentiment", split_for_seed(seed))
    by_site = {s: [r for r in pool if r.source == s] for s in SITES}
    rng = random.Random(f"sentiment_site_case:{seed}:{tokens}")
    for _ in range(SITE_ATTEMPTS):
        # uneven shares of the sites, so that the commonest site is not the answer by itself
        weights = [rng.uniform(0.6, 1.4) for _ in SITES]
        lines: list[str] = []
        recs: list[Record] = []
        chars = 0
        # review numbers: distinct, random, 4 digits while they fit
        numbers = rng.sample(range(1000, max(10_000, 1000 + tokens)), tokens // 5 + 50)
        used: set[str] = set()
        while chars < tokens * 4:
            site = rng.choices(list(SITES), weights)[0]
            rec = rng.choice(by_site[site])
            if rec.id in used:
                continue
            used.add(rec.id)
            line = review_line(numbers[len(lines)], rec)
            if chars + len(line) + 1 > tokens * 4 and lines:
                break
            lines.append(line)
            recs.append(rec)
            chars += len(line) + 1
        neg = Counter({SITES[s]: 0 for s in SITES})
        total = Counter(SITES[r.source] for r in recs)
        for r in recs:
            neg[SITES[r.source]] += r.label == "negative"
        (top, a), (_, b) = neg.most_common(2)
        # the leader in number of negatives must also lead in their share of its site's
        # reviews, so that either reading of "most often" has the same answer
        by_rate = max(total, key=lambda s: neg[s] / total[s])
        if a - b >= SITE_MARGIN and by_rate == top:
            return "\n".join(lines) + "\n", SITE_QUERY, top, dict(neg)
    raise RuntimeError(f"no case with a margin of {SITE_MARGIN} in {SITE_ATTEMPTS} draws "
                       f"(seed {seed}, {tokens} tokens)")
