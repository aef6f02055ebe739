"""BM25 keyword search over a list of passages, on `bm25s` (the bench and the research envs)."""

from __future__ import annotations

from typing import Any

from recursa.base.extras import MissingExtra


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError:
        raise MissingExtra("bench", "BM25 search", module="bm25s") from None
    return bm25s


class BM25Index:
    """Okapi BM25 over `passages`, built once; `search` returns the best k with a score > 0."""

    def __init__(self, passages: list[str]):
        bm25s = _bm25s()
        self.passages = passages
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(passages, stopwords="en", show_progress=False),
                             show_progress=False)

    def search(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """[{"id": passage index, "score": rounded BM25 score, "text": passage}, ...]"""
        bm25s = _bm25s()
        k = max(1, min(int(k), 50, len(self.passages)))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:      # only stopwords / no word characters: nothing to match
            return []
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
        return [{"id": int(i), "score": round(float(s), 3), "text": self.passages[int(i)]}
                for i, s in zip(ids[0], scores[0], strict=True) if float(s) > 0]
