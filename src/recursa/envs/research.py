"""DeepDive-style research over a local corpus: BM25 (bm25s) `search` and `open_page` tools.

The corpus and question come from the BrowseComp-Plus-style generator of the evaluation suite
(a multi-hop chain spread over a few documents among hard negatives). The tools are built per
instance, closing over its documents, so concurrent rollouts never share a corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recursa.core.retrieval import BM25Index


def make_corpus_tools(docs: dict[str, str], page_chars: int = 1500
                      ) -> list[Callable[..., Any]]:
    """search / open_page over `docs` (id -> text whose first line is 'Title: ...')."""
    ids = list(docs)
    index = BM25Index([docs[i] for i in ids])

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
        hits = index.search(query, k)
        if not hits:
            return "No results."
        lines = []
        for hit in hits:
            doc_id, score = ids[hit["id"]], hit["score"]
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
