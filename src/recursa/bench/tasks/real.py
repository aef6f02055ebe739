"""Judged counts and "which has the most" over real records whose labels their publishers
assigned (recursa.bench.realdata): one-sentence reviews of Amazon, IMDb and Yelp labelled
negative / positive (UCI Sentiment Labelled Sentences), and WordNet noun glosses labelled with
their lexicographer file (an animal, a plant, a food, a person, ...).

Records are one a line with a number (and, for "most", the site), never the label. The truth is
counted from the labels. Seeds and records come from one half of the snapshot: dev seeds
(below 1000) draw only dev records, test seeds (1000 up) only test records; the question
phrasings are split the same way. Counts are right within 15% of the truth; a site / kind is
right when the answer names it and no other candidate.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any, ClassVar

from ..realdata import SITES, TEST_SEED_BASE, Record, records
from .base import CHARS_PER_TOKEN, Instance, Score, Task, answer_segment, normalize
from .split import pick, start
from .strict import is_dump, mentioned, strict_choice, strict_number

REL_TOL = 0.15           # a count is right within 15% of the truth
MARGIN = 4               # "most" questions only when the leader leads by this many records
ATTEMPTS = 300
MIN_LENGTH = 512

# ---------------------------------------------------------------- question phrasings
SENTIMENT_COUNT = {
    "test": {
        "negative": ["How many of these reviews are negative?",
                     "How many reviewers here were unhappy with what they reviewed?",
                     "Count the reviews in this list that express a negative opinion."],
        "positive": ["How many of these reviews are positive?",
                     "How many reviewers here liked what they reviewed?",
                     "Count the reviews in this list that express a positive opinion."],
    },
    "dev": {
        "negative": ["What number of the reviews below are unfavourable?",
                     "How many reviews criticise the thing they are about?"],
        "positive": ["What number of the reviews below are favourable?",
                     "How many reviews praise the thing they are about?"],
    },
}
SENTIMENT_MOST = {
    "test": {
        "negative": ["Which site's reviews are most often negative?",
                     "On which site did the most reviewers write a negative review?"],
        "positive": ["Which site's reviews are most often positive?",
                     "On which site did the most reviewers write a positive review?"],
    },
    "dev": {
        "negative": ["Which site has the largest number of unfavourable reviews in this list?"],
        "positive": ["Which site has the largest number of favourable reviews in this list?"],
    },
}
SITE_CHOICES = list(SITES.values())

# WordNet: the four kinds asked about, and how a question names them (singular, plural)
KINDS = {"noun.animal": ("an animal", "animals"), "noun.plant": ("a plant", "plants"),
         "noun.food": ("a food or a drink", "foods"), "noun.person": ("a person", "people")}
KIND_CHOICES = [plural for _, plural in KINDS.values()]
# the words an answer may use for each kind (whole words)
KIND_WORDS = {"animals": ["animals", "animal"], "plants": ["plants", "plant"],
              "foods": ["foods", "food", "foods or drinks", "food or drink", "drinks", "drink"],
              "people": ["people", "person", "persons", "humans", "human"]}
WORDNET_COUNT = {
    "test": ["How many of these definitions describe {one}?",
             "How many entries in this list define {one}?",
             "Count the definitions here that are definitions of {one}."],
    "dev": ["What number of the entries below describe {one}?",
            "How many of the glosses below are about {one}?"],
}
WORDNET_MOST = {
    "test": ["Which kind of thing do the most of these definitions describe: animals, plants, "
             "foods or people?",
             "Of animals, plants, foods and people, which is described by the most entries "
             "in this list?"],
    "dev": ["Among the entries below, which is defined most often: animals, plants, foods or "
            "people?"],
}
SUFFIX = {"count": " Answer with a number.", "most": " Answer with one name only."}


def check_seed(seed: int, split: str) -> None:
    """Dev seeds are below 1000 and test seeds 1000 up, as in the demo, so a seed says which
    half of the data it draws from."""
    if split == "test" and seed < TEST_SEED_BASE:
        raise ValueError(f"test seeds of the real-label families start at {TEST_SEED_BASE} "
                         f"(got {seed}): use --seed {TEST_SEED_BASE} or more, or --split dev")
    if split == "dev" and seed >= TEST_SEED_BASE:
        raise ValueError(f"dev seeds of the real-label families are below {TEST_SEED_BASE} "
                         f"(got {seed}, a test seed)")


# ---------------------------------------------------------------- drawing records
def draw(rng: random.Random, pools: dict[str, list[Record]], weights: dict[str, float],
         length: int, line: Any) -> list[tuple[int, Record]]:
    """Records drawn without replacement from the weighted pools until the lines fill about
    ``length`` tokens: (number, record) pairs in reading order. A pool that runs dry is left
    out; all of them running dry means the length is too long for the half."""
    queues = {k: rng.sample(v, len(v)) for k, v in pools.items()}
    target = length * CHARS_PER_TOKEN
    numbers = rng.sample(range(1000, max(10_000, 1000 + length)), length // 5 + 50)
    out: list[tuple[int, Record]] = []
    chars, misses = 0, 0
    while chars < target and misses < 50:
        live = [k for k in queues if queues[k] and weights.get(k, 0) > 0]
        if not live:
            raise ValueError(f"{length} tokens needs more records than the half has")
        k = rng.choices(live, [weights[k] for k in live])[0]
        rec = queues[k].pop()
        n = numbers[len(out)]
        size = len(line(n, rec)) + 1
        if chars + size > target * 1.02:
            misses += 1          # too long to fit: try a shorter one
            continue
        out.append((n, rec))
        chars += size
    return out


def draw_rounds(rng: random.Random, pools: dict[str, list[Record]], rates: dict[str, float],
                target: str, length: int, line: Any) -> list[tuple[int, Record]]:
    """Reviews in rounds of one per site (in a random order each round), so every site has the
    same number of reviews; a site's review has the target label with that site's rate."""
    queues = {(s, lab): rng.sample([r for r in pool if r.source == s],
                                   sum(r.source == s for r in pool))
              for lab, pool in pools.items() for s in SITES}
    budget = length * CHARS_PER_TOKEN
    numbers = rng.sample(range(1000, max(10_000, 1000 + length)), length // 5 + 50)
    out: list[tuple[int, Record]] = []
    chars, misses = 0, 0
    while chars < budget and misses < 50:
        round_: list[tuple[int, Record]] = []
        for s in rng.sample(list(SITES), len(SITES)):
            want = target if rng.random() < rates[s] else "other"
            labs = [lab for lab in pools if (lab == target) == (want == target)]
            labs += [lab for lab in pools if lab not in labs]
            q = next((queues[(s, lab)] for lab in labs if queues[(s, lab)]), None)
            if q is None:
                raise ValueError(f"{length} tokens needs more records than the half has")
            round_.append((numbers[len(out) + len(round_)], q.pop()))
        size = sum(len(line(n, r)) + 1 for n, r in round_)
        if chars + size > budget * 1.02:
            misses += 1
            for _n, r in round_:         # not used: back where they came from
                queues[(r.source, r.label)].append(r)
            continue
        out += round_
        chars += size
    return out


def by_label(recs: tuple[Record, ...]) -> dict[str, list[Record]]:
    pools: dict[str, list[Record]] = {}
    for r in recs:
        pools.setdefault(r.label, []).append(r)
    return pools


_REVIEW = re.compile(r"^Review (\d+) \| (?:Site: ([^|]+?) \| )?(.*)$")
_ENTRY = re.compile(r"^Entry (\d+): (.*)$")


def records_in(context: str) -> list[tuple[str | None, str]]:
    """(group, text) of each record line of a real-label instance (group: the site, or None)."""
    out: list[tuple[str | None, str]] = []
    for ln in context.splitlines():
        if m := _REVIEW.match(ln):
            out.append((m.group(2), m.group(3)))
        elif m := _ENTRY.match(ln):
            out.append((None, m.group(2)))
    return out


# ---------------------------------------------------------------- the families
class _Real(Task):
    complexity = "linear"
    record_kind = "labelled"
    default_length = 8192
    snapshot: ClassVar[str]
    qtype: ClassVar[str]          # "count" | "most"

    def generate(self, seed: int = 0, length_tokens: int | None = None, *,
                 split: str | None = None, **_: Any) -> Instance:
        if split is None:
            split = "test" if seed >= TEST_SEED_BASE else "dev"
        split, length, rng, inst_id = start(self, seed, length_tokens, split)
        check_seed(seed, split)
        if length < MIN_LENGTH:
            raise ValueError(f"length_tokens must be at least {MIN_LENGTH}")
        pools = by_label(records(self.snapshot, split))
        for _attempt in range(ATTEMPTS):
            found = self.draw_case(rng, pools, length, split)
            if found is not None:
                break
        else:
            raise RuntimeError(f"no instance with a clear answer in {ATTEMPTS} draws")
        drawn, query, gold, extra = found
        context = "".join(self.line(n, r) + "\n" for n, r in drawn)
        shape: dict[str, Any] = ({"kind": "number"} if self.qtype == "count" else
                                 {"kind": "choice", "choices": extra["choices"]})
        return Instance(
            id=inst_id, task=self.name, query=query + SUFFIX[self.qtype], context=context,
            gold=str(gold), length_tokens=length,
            meta={"split": split, "question_type": self.qtype, "snapshot": self.snapshot,
                  "answer_shape": shape, "rel_tol": REL_TOL if self.qtype == "count" else None,
                  "record_ids": [r.id for _, r in drawn],
                  "labels": [r.label for _, r in drawn], **extra})

    def line(self, n: int, rec: Record) -> str:
        raise NotImplementedError

    def draw_case(self, rng: random.Random, pools: dict[str, list[Record]], length: int,
                  split: str) -> tuple[list[tuple[int, Record]], str, Any, dict[str, Any]] | None:
        raise NotImplementedError

    def score(self, prediction: str, inst: Instance) -> Score:
        if self.qtype == "count":
            gold = float(inst.gold)
            sc = strict_number(prediction, gold, rel_tol=REL_TOL)
            if isinstance(sc.parsed, float):
                sc.metrics["rel_error"] = abs(sc.parsed - gold) / max(gold, 1.0)
            return sc
        return strict_choice(prediction, str(inst.gold), inst.meta["answer_shape"]["choices"])


class RealSentimentCount(_Real):
    name = "real_sentiment_count"
    answer_kinds = ("number",)
    description = ("How many of these real reviews (Amazon / IMDb / Yelp, UCI) are negative "
                   "or positive, by their publishers' labels; within 15%.")
    snapshot = "sentiment"
    qtype = "count"

    def line(self, n: int, rec: Record) -> str:
        return f"Review {n} | {rec.text}"

    def draw_case(self, rng: random.Random, pools: dict[str, list[Record]], length: int,
                  split: str) -> tuple[list[tuple[int, Record]], str, Any, dict[str, Any]]:
        target = rng.choice(["negative", "positive"])
        other = "positive" if target == "negative" else "negative"
        rate = rng.uniform(0.15, 0.85)   # the truth varies widely, so no constant is often right
        drawn = draw(rng, pools, {target: rate, other: 1 - rate}, length, self.line)
        query = rng.choice(pick(SENTIMENT_COUNT, split)[target])
        gold = sum(r.label == target for _, r in drawn)
        return drawn, query, gold, {"target": target}


class RealSentimentMost(_Real):
    name = "real_sentiment_most"
    answer_kinds = ("choice",)
    description = ("Which site's real reviews (Amazon / IMDb / Yelp, UCI; each site equally "
                   "often) are most often negative or positive; the leader leads by 4 or more.")
    snapshot = "sentiment"
    qtype = "most"

    def line(self, n: int, rec: Record) -> str:
        return f"Review {n} | Site: {SITES[rec.source]} | {rec.text}"

    def draw_case(self, rng: random.Random, pools: dict[str, list[Record]], length: int,
                  split: str
                  ) -> tuple[list[tuple[int, Record]], str, Any, dict[str, Any]] | None:
        target = rng.choice(["negative", "positive"])
        center = rng.uniform(0.3, 0.7)
        rates = {s: min(0.95, max(0.05, center + rng.uniform(-0.25, 0.25))) for s in SITES}
        drawn = draw_rounds(rng, pools, rates, target, length, self.line)
        hits = Counter({SITES[s]: 0 for s in SITES})
        total = Counter(SITES[r.source] for _, r in drawn)
        for _, r in drawn:
            hits[SITES[r.source]] += r.label == target
        (top, a), (_, b) = hits.most_common(2)
        # every site has as many reviews, so the leader in number leads in share too
        if a - b < MARGIN or len(set(total.values())) != 1:
            return None
        query = rng.choice(pick(SENTIMENT_MOST, split)[target]) + " Amazon, IMDb or Yelp?"
        return drawn, query, top, {"target": target, "choices": SITE_CHOICES,
                                   "counts": dict(hits), "per_site": dict(total)}


class RealWordnetCount(_Real):
    name = "real_wordnet_count"
    answer_kinds = ("number",)
    description = ("How many of these WordNet definitions describe an animal / a plant / a "
                   "food / a person, by WordNet's lexicographer files; within 15%.")
    snapshot = "wordnet"
    qtype = "count"

    def line(self, n: int, rec: Record) -> str:
        return f"Entry {n}: {rec.text}"

    def draw_case(self, rng: random.Random, pools: dict[str, list[Record]], length: int,
                  split: str) -> tuple[list[tuple[int, Record]], str, Any, dict[str, Any]]:
        target = rng.choice(sorted(KINDS))
        share = rng.uniform(0.05, 0.4)
        others = [k for k in sorted(pools) if k != target]
        w = [rng.uniform(0.3, 1.0) for _ in others]
        weights = {target: share, **{k: (1 - share) * x / sum(w) for k, x in zip(others, w,
                                                                                 strict=True)}}
        drawn = draw(rng, pools, weights, length, self.line)
        query = rng.choice(pick(WORDNET_COUNT, split)).format(one=KINDS[target][0])
        gold = sum(r.label == target for _, r in drawn)
        return drawn, query, gold, {"target": target}


class RealWordnetMost(_Real):
    name = "real_wordnet_most"
    answer_kinds = ("choice",)
    description = ("Which of animals, plants, foods and people the most of these WordNet "
                   "definitions describe; the leader leads by 4 or more; strict choice.")
    snapshot = "wordnet"
    qtype = "most"

    def line(self, n: int, rec: Record) -> str:
        return f"Entry {n}: {rec.text}"

    def draw_case(self, rng: random.Random, pools: dict[str, list[Record]], length: int,
                  split: str
                  ) -> tuple[list[tuple[int, Record]], str, Any, dict[str, Any]] | None:
        named = rng.uniform(0.4, 0.8)             # the four kinds' share; the rest are others
        kinds, others = sorted(KINDS), [k for k in sorted(pools) if k not in KINDS]
        wk = [rng.uniform(0.5, 1.5) for _ in kinds]
        wo = [rng.uniform(0.5, 1.5) for _ in others]
        weights = {**{k: named * x / sum(wk) for k, x in zip(kinds, wk, strict=True)},
                   **{k: (1 - named) * x / sum(wo) for k, x in zip(others, wo, strict=True)}}
        drawn = draw(rng, pools, weights, length, self.line)
        counts = Counter({KINDS[k][1]: 0 for k in kinds})
        for _, r in drawn:
            if r.label in KINDS:
                counts[KINDS[r.label][1]] += 1
        (top, a), (_, b) = counts.most_common(2)
        if a - b < MARGIN:
            return None
        query = rng.choice(pick(WORDNET_MOST, split))
        return drawn, query, top, {"choices": KIND_CHOICES, "counts": dict(counts)}

    def score(self, prediction: str, inst: Instance) -> Score:
        return kind_choice(prediction, str(inst.gold))


def kind_choice(prediction: str, gold: str) -> Score:
    """Strict choice among the four kinds, each named in any of its words ('animal' or
    'animals'): 1 when the answer names the gold kind and no other, 0 for a hedge or a dump."""
    seg = answer_segment(prediction)
    if is_dump(seg):
        return Score(score=0.0, metrics={"exact": 0.0, "dump": 1.0}, parsed=None)
    word_kind = {normalize(w): k for k, ws in KIND_WORDS.items() for w in ws}
    named = {word_kind[normalize(w)] for w in mentioned(seg, list(word_kind))}
    hedge = len(named) > 1
    ok = named == {gold}
    return Score(score=float(ok), metrics={"exact": float(ok), "hedge": float(hedge)},
                 parsed=sorted(named) or None)


REAL_TASKS = (RealSentimentCount(), RealSentimentMost(), RealWordnetCount(), RealWordnetMost())
