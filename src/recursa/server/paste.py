"""Telling a pasted document from the question in one chat message.

Chat clients put a document and a question into the same user message in a few shapes:

* separate text parts of a content array (Continue, LibreChat, Open WebUI with files);
* a tagged template, `<context>...</context>` + `<user_query>...</user_query>` (Open WebUI's RAG
  template, in the user or the system message);
* fenced blocks with the question outside them ("```path\\n...\\n```\\n\\nquestion", Continue's
  context items, LibreChat's attached text);
* plain text, the question before or after the document, split off by a blank line or a line
  break (curl; `cat log | llm "question"` appends the prompt after stdin).

`split_document` returns the question and the document, or no document when the message is short
or no end of it reads like a question; the caller then uses the whole message as the context.
"""

from __future__ import annotations

import re

SHORT = 1500          # a message this long or shorter is all question
MAX_QUESTION = 2000   # a question split off a document is at most this long

_CONTEXT_TAG = re.compile(r"<context>\s*(.*?)\s*</context>", re.S | re.I)
_QUERY_TAG = re.compile(r"<user_query>\s*(.*?)\s*</user_query>", re.S | re.I)
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$\n?", re.S | re.M)
_CUE = re.compile(
    r"\b(what|which|who|whom|whose|when|where|why|how|is|are|was|were|does|do|did|can|could|"
    r"should|would|will|summari[sz]e|list|find|count|explain|describe|extract|identify|give|"
    r"tell|show|compare|answer|classify|translate|check|please)\b", re.I)
_POINTER = re.compile(r"\b(above|below|following|attached|this (log|file|document|text|"
                      r"report|data|transcript))\b", re.I)
_DATA = re.compile(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d|^\s*[\[{<|]|[=;{}]\s*$", re.M)


def tagged_context(text: str) -> tuple[str | None, str | None]:
    """(question, document) from Open WebUI's RAG template, each None when absent."""
    doc = _CONTEXT_TAG.search(text)
    query = _QUERY_TAG.search(text)
    return (query.group(1).strip() or None if query else None,
            doc.group(1) if doc and doc.group(1).strip() else None)


def _score(q: str) -> int:
    """How much a short piece of text reads like a question or request (data scores below 0)."""
    s = 2 if "?" in q else 0
    if _CUE.match(q.lstrip(" \t-*#>\"'")):
        s += 2
    elif _CUE.search(q[:200]):
        s += 1
    if _POINTER.search(q):
        s += 1
    if _DATA.search(q):
        s -= 2
    if sum(c.isdigit() for c in q) > 0.15 * max(len(q), 1):
        s -= 1
    return s


def _pieces(text: str, sep: str) -> list[tuple[int, int]]:
    """Spans of the non-blank pieces of `text` between matches of `sep`."""
    spans, start = [], 0
    for m in re.finditer(sep, text):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def _ends(text: str) -> tuple[str, str] | None:
    """The best (question, document) with the question at the start or at the end of `text`.

    The question is one to three blank-line-separated paragraphs (enough to take in an intro
    like "Here is my log." before it) or a single line; the most question-like candidate wins.
    The document is the rest of the text, verbatim."""
    best: tuple[int, str, str] | None = None
    for sep, most in ((r"\n[ \t]*\n", 3), (r"\n", 1)):
        spans = _pieces(text, sep)
        for head in (True, False):
            for k in range(1, min(most, len(spans) - 1) + 1):
                q_spans = spans[:k] if head else spans[-k:]
                q = "\n\n".join(text[a:b].strip() for a, b in q_spans)
                if len(q) > MAX_QUESTION:
                    break
                s = _score(q) - (k - 1)        # the fewest paragraphs that make a question
                if s >= 2 and (best is None or s > best[0]):
                    doc = text[spans[k][0]:] if head else text[:spans[-k - 1][1]]
                    best = (s, q, doc)
    return None if best is None else (best[1], best[2])


def split_document(parts: list[str]) -> tuple[str, str | None]:
    """(question, document or None) of a message given as its text parts."""
    parts = [p for p in parts if p.strip()]
    whole = "\n".join(parts)
    if len(whole) <= SHORT:
        return whole.strip(), None
    if len(parts) > 1:
        short = [p.strip() for p in parts if len(p) <= MAX_QUESTION]
        long = [p for p in parts if len(p) > MAX_QUESTION]
        if short and long:
            return "\n".join(short), "\n\n".join(long)
    q, doc = tagged_context(whole)
    if q and doc:
        return q, doc
    fences = list(_FENCE.finditer(whole))
    if fences:
        outside = _FENCE.sub("\n", whole).strip()
        inside = "\n\n".join(f.group(2) for f in fences)
        if outside and len(outside) <= MAX_QUESTION and len(inside) > len(outside):
            return re.sub(r"\n{3,}", "\n\n", outside), inside
    found = _ends(whole)
    if found:
        return found
    return whole.strip(), None
