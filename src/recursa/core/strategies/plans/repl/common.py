"""REPL side: the helpers every plan's code starts with (sent whole before the plan's own code).

Records from the context, the bound of several maps added up, a retrieval (search() and a read
of each hit, or every chunk filtered) and a labelling of every record. Names start with `_plan`
so the plan's tidy-up takes them out of the REPL again; the results (`plan_read`, `records`,
`plan_labels`, `record_labels`, ...) stay for the root's code.
"""

from __future__ import annotations

import collections
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recursa.core.strategies.plans.repl.names import (
        chunk,
        context,
        llm_filter,
        llm_map,
        llm_query,
        search,
    )

plan_read: list[tuple[str, str]] = []   # (piece, reader's answer) of every read: a retrieval's sources
# set by the functions below (declared for the checkers only: nothing is sent for them)
plan_preamble: list[str]
records: list[str]
plan_labels: list[str]
record_labels: Any


def _plan_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    return json.dumps(c, ensure_ascii=False, default=str, indent=1)


def _plan_records(c: Any) -> list[str]:
    if isinstance(c, list):
        return [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str)
                for x in c]
    if isinstance(c, dict):
        return [f"{k}: {v}" for k, v in c.items()]
    blocks = [b.strip() for b in re.split(r"\n\s*\n", c) if b.strip()]
    lines = [x for x in c.splitlines() if x.strip()]
    # entries separated by blank lines, when most of them span several lines
    if len(blocks) >= 3 and len(lines) >= 1.5 * len(blocks):
        return _plan_body(blocks)
    return _plan_body(lines)


def _plan_body(items: list[str]) -> list[str]:
    # a title or header line before records that all name the same fields is not a record:
    # labelled, it was one more record in every count
    global plan_preamble
    shapes = [tuple(re.findall(r"(?:^|[|;])\s*([A-Za-z][\w ]{0,30}?)\s*[:=]", x))
              for x in items]
    common, n = (collections.Counter(shapes).most_common(1) or [((), 0)])[0]
    k = 0
    if common and n >= 0.8 * len(items):
        while k < min(3, len(items)) and shapes[k] != common:
            k += 1
    plan_preamble = items[:k]
    if k:
        print(f"({k} leading line(s) not in the records' form, left out: {items[0][:80]!r})")
    return items[k:]


def _plan_add(*bounds: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": 0, "tokens": 0, "input_tokens": 0, "output_tokens": 0,
                           "cost_usd": 0.0}
    for b in bounds:
        for k in ("calls", "tokens", "input_tokens", "output_tokens"):
            out[k] += b.get(k, 0)
        out["cost_usd"] = None if out["cost_usd"] is None or b["cost_usd"] is None \
            else out["cost_usd"] + b["cost_usd"]
    return out


# ------------------------------------------------------------------ retrieval
_PLAN_GUESS = ("Write one short sentence, in plain everyday words, that a document answering "
               "this question might contain (invent the details): ")
_PLAN_K, _PLAN_BEFORE, _PLAN_AFTER = 6, 300, 1500
# what one reader reads: about 300 tokens. Given a whole widened window (~900 tokens of a
# legal text) the 1.5B replied "none" for the sentence that held the answer, and given the hit's
# own passage it was right on 7 of 8 dev lookups (issue 34, dev probe 2026-12-06)
_PLAN_PIECE = 320


def _plan_can_search() -> bool:
    try:
        search("probe", k=1)       # no model call; fails without the search extra
        return True
    except Exception:
        return False


def _plan_searched(question: str, keywords: list[str]) -> list[str]:
    # the passages search() ranks first for a sentence the sub-model writes as a made-up answer
    # (HyDE: an answer's words are closer to the passage's than the question's are) and the
    # keywords the question does not already say; each widened, since a passage often starts a
    # section whose facts come later
    guess = llm_query(_PLAN_GUESS + question, max_tokens=60)
    guess = "" if guess.startswith("Error:") else guess
    new = [w for w in keywords if w.lower() not in question.lower()]
    # a guess with no word search() can use ("1": the question said "answer with the number
    # only") finds nothing; the question itself then
    hits = search(" ".join([guess, *new]).strip() or question, k=_PLAN_K) or \
        search(question, k=_PLAN_K)
    spans: dict[Any, list[tuple[int, int]]] = {}
    for h in hits:
        key = h.get("item")
        spans.setdefault(key, []).append((max(0, h["start"] - _PLAN_BEFORE),
                                          h["end"] + _PLAN_AFTER))
    out: list[list[Any]] = []
    for key, ranges in spans.items():
        for a, b in sorted(ranges):   # overlapping windows merged, in text order
            if out and out[-1][0] == key and a <= out[-1][2]:
                out[-1][2] = max(out[-1][2], b)
            else:
                out.append([key, a, b])
    windows = [(context if key is None else _plan_text(context[key]))[a:b] for key, a, b in out]
    return [p for w in windows for p in chunk(w, _PLAN_PIECE)]     # each a short read


def _plan_chunks(keywords: list[str]) -> list[str]:
    pieces = chunk(_plan_text(context))
    if keywords:
        hit = [p for p in pieces if any(re.search(re.escape(k), p, re.I) for k in keywords)]
        pieces = hit or pieces
    return pieces


# a reader's "no answer here" in its own words ("The text does not specify a limit ...")
# ("The steward of this document is none.")
_PLAN_NONE = re.compile(r"(?i)(^|\W)none$|text (does not|doesn't|did not) (say|state|specify|"
                        r"mention|provide|give|include|contain)|not (specified|stated|mentioned)"
                        r"( in the text)?$|\bno (information|mention)\b")

# every part: asked "who ... and what ...", the 1.5B answered with a name alone
_PLAN_READ = (" Answer every part of the question from the text in one short sentence, "
              "or reply 'none' if the text does not say.")


def _plan_retrieve(question: str, keywords: list[str], dry: bool) -> Any:
    # with search(): a made-up answer, a search, and one read of each hit; without: every
    # chunk (or those holding a keyword) filtered by the question, then the relevant ones read
    searched = _plan_can_search()
    if dry:
        if searched:
            window = "x" * (_PLAN_BEFORE + _PLAN_AFTER + 1200)      # a widened passage, at most
            pieces = chunk(window, _PLAN_PIECE) * _PLAN_K
            return _plan_add(llm_map(_PLAN_GUESS, [question], dry_run=True, max_tokens=60),
                             llm_map(question + _PLAN_READ, pieces, dry_run=True))
        cand = _plan_chunks(keywords)
        return _plan_add(llm_filter(question, cand, dry_run=True),
                         llm_map(question + _PLAN_READ, cand, dry_run=True))
    cand = _plan_searched(question, keywords) if searched else _plan_chunks(keywords)
    hits = cand if searched else llm_filter(question, cand)
    answers = llm_map(question + _PLAN_READ, hits) if hits else []
    found = [a for a in answers if a and not _PLAN_NONE.search(a.strip(" .'\""))]
    plan_read.extend((h, a) for h, a in zip(hits, answers, strict=False) if a in found)
    how = "found by search()" if searched else "checked"
    print(f"{len(cand)} pieces {how}, {len(hits)} read; answers: {found}")
    return found


# ------------------------------------------------------------------ labelling every record
# unsaid condition words that make the leaves judge the query's own words: one word more than
# the labels say is most often a synonym or an alternative the labels stand for ("tool" for
# "a tool or a machine"); several are a condition the labels lost
_PLAN_UNSAID_MIN = 2


def _plan_unsaid(words: list[str], labels: list[str], records: list[str]) -> list[str]:
    # the query's condition words neither label says (same first 5 letters) and not in most
    # records (field names and record nouns)
    stems = {w[:5] for x in labels for w in re.findall(r"[a-z]+", x.lower())}
    common = collections.Counter(w[:5] for x in records
                                 for w in set(re.findall(r"[a-z]+", x.lower())))
    out = [w for w in words if w[:5] not in stems and common[w[:5]] < 0.8 * len(records)]
    # a word and its inflections ("reviewers", "reviewed") are one unsaid word
    return out if len({w[:5] for w in out}) >= _PLAN_UNSAID_MIN else []


def _plan_label(question: str, labels: list[str], words: list[str], query_leaf: str,
                dry: bool) -> None:
    # every record labelled with `question` (which names every side). A root that turned a
    # query's condition ("<did X> about <Y>") into the labels "did X" / "did not" counted every
    # record that did X: when the labels leave words of the query's condition unsaid (`words`,
    # less those most records carry, such as field names), each leaf judges `query_leaf`, the
    # query itself, yes or no, mapped back onto the labels
    global records, plan_labels, record_labels
    records = _plan_records(context)
    plan_labels = labels
    unsaid = _plan_unsaid(words, plan_labels, records)
    if unsaid:
        print(f"the labels leave the query's words {unsaid} unsaid: each record is judged "
              "against the query itself")
    got = llm_map(query_leaf if unsaid else question, records,
                  labels=["no", "yes"] if unsaid else plan_labels, dry_run=dry)
    record_labels = got if not unsaid or isinstance(got, dict) else \
        [None if x is None else plan_labels[x == "yes"] for x in got]
