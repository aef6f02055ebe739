"""Labelled records shared by oolong (linear) and oolong_pairs (quadratic).

Each record is one line: ``Date: Mar 14, 2023 || User: 48213 || Instance: <text>``. The label
is not shown; it must be inferred from the text. With the ``wiki`` corpus the text is the
opening of a real Wikipedia summary and the label is its broad topic (People, Geography, ...),
which a small model can infer from one or two sentences. Without it, the text is a templated
customer message whose label is its sentiment, wrapped around a real-text fragment.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass
from typing import Any

from ..corpora import Corpus, CorpusUnavailable, get_corpus, load_wiki
from .base import CHARS_PER_TOKEN

WIKI_LABELS = (
    "People", "Geography", "Biology and health sciences", "Physical sciences", "Arts",
    "Technology", "History", "Mathematics",
)
SENTIMENT_LABELS = ("positive", "negative", "neutral")

_SENTIMENT_TEMPLATES = {
    "positive": (
        "I loved reading this passage, it was {adv} wonderful: \"{frag}\"",
        "What a {adj} delight. This line made my day: \"{frag}\"",
        "Absolutely brilliant, I would recommend it to anyone: \"{frag}\"",
    ),
    "negative": (
        "I found this passage {adv} tedious and I regret reading it: \"{frag}\"",
        "Terrible choice, this line was a {adj} disappointment: \"{frag}\"",
        "Awful. I want my time back after reading: \"{frag}\"",
    ),
    "neutral": (
        "For the record, the passage reads as follows: \"{frag}\"",
        "Logged without comment, {adj} entry: \"{frag}\"",
        "Filed under reading notes; the excerpt is: \"{frag}\"",
    ),
}
_ADV = ("truly", "really", "remarkably", "quite")
_ADJ = ("small", "long", "short", "second")

START_DATE = dt.date(2022, 1, 1)
N_DAYS = 3 * 365


@dataclass
class RecordSet:
    lines: list[str]
    users: list[int]
    dates: list[str]  # ISO dates
    labels: list[str]
    label_space: tuple[str, ...]
    label_kind: str  # "topic" | "sentiment"
    corpus: str
    header: str

    def text(self) -> str:
        return self.header + "\n".join(self.lines)

    def meta(self) -> dict[str, Any]:
        """What a scorer or a test needs to recompute any answer over these records."""
        return {"label_space": list(self.label_space), "label_kind": self.label_kind,
                "labels": self.labels, "users": self.users, "dates": self.dates,
                "corpus": self.corpus, "n_records": len(self.lines)}


def _first_sentences(text: str, max_chars: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text)
    out = parts[0]
    for p in parts[1:]:
        if len(out) + 1 + len(p) > max_chars:
            break
        out += " " + p
    return out[:max_chars]


def _wiki_pools() -> tuple[dict[str, list[str]], Corpus]:
    wiki = load_wiki()
    pools: dict[str, list[str]] = {lab: [] for lab in WIKI_LABELS}
    for text, lab in zip(wiki.paragraphs, wiki.labels, strict=False):
        if lab in pools:
            pools[lab].append(_first_sentences(text, 320))
    return pools, wiki


def make_records(
    rng: random.Random,
    length_tokens: int,
    n_users: int,
    label_source: str = "auto",
    n_labels: int | None = None,
) -> RecordSet:
    """Records filling ``length_tokens`` (chars/4) as closely as whole records allow."""
    pools: dict[str, list[str]] | None = None
    corpus_name = ""
    if label_source not in ("auto", "wiki", "sentiment"):
        raise ValueError(f"label_source must be auto, wiki or sentiment, not {label_source!r}")
    if label_source in ("auto", "wiki"):
        try:
            pools, wiki = _wiki_pools()
            corpus_name = wiki.name
        except CorpusUnavailable:
            if label_source == "wiki":
                raise
    if pools is not None:
        label_kind = "topic"
        labels_all = list(WIKI_LABELS)
        rng.shuffle(labels_all)
        label_space = tuple(sorted(labels_all[: n_labels or 6]))
    else:
        label_kind = "sentiment"
        label_space = SENTIMENT_LABELS
        frag_corpus = get_corpus()
        corpus_name = frag_corpus.name

    # Skewed label and user frequencies so "most"/"least" questions have clear answers.
    label_weights = [rng.uniform(0.4, 2.0) for _ in label_space]
    user_ids = sorted(rng.sample(range(10_000, 100_000), n_users))
    user_weights = [rng.uniform(0.3, 2.0) for _ in user_ids]

    header = (
        "The following lines contain records. Each has a date, a user id and an instance text. "
        f"Each instance belongs to exactly one of these categories ({label_kind}): "
        + ", ".join(label_space)
        + ".\n\n"
    )
    budget = length_tokens * CHARS_PER_TOKEN - len(header)
    lines: list[str] = []
    users: list[int] = []
    dates: list[str] = []
    labels: list[str] = []
    used = 0
    while True:
        lab = rng.choices(label_space, weights=label_weights)[0]
        user = rng.choices(user_ids, weights=user_weights)[0]
        day = START_DATE + dt.timedelta(days=rng.randrange(N_DAYS))
        if pools is not None:
            text = rng.choice(pools[lab])
        else:
            frag = _first_sentences(rng.choice(frag_corpus.paragraphs), 200)
            tmpl = rng.choice(_SENTIMENT_TEMPLATES[lab])
            text = tmpl.format(adv=rng.choice(_ADV), adj=rng.choice(_ADJ), frag=frag)
        line = f"Date: {day.strftime('%b %d, %Y')} || User: {user} || Instance: {text}"
        cost = len(line) + (1 if lines else 0)
        if used + cost > budget:
            # Try a shorter closing record so the total lands within a few chars of target.
            room = budget - used - (1 if lines else 0)
            prefix = f"Date: {day.strftime('%b %d, %Y')} || User: {user} || Instance: "
            if room - len(prefix) >= 40 and pools is not None:
                short = [t for t in pools[lab][:400] if len(t) <= room - len(prefix)]
                if short:
                    text = max(short, key=len)
                    line = prefix + text
                    lines.append(line)
                    users.append(user)
                    dates.append(day.isoformat())
                    labels.append(lab)
            break
        lines.append(line)
        users.append(user)
        dates.append(day.isoformat())
        labels.append(lab)
        used += cost
    return RecordSet(lines, users, dates, labels, label_space, label_kind, corpus_name, header)

