"""Baselines that label each record with no language model, then aggregate the labels the way
the question asks (how many are X; which site / kind has the most X): for the real-label
families (tasks/real.py), whose records are one a line.

- ``lexicon``: a word list. Reviews: VADER (``vaderSentiment`` 3.3.2, MIT, its lexicon bundled),
  negative unless the compound score reaches VADER's own "positive" threshold of 0.05 (chosen on
  the dev half: 0.81 per record against 0.75 for a threshold of 0). Definitions: the keyword
  lists of recursa.bench.lexicons.
- ``embed``: zero-shot similarity with all-MiniLM-L6-v2 (recursa.bench.embed): each record takes
  the label whose short description is nearest ("a negative review" / "a positive review";
  "an animal", "a plant", "a food or a drink", "a person", and for anything else the nearest of
  a few generic descriptions).
- ``classifier`` (a REFERENCE that uses labelled examples, unlike the RLM and the two above):
  TF-IDF + logistic regression (scikit-learn) trained on the snapshot's dev half. A dev record is
  labelled by the model trained on the other of two folds of the dev half (so a dev instance is
  never scored by a model that saw its own records); a test record by the model trained on the
  whole dev half.

Each is deterministic, reads only the instance's text, the question's type and its target (what
a person writing a one-off script for the question would know), and spends nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from functools import cache
from typing import Any

from .lexicons import OTHER, keyword_kind
from .realdata import records, split_of
from .tasks.base import Instance, RecordKind
from .tasks.real import KINDS, SITE_CHOICES, records_in

LABEL_BASELINES = ("lexicon", "embed", "classifier")
NEEDS_LABELS = ("classifier",)       # a reference: never counted as the "best baseline"
VADER_POSITIVE = 0.05                # VADER's documented threshold for a positive sentence
SENTIMENT_DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "negative": ("a negative review",), "positive": ("a positive review",)}
KIND_DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "noun.animal": ("an animal",), "noun.plant": ("a plant",),
    "noun.food": ("a food or a drink",), "noun.person": ("a person",),
    OTHER: ("an object or a tool", "a place", "an abstract idea")}


def record_kind(task: str) -> RecordKind | None:
    """What the family called ``task`` declares its context holds for these baselines
    (recursa.bench.tasks.base.RecordKind); None for a family that declares nothing."""
    from recursa.frontend.tasks import get_task
    try:
        return getattr(get_task(task), "record_kind", None)
    except KeyError:
        return None


def _one_code(task: str) -> bool:
    """A family whose answer is always one n-digit code (a needle among look-alikes)."""
    from recursa.frontend.tasks import get_task
    try:
        return tuple(get_task(task).answer_kinds) == ("digits",)
    except KeyError:
        return False


def applies(baseline: str, task: str) -> bool:
    """Whether a record-labelling baseline can run on ``task``, by what the family declares:
    all three on labelled records; lexicon and embed on unlabelled reviews (a review's
    complaint / praise labelled as a negative / positive one: issue 34's audit found a
    sentiment word list does well there); on a document to look things up in and on a code
    among look-alikes, embed as retrieval by meaning (recursa.bench.lookup_baselines)."""
    if baseline not in LABEL_BASELINES:
        return True
    kind = record_kind(task)
    if kind == "document" or _one_code(task):
        return baseline == "embed"
    return kind == "labelled" or (kind == "reviews" and baseline not in NEEDS_LABELS)


# ---------------------------------------------------------------- labelling one record each
def label_texts(baseline: str, snapshot: str, texts: Sequence[str]) -> list[str]:
    """A label per text: negative / positive (sentiment), or a kind / "other" (wordnet)."""
    texts = list(texts)
    if baseline == "lexicon":
        if snapshot == "sentiment":
            vader = _vader()
            return ["positive" if vader.polarity_scores(t)["compound"] >= VADER_POSITIVE
                    else "negative" for t in texts]
        return [keyword_kind(t) for t in texts]
    if baseline == "embed":
        return _nearest(texts, SENTIMENT_DESCRIPTIONS if snapshot == "sentiment"
                        else KIND_DESCRIPTIONS)
    if baseline == "classifier":
        out = _classify(snapshot, texts)
        return out if snapshot == "sentiment" else [x if x in KINDS else OTHER for x in out]
    raise ValueError(f"unknown record baseline {baseline!r}; known: {LABEL_BASELINES}")


@cache
def _vader() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    return SentimentIntensityAnalyzer()


def _nearest(texts: list[str], descriptions: dict[str, tuple[str, ...]]) -> list[str]:
    from .embed import encoder
    enc = encoder()
    labels = [lab for lab, ds in descriptions.items() for _ in ds]
    d = enc.encode([x for ds in descriptions.values() for x in ds])
    sims = enc.encode(texts) @ d.T
    return [labels[int(i)] for i in sims.argmax(axis=1)] if texts else []


def _fold(text: str) -> int:
    return hashlib.sha256(text.encode("utf-8")).digest()[1] % 2


@cache
def _model(snapshot: str, held_out_fold: int | None) -> Any:
    """TF-IDF + logistic regression on the dev half (less one fold when held_out_fold is set)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    train = [r for r in records(snapshot, "dev")
             if held_out_fold is None or _fold(r.text) != held_out_fold]
    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
                          LogisticRegression(max_iter=2000))
    model.fit([r.text for r in train], [r.label for r in train])
    return model


def _classify(snapshot: str, texts: list[str]) -> list[str]:
    out: list[str] = [""] * len(texts)
    groups: dict[int | None, list[int]] = {}
    for i, t in enumerate(texts):
        groups.setdefault(_fold(t) if split_of(t) == "dev" else None, []).append(i)
    for fold, idx in groups.items():
        pred = _model(snapshot, fold).predict([texts[i] for i in idx])
        for i, p in zip(idx, pred, strict=True):
            out[i] = str(p)
    return out


# ---------------------------------------------------------------- aggregating
def record_answer(baseline: str, inst: Instance, text: str) -> str:
    """The baseline's answer to an instance of labelled records or of reviews (what its family
    declares as its `record_kind`)."""
    if record_kind(inst.task) == "reviews":
        return judged_answer(baseline, inst, text)
    recs = records_in(text)
    labels = label_texts(baseline, inst.meta["snapshot"], [t for _, t in recs])
    target = inst.meta.get("target")
    if inst.meta["question_type"] == "count":
        return str(sum(lab == target for lab in labels))
    if inst.meta["snapshot"] == "sentiment":
        return site_answer(baseline, text, str(target))
    kinds = Counter({k: 0 for k in KINDS})
    for lab in labels:
        if lab in KINDS:
            kinds[lab] += 1
    return KINDS[max(KINDS, key=lambda k: kinds[k])][1]


def site_answer(baseline: str, context: str, target: str = "negative") -> str:
    """The site whose reviews a baseline labels ``target`` most often, over "Review N | Site: X
    | text" lines (realdata.sentiment_site_case's context; ties to the first of Amazon, IMDb,
    Yelp): what the demo can print beside the RLM."""
    recs = records_in(context)
    labels = label_texts(baseline, "sentiment", [t for _, t in recs])
    by_site = Counter({s: 0 for s in SITE_CHOICES})
    for (site, _), lab in zip(recs, labels, strict=True):
        by_site[site or ""] += lab == target
    return max(SITE_CHOICES, key=lambda s: by_site[s])


def record_accuracy(baseline: str, snapshot: str, split: str = "dev") -> float:
    """Share of a half's records the baseline labels right (wordnet: a kind, or "other" for the
    four categories no question asks about)."""
    recs = records(snapshot, split)
    truth = [r.label if snapshot == "sentiment" or r.label in KINDS else OTHER for r in recs]
    pred = label_texts(baseline, snapshot, [r.text for r in recs])
    return sum(p == t for p, t in zip(pred, truth, strict=True)) / len(recs)


_JUDGED_LINE = re.compile(r"^Review [^|]*\| Shop: ([^|]+?) \| Product: ([^|]+?) \| "
                          r"Customer: [^|]*\| Text: (.*)$")


def judged_answer(baseline: str, inst: Instance, text: str) -> str:
    """judge_agg: each review labelled complaint (negative) or praise, then the question's
    count, group count, most / fewest group or difference."""
    recs = [(m.group(1), m.group(2), m.group(3)) for ln in text.splitlines()
            if (m := _JUDGED_LINE.match(ln))]
    if baseline not in ("lexicon", "embed"):
        raise ValueError(f"{baseline} does not run on judge_agg")
    bad = [lab == "negative" for lab in label_texts(baseline, "sentiment", [t for *_, t in recs])]
    group = inst.meta.get("group", "shop")
    names = [str(n) for n in (inst.meta["shop_names"] if group == "shop"
                              else inst.meta["product_names"])]
    per: Counter[str] = Counter({n: 0 for n in names})
    for (shop, product, _), b in zip(recs, bad, strict=True):
        per[shop if group == "shop" else product] += b
    qtype = inst.meta["question_type"]
    if qtype == "count":
        return str(sum(bad))
    if qtype == "count_group":
        return str(per[str(inst.meta["g"])])
    if qtype == "diff":
        return str(per[str(inst.meta["a"])] - per[str(inst.meta["b"])])
    most = qtype == "most_group"
    return max(names, key=lambda n: per[n] if most else -per[n])
