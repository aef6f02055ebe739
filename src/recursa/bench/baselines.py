"""Baselines that need no model: what a one-line script scores on an instance.

- ``grep``: the query's rarest words (case-insensitive, whole words, ranked by how rarely they
  occur in the input); returns the line or sentence that holds most of them, rarest first. For a
  count question ("how many ...") it returns the number of lines holding the rarest query word
  that occurs at all.
- ``regex``: the values of the answer's shape, without reading the query: the commonest
  n-digit code (of the gold's length), the commonest number, the label / name of the answer's
  candidate set named most often, every n-digit code (multi-value), or every pair of ids
  (pairs).
- ``constant``: the commonest gold answer of the task family over dev seeds (other seeds than
  this one; of the same question type where the family has types), without reading the input.

For the real-label families (tasks/real.py) three more label each record and aggregate
(recursa.bench.record_baselines): ``lexicon`` (VADER / keyword lists), ``embed`` (zero-shot
MiniLM similarity) and ``classifier`` (TF-IDF + logistic regression trained on the dev half's
labels: a reference for what labelled examples buy, never the "best baseline").

Each returns an answer string; `run_baseline` wraps it in a `Result` that spends nothing. A
method that does not beat the best of the baselines that need no labels in a cell is reported as
not beating it.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from functools import cache
from itertools import combinations
from typing import Any

from recursa.base.types import Result

from .tasks import get_task
from .tasks.base import Instance

BASELINES = ("grep", "regex", "constant", "lexicon", "embed", "classifier")
# the ones that, like the RLM, see no labelled example: the "best baseline" is the best of these
NO_LABEL_BASELINES = ("grep", "regex", "constant", "lexicon", "embed")
BASELINE_MODEL = "none"          # the model field of baseline rows: shared by every model's run
CONSTANT_SEEDS = 30              # dev seeds the constant is the mode over
# families without a dev split draw the constant's seeds from here, far from any seed a run uses
OTHER_SEED_BASE = 1_000_000

STOPWORDS = frozenset("""
a about above after again all also am an and any are as at be been before being below between
both but by can could did do does doing down during each few for from further had has have
having he her here hers him his how i if in into is it its itself just me more most my no nor
not of off on once only or other our out over own same she should so some such than that the
their them then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your answer number numbers name text
provided mentioned given following data input context record records give tell list write
one only each every many much
""".split())

_WORD = re.compile(r"[a-z][a-z'-]{2,}")


def query_words(query: str) -> list[str]:
    """The query's content words, lowercased, in order, without duplicates."""
    out: list[str] = []
    for w in _WORD.findall(query.lower()):
        w = w.strip("'-")
        if w.endswith("'s"):
            w = w[:-2]
        if len(w) >= 3 and w not in STOPWORDS and w not in out:
            out.append(w)
    return out


def _units(text: str) -> list[str]:
    """Lines when the input is line-structured (records), else sentences."""
    lines = [x for x in text.splitlines() if x.strip()]
    # records: many lines, not paragraphs of prose between blank lines
    if len(lines) >= 20 and text.count("\n\n") < len(lines) / 3 \
            and max(len(x) for x in lines) < 2_000:
        return lines
    return [s for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _count_word(word: str, text_lower: str) -> int:
    return len(re.findall(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text_lower))


def grep_answer(query: str, text: str) -> str:
    low = text.lower()
    words = [(n, w) for w in query_words(query) if (n := _count_word(w, low)) > 0]
    words.sort()
    rare = [w for _, w in words]
    units = _units(text)
    if re.match(r"\s*(how many|count|what number of)\b", query, re.IGNORECASE):
        if not rare:
            return "0"
        pat = re.compile(r"(?<![\w-])" + re.escape(rare[0]) + r"(?![\w-])")
        return str(sum(1 for u in units if pat.search(u.lower())))
    if not rare:
        return ""
    # rank units by the rare words they hold, the rarest weighing most (idf-like)
    weight = {w: 1.0 / n for n, w in words}
    pats = {w: re.compile(r"(?<![\w-])" + re.escape(w) + r"(?![\w-])") for w in rare}
    best, best_score = "", 0.0
    for u in units:
        ul = u.lower()
        s = sum(weight[w] for w in rare if pats[w].search(ul))
        if s > best_score:
            best, best_score = u, s
    return best.strip()


def shape_of(inst: Instance) -> dict[str, Any]:
    """The answer's shape, as the instance's family gives it (Task.answer_shape)."""
    return get_task(inst.task).answer_shape(inst)


def _codes(text: str, n: int) -> list[str]:
    return re.findall(r"(?<![\d,])\d{" + str(n) + r"}(?![\d,])", text)


def regex_answer(inst: Instance, text: str) -> str:
    shape = shape_of(inst)
    kind = shape["kind"]
    if kind == "digits":
        codes = _codes(text, int(shape["n"]))
        return Counter(codes).most_common(1)[0][0] if codes else ""
    if kind == "digits_set":
        return "\n".join(dict.fromkeys(_codes(text, int(shape["n"]))))
    if kind == "number":
        nums = re.findall(r"(?<![\w.])\d+(?![\w.])", text)
        return Counter(nums).most_common(1)[0][0] if nums else "0"
    if kind == "choice":
        # the candidate named most often; ties go to the one named first in the text
        by_low = {str(c).lower(): str(c) for c in shape["choices"]}
        if not by_low:
            return ""
        pat = re.compile(r"(?<![\w-])(" + "|".join(
            re.escape(c) for c in sorted(by_low, key=len, reverse=True)) + r")(?![\w-])")
        counts: Counter[str] = Counter()
        first: dict[str, int] = {}
        for m in pat.finditer(text.lower()):
            counts[m.group(1)] += 1
            first.setdefault(m.group(1), m.start())
        if not counts:
            return next(iter(by_low.values()))
        top = max(counts, key=lambda c: (counts[c], -first[c]))
        return by_low[top]
    if kind == "pairs":
        ids = sorted({int(x) for x in shape.get("ids", [])})
        return "\n".join(f"({a}, {b})" for a, b in combinations(ids, 2))
    return ""


def answer_text(gold: Any) -> str:
    """A gold answer written as an answer (pairs one per line)."""
    if isinstance(gold, list) and gold and all(isinstance(p, list | tuple) and len(p) == 2
                                               for p in gold):
        return "\n".join(f"({a}, {b})" for a, b in gold)
    if isinstance(gold, list):
        return "\n".join(str(x) for x in gold)
    return str(gold)


@cache
def _dev_golds(task: str, length: int) -> tuple[tuple[int, str | None, str], ...]:
    """(seed, question type, gold as JSON) of the family's dev instances at this length."""
    from .tasks import SPLIT_FAMILIES
    t = get_task(task)
    base = 0 if task in SPLIT_FAMILIES else OTHER_SEED_BASE
    out = []
    for seed in range(base, base + CONSTANT_SEEDS):
        inst = t.generate(seed, length, split="dev")
        out.append((seed, inst.meta.get("question_type"), json.dumps(inst.gold)))
    return tuple(out)


def constant_answer(inst: Instance, seed: int | None = None) -> str:
    own_split = inst.meta.get("split", "test")
    golds = [(s, q, g) for s, q, g in _dev_golds(inst.task, inst.length_tokens)
             if not (own_split == "dev" and s == seed)]
    qtype = inst.meta.get("question_type")
    same = [g for _, q, g in golds if q == qtype] if qtype is not None else []
    pool = same if len(same) >= 3 else [g for _, _, g in golds]
    if not pool:
        return ""
    mode = Counter(pool).most_common(1)[0][0]
    return answer_text(json.loads(mode))


def baseline_answer(name: str, inst: Instance, text: str, seed: int | None = None) -> str:
    if name == "grep":
        return grep_answer(inst.query, text)
    if name == "regex":
        return regex_answer(inst, text)
    if name == "constant":
        return constant_answer(inst, seed)
    if name == "embed" and inst.meta.get("question_type") == "lookup":
        from .lookup_baselines import nearest_sentence
        return nearest_sentence(inst.query, text)
    shape = shape_of(inst) if name == "embed" else {}
    if shape.get("kind") == "digits":
        from .lookup_baselines import nearest_code
        return nearest_code(inst.query, text, int(shape["n"]))
    if name in ("lexicon", "embed", "classifier"):
        from .record_baselines import record_answer
        return record_answer(name, inst, text)
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


async def run_baseline(name: str, inst: Instance, seed: int | None = None) -> Result:
    """A baseline's answer as a Result: no model, no tokens, no cost."""
    import asyncio

    from .methods import context_text
    t0 = time.monotonic()
    text = context_text(inst.context)
    answer = await asyncio.to_thread(baseline_answer, name, inst, text, seed)
    return Result(answer=answer, status="final", ready=True, cost_usd=0.0,
                  elapsed_s=round(time.monotonic() - t0, 4))
