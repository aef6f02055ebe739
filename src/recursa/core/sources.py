"""Answers with verified sources: the passages an answer rests on, found in the context.

The root attaches them in the REPL with `FINAL(answer, sources=[...])` or
`answer["sources"] = [...]`: each a string copied from `context`, or a dict like a `search()`
hit (`{"text", "start", "end", "item"}`). After the run, `check(raw, context, answer)` looks for
every one in the context -- the quote as it stands, then the same words with other spacing, case
or quote marks (an ellipsis in the quote skips text), then a close match (rapidfuzz's partial
alignment) -- and says where it is (`Location`: file, page, line, character span). A source it
cannot find is kept, marked `found=False`, and `Result.sources_verified` is then False.

A long found passage (a whole piece the model read) is narrowed to the line that holds most of
the answer's words, so the location points at the evidence, not at 4,000 characters around it.

The seam for context types is two `functools.singledispatch` functions, defined here for str,
list, tuple, dict and the loaded documents of `recursa.documents` (Document, Part):

- `texts(value)` yields the text leaves of a context value with their address (`item`: the keys
  and indexes from the value down to the text);
- `locate(value, item, start, end)` says where the span [start, end) of the leaf at `item` is:
  a `Location` (the one type `recursa.documents.locate` returns too) with the file, the page /
  sheet / slide, the lines and the offsets.

A Document is a str holding its whole text, so it is one leaf: a quote is found anywhere in it,
and its locator names the page it is on (`report.pdf, page 2, line 3`); in a folder the file is
the document's path there. Another context type registers both for its class:

    @sources.texts.register(Transcript)
    def _(t):
        for i, turn in enumerate(t.turns):
            yield (i,), turn.text

    @sources.locate.register(Transcript)
    def _(t, item, start, end):
        loc = sources.locate(t.turns[item[0]].text, (), start, end)   # its lines
        return dataclasses.replace(loc, item=tuple(item), file=t.name, unit="turn",
                                   number=item[0] + 1)

and the containers around it (a dict of files, a list of documents) compose with it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from recursa.base.types import Location, Source, SourceMatch
from recursa.documents import model as documents
from recursa.documents.model import Document, Part

Key = str | int
Item = tuple[Key, ...]

MAX_SOURCES = 20        # sources checked per answer (the worker keeps as many)
QUOTE_KEEP = 2000       # characters of a quote or passage kept in the Result
FUZZY_MIN_CHARS = 20    # a shorter quote is matched exactly or not at all (it fits anywhere)
FUZZY_PROBE = 1000      # characters of a long quote given to rapidfuzz (its cost grows with it)
FUZZY_SCORE = 85.0      # the lowest partial-alignment score that counts as found
FUZZY_COVER = 0.8       # that much of the probe must be aligned (not a short text inside it)
FOCUS_CHARS = 300       # a found passage longer than this is narrowed to the answer's line
AROUND = 160            # characters of text kept on each side of a passage, for display
GAP = 500               # the most characters an ellipsis in a quote stands for
NOT_FOUND = "not found in the context"

_STOP = frozenset("""the and for with that this from was were are has have had not but its his her
their they them there then than what which who whom whose when where why how into onto over under
about after before also been being can could did does done each few more most other our out own
same she should some such too very will would you your yours answer none unknown""".split())


# ---------------------------------------------------------------- the seam: texts and locate
@functools.singledispatch
def texts(value: Any) -> Iterator[tuple[Item, str]]:
    """The text leaves of a context value with their address; nothing for values without text
    (images, numbers). Register a document type's own."""
    return iter(())


@texts.register
def _texts_str(value: str) -> Iterator[tuple[Item, str]]:
    yield (), value


@texts.register(list)
@texts.register(tuple)
def _texts_seq(value: list[Any] | tuple[Any, ...]) -> Iterator[tuple[Item, str]]:
    for i, v in enumerate(value):
        for item, text in texts(v):
            yield (i, *item), text


@texts.register
def _texts_dict(value: dict) -> Iterator[tuple[Item, str]]:  # type: ignore[type-arg]
    for k, v in value.items():
        for item, text in texts(v):
            yield (k, *item), text


@functools.singledispatch
def locate(value: Any, item: Item, start: int, end: int) -> Location:
    """Where the span [start, end) of the text at `item` inside `value` is. Register a
    document type's own (its page, sheet, name)."""
    raise TypeError(f"recursa.core.sources.locate: no locator for {type(value).__name__}")


@locate.register
def _locate_str(value: str, item: Item, start: int, end: int) -> Location:
    return documents.locate(value, start, end)


# A loaded document (recursa.documents) is a str holding its whole text, so `texts` finds a
# quote anywhere in it; its locator says which page / slide / sheet the span is on, and the line
# there. A Part (`doc.pages[1]`, given as a context by itself) knows its document and number.
@locate.register
def _locate_document(value: Document, item: Item, start: int, end: int) -> Location:
    return documents.locate(value, start, end)


@locate.register
def _locate_part(value: Part, item: Item, start: int, end: int) -> Location:
    return documents.locate_part(value, start, end)


@locate.register(list)
@locate.register(tuple)
def _locate_seq(value: list[Any] | tuple[Any, ...], item: Item, start: int,
                end: int) -> Location:
    child = value[int(item[0])]
    loc = locate(child, item[1:], start, end)
    update: dict[str, Any] = {"item": (item[0], *loc.item)}
    if isinstance(child, dict):     # a record's field names are not a file path
        update["file"] = None
    return replace(loc, **update)


@locate.register
def _locate_dict(value: dict, item: Item, start: int, end: int) -> Location:  # type: ignore[type-arg]
    key = item[0]
    loc = locate(value[key], item[1:], start, end)
    # a directory's key is the file's path, which a document's own name ends (no repeat); an
    # archive's members are under its key
    named = loc.file is None or str(key) == loc.file or str(key).endswith("/" + loc.file)
    file = str(key) if named else f"{key}/{loc.file}"
    return replace(loc, item=(key, *loc.item), file=file)


# ---------------------------------------------------------------- checking an answer's sources
def verdict(sources: list[Source]) -> bool | None:
    """`Result.sources_verified`: None without sources, else whether every one was found."""
    return None if not sources else all(s.found for s in sources)


def warning(sources: list[Source]) -> str | None:
    """One line for a user when a source was not found; None when all were (or none given)."""
    missing = sum(not s.found for s in sources)
    if not missing:
        return None
    if missing == len(sources):
        return (f"none of the answer's {len(sources)} source(s) was found in the context: "
                "the answer is not backed by its quotes")
    return f"{missing} of the answer's {len(sources)} sources were not found in the context"


async def acheck(answer: dict[str, Any], final: str | None, context: Any) -> list[Source]:
    """The sources of a run's answer dict (the REPL's `answer`), checked in a thread (a fuzzy
    search of a large context takes a moment); [] when it gave none."""
    raw = answer.get("sources")
    if not raw:
        return []
    text = final if final is not None else str(answer.get("content") or "")
    return await asyncio.to_thread(check, raw, context, text)


def check(raw: Any, context: Any, answer: str = "") -> list[Source]:
    """Every source in `raw` (a str, a dict, or a list of them) looked up in `context` (what
    the run was given: str, list, dict, a Path, or a type registered with `texts`/`locate`).
    `answer` is the answer's text, used to narrow long passages. Never raises: a context that
    cannot be read leaves every source unfound, with a note saying why."""
    given = _given(raw)
    if not given:
        return []
    try:
        value = _value_of(context)
        units = list(texts(value))
    except Exception as e:   # noqa: BLE001 - a failed check is reported on each source
        why = f"the context could not be read to check it: {type(e).__name__}: {e}"
        return [Source(quote=_cut(q), note=why) for q, _ in given]
    out = []
    for quote, hint in given:
        try:
            out.append(_check_one(quote, hint, value, units, answer))
        except Exception as e:   # noqa: BLE001 - a locator that fails marks its source only
            out.append(Source(quote=_cut(quote),
                              note=f"could not be checked: {type(e).__name__}: {e}"))
    return out


def _given(raw: Any) -> list[tuple[str, dict[str, Any]]]:
    """(quote, hint) pairs: a hint is what a dict source says besides its text (start, end,
    item), e.g. a search() hit."""
    if raw is None:
        return []
    items = raw if isinstance(raw, list | tuple) else [raw]
    out: list[tuple[str, dict[str, Any]]] = []
    for x in items[:MAX_SOURCES]:
        if isinstance(x, dict):
            text = x.get("text", x.get("quote", ""))
            out.append((text if isinstance(text, str) else str(text),
                        {k: x[k] for k in ("start", "end", "item") if k in x}))
        else:
            out.append((x if isinstance(x, str) else str(x), {}))
    return out


def _value_of(context: Any) -> Any:
    """The context as the model saw it: a Path, also one inside a dict or list (several files
    given as one context), is loaded again (only when there are sources to check, so a large
    folder is not kept in memory for the whole run)."""
    if isinstance(context, os.PathLike):
        from recursa.core.context import load_path
        return load_path(Path(context))[0]
    if isinstance(context, dict | list | tuple):
        from recursa.core.context import load_inner_paths
        return load_inner_paths(context)
    if isinstance(context, bytes | bytearray):
        return bytes(context).decode("utf-8", errors="replace")
    return context


def _cut(text: str) -> str:
    return text if len(text) <= QUOTE_KEEP else \
        text[:QUOTE_KEEP] + f" … [{len(text) - QUOTE_KEEP:,} more characters]"


def _check_one(quote: str, hint: dict[str, Any], value: Any, units: list[tuple[Item, str]],
               answer: str) -> Source:
    if not units:
        return Source(quote=_cut(quote), note="the context holds no text to find it in")
    leaves = dict(units)
    hit = _at_hint(quote, hint, leaves)
    if hit is None and not quote.strip():
        return Source(quote=quote, note="an empty quote is not a source")
    if hit is None:
        hit = _find(quote, _hinted_first(units, hint))
    if hit is None:
        short = len(quote.strip()) < FUZZY_MIN_CHARS
        return Source(quote=_cut(quote), note=NOT_FOUND + (
            f" (a quote under {FUZZY_MIN_CHARS} characters must match exactly)" if short else ""))
    item, start, end, match, score = hit
    text = leaves[item]
    note = None
    s, e = _focus(text, start, end, answer)
    if (s, e) != (start, end):
        note = f"narrowed to the line holding the answer, from a {end - start:,}-character passage"
        start, end = s, e
    return Source(quote=_cut(quote), found=True, match=match, score=round(score, 1),
                  text=_cut(text[start:end]), location=locate(value, item, start, end),
                  before=text[max(0, start - AROUND):start], after=text[end:end + AROUND],
                  note=note)


def _hint_item(hint: dict[str, Any]) -> Item | None:
    if "item" not in hint:
        return None
    it = hint["item"]
    return tuple(it) if isinstance(it, list | tuple) else (it,)


def _at_hint(quote: str, hint: dict[str, Any], leaves: dict[Item, str]
             ) -> tuple[Item, int, int, SourceMatch, float] | None:
    """A source that gives its span (a search() hit): found there when the text there is the
    quote (or the quote is empty: the span is the source)."""
    start, end = hint.get("start"), hint.get("end")
    if not (isinstance(start, int) and isinstance(end, int)) or not 0 <= start < end:
        return None
    item = _hint_item(hint) or ()
    text = leaves.get(item)
    if text is None or end > len(text):
        return None
    if not quote.strip() or text[start:end] == quote:
        return item, start, end, "exact", 100.0
    return None


def _hinted_first(units: list[tuple[Item, str]], hint: dict[str, Any]
                  ) -> list[tuple[Item, str]]:
    want = _hint_item(hint)
    if want is None:
        return units
    first = [u for u in units if u[0][:len(want)] == want]
    return first + [u for u in units if u[0][:len(want)] != want] if first else units


def _find(quote: str, units: list[tuple[Item, str]]
          ) -> tuple[Item, int, int, SourceMatch, float] | None:
    """Exact, then normalized, then fuzzy; the first unit that has it (the best for fuzzy)."""
    for q in dict.fromkeys((quote, quote.strip())):
        for item, text in units:
            i = text.find(q)
            if i >= 0:
                return item, i, i + len(q), "exact", 100.0
    pattern = _loose_pattern(quote)
    if pattern is not None:
        for item, text in units:
            m = pattern.search(text)
            if m:
                return item, m.start(), m.end(), "normalized", 100.0
    return _fuzzy(quote.strip(), units)


_QUOTE_MARKS = {c: "[\"\u201c\u201d\u201e\u00ab\u00bb]" for c in "\"\u201c\u201d\u201e\u00ab\u00bb"}
_QUOTE_MARKS.update({c: "['\u2018\u2019\u201a`]" for c in "'\u2018\u2019\u201a`"})
_QUOTE_MARKS.update({c: "[-\u2010\u2011\u2012\u2013\u2014]" for c in "-\u2010\u2011\u2012\u2013\u2014"})


def _loose_pattern(quote: str) -> re.Pattern[str] | None:
    """The quote's words in order, any whitespace between them, any case, any quote mark or
    dash; an ellipsis ("..." or "…") stands for up to GAP characters."""
    parts = []
    for part in re.split(r"\s*(?:\.\.\.|\u2026)\s*", quote.strip()):
        words = part.split()
        if words:
            parts.append(r"\s+".join("".join(_QUOTE_MARKS.get(c) or re.escape(c) for c in w)
                                     for w in words))
    if not parts:
        return None
    return re.compile(f"[\\s\\S]{{0,{GAP}}}?".join(parts), re.IGNORECASE)


def _fuzzy(quote: str, units: list[tuple[Item, str]]
           ) -> tuple[Item, int, int, SourceMatch, float] | None:
    if len(quote) < FUZZY_MIN_CHARS:
        return None
    from rapidfuzz import fuzz
    # a long quote: its middle stands for it, and the found span is widened by what was left out
    lead = max(0, (len(quote) - FUZZY_PROBE) // 2)
    probe = quote[lead:lead + FUZZY_PROBE]
    best: tuple[Item, int, int, SourceMatch, float] | None = None
    for item, text in units:
        cutoff = best[4] if best is not None else FUZZY_SCORE
        r = fuzz.partial_ratio_alignment(probe, text, score_cutoff=cutoff)
        if r is None or (r.src_end - r.src_start) < FUZZY_COVER * len(probe):
            continue
        if best is None or r.score > best[4]:
            start = max(0, r.dest_start - lead)
            end = min(len(text), r.dest_end + (len(quote) - lead - len(probe)))
            best = (item, start, end, "fuzzy", r.score)
            if r.score >= 100.0:
                break
    if best is not None and not lead:
        item, start, end, _, score = best
        start, end, score = _refine(quote, dict(units)[item], start, end, score)
        best = (item, start, end, "fuzzy", score)
    return best


def _refine(quote: str, text: str, start: int, end: int, score: float
            ) -> tuple[int, int, float]:
    """The span near [start, end) whose text is closest to the quote, from word boundary to
    word boundary (a partial alignment is as long as the quote, so a quote with a letter
    missing ends a letter early)."""
    from rapidfuzz import fuzz
    margin = max(8, len(quote) // 5)
    lo, hi = max(0, start - margin), min(len(text), end + margin)

    def at_start(i: int) -> bool:
        return not text[i].isspace() and (i == 0 or text[i - 1].isspace() or
                                          (text[i].isalnum() and not text[i - 1].isalnum()))

    def at_end(j: int) -> bool:
        return not text[j - 1].isspace() and (j == len(text) or text[j].isspace() or
                                              (text[j - 1].isalnum() and not text[j].isalnum()))
    starts = [i for i in range(lo, min(hi, start + margin)) if at_start(i)][:40]
    ends = [j for j in range(max(lo + 1, end - margin), hi + 1) if at_end(j)][-40:]
    best = (start, end, score)
    best_ratio = -1.0
    for i in starts:
        for j in ends:
            if j - i < len(quote) // 2:
                continue
            r = fuzz.ratio(quote, text[i:j], score_cutoff=best_ratio)
            if r > best_ratio:
                best, best_ratio = (i, j, r), r
    return best


_WORD = re.compile(r"\w+")


def _focus(text: str, start: int, end: int, answer: str) -> tuple[int, int]:
    """A long passage narrowed to the line in it holding most of the answer's words (a long
    line: the FOCUS_CHARS around the first of them); unchanged when none is there."""
    if end - start <= FOCUS_CHARS:
        return start, end
    words = {w for w in _WORD.findall(answer.lower())
             if (len(w) >= 3 or w.isdigit()) and w not in _STOP}
    if not words or len(words) > 60:
        return start, end
    best, best_n = None, 0
    pos = start
    for line in text[start:end].splitlines(keepends=True):
        found = words & set(_WORD.findall(line.lower()))
        if len(found) > best_n:
            best, best_n = (pos, pos + len(line)), len(found)
        pos += len(line)
    if best is None:
        return start, end
    s, e = best
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    if e - s > 2 * FOCUS_CHARS:     # one long line: the part around the answer's first word
        low = text[s:e].lower()
        first = min((m.start() for w in words for m in [re.search(rf"\b{re.escape(w)}\b", low)]
                     if m), default=0)
        s, e = s + max(0, first - FOCUS_CHARS // 2), min(e, s + first + FOCUS_CHARS // 2)
    return s, e


def render(sources: list[Source], width: int = 300) -> str:
    """The sources as plain text for a terminal (`recursa run --sources`): one numbered entry
    each, its location and how it was found, then the passage (or the quote, when unfound)."""
    if not sources:
        return "Sources: none (the answer gave no sources)"
    lines = ["Sources:"]
    for i, s in enumerate(sources, 1):
        if s.found and s.location is not None:
            head = f"[{i}] {s.location.label} ({s.match}" + \
                (f", score {s.score:g}" if s.match == "fuzzy" else "") + ")"
            body = s.text or ""
        else:
            why = (s.note or "").removeprefix(NOT_FOUND).strip()
            head = f"[{i}] NOT FOUND in the context" + (f" {why}" if why else "")
            body = s.quote
        body = " ".join(body.split())
        lines += [head, "    " + (body if len(body) <= width else body[:width] + " …")]
    return "\n".join(lines)
