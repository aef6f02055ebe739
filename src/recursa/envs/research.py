"""DeepDive-style research over a local corpus: BM25 `search` and `open_page` tools.

The corpus and question come from the BrowseComp-Plus-style generator of the evaluation suite
(a multi-hop chain spread over a few documents among hard negatives). The tools are built per
instance, closing over its documents, so concurrent rollouts never share a corpus.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from has in is it its of on or that the this "
                  "to was were which who with what where when how".split())


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class BM25:
    """Okapi BM25 over a dict of documents (k1=1.5, b=0.75), built once per corpus."""

    def __init__(self, docs: dict[str, str], k1: float = 1.5, b: float = 0.75):
        self.ids = list(docs)
        self.k1, self.b = k1, b
        self.tf = [Counter(tokenize(docs[i])) for i in self.ids]
        self.len = [sum(c.values()) for c in self.tf]
        self.avg = sum(self.len) / max(1, len(self.len))
        df: Counter[str] = Counter()
        for c in self.tf:
            df.update(c.keys())
        n = len(self.ids)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    def scores(self, query: str) -> list[tuple[str, float]]:
        terms = tokenize(query)
        out = []
        for i, tf in enumerate(self.tf):
            s = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.len[i] / (self.avg or 1))
            for w in terms:
                f = tf.get(w)
                if f:
                    s += self.idf.get(w, 0.0) * f * (self.k1 + 1) / (f + norm)
            if s > 0:
                out.append((self.ids[i], s))
        out.sort(key=lambda x: -x[1])
        return out


def make_corpus_tools(docs: dict[str, str], page_chars: int = 1500
                      ) -> list[Callable[..., Any]]:
    """search / open_page over `docs` (id -> text whose first line is 'Title: ...')."""
    index = BM25(docs)

    def title_of(doc_id: str) -> str:
        first = docs[doc_id].split("\n", 1)[0]
        return first.removeprefix("Title: ").strip()

    def search(query: str, k: int = 5) -> str:
        """Search the document collection with BM25 keyword ranking.

        Args:
            query: keywords to look for (names, places, things).
            k: how many results to return (at most 10).
        """
        k = max(1, min(10, int(k)))
        hits = index.scores(query)[:k]
        if not hits:
            return "No results."
        lines = []
        for doc_id, score in hits:
            body = docs[doc_id].split("\n", 1)[-1].strip()
            lines.append(f"{doc_id} | {title_of(doc_id)} | score {score:.2f} | {body[:160]}")
        return "\n".join(lines)

    def open_page(doc_id: str, offset: int = 0) -> str:
        """Read a document by its id (as given by search).

        Args:
            doc_id: the document id, e.g. doc-0042.
            offset: character offset to start reading from.
        """
        doc_id = doc_id.strip()
        if doc_id not in docs:
            raise KeyError(f"no document {doc_id!r}")
        text = docs[doc_id]
        offset = max(0, int(offset))
        chunk = text[offset:offset + page_chars]
        more = len(text) - offset - len(chunk)
        return chunk + (f"\n[... {more} more characters; open_page({doc_id!r}, "
                        f"offset={offset + len(chunk)})]" if more > 0 else "")

    return [search, open_page]
