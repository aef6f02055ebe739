"""Hybrid passage search over a context: BM25 and static word embeddings, fused by rank.

A context (a str, or a list / dict of items) is cut into passages of about `passage_tokens`
tokens that end on sentence or line boundaries and overlap by about `overlap_tokens`. A query
is ranked two ways and the two rankings are fused (reciprocal rank fusion):

- words: Okapi BM25 (bm25s) over the passages' lower-cased content words;
- meaning: the cosine between the query and each sentence of a passage, the passage taking its
  best sentence (a needle is one sentence: averaged over a whole passage it would drown).
  A sentence's vector is the IDF-weighted sum of its content words' WordLlama vectors (static
  token embeddings, a 16 MB matrix bundled in its PyPI wheel: CPU-cheap and offline).

Speed: each distinct word of the context is tokenized and embedded once; a sentence's vector
is the sum of its words' vectors (numpy reductions over blocks), so indexing costs one regex
pass, one dict lookup per word and one BPE pass over the vocabulary, not a tokenizer pass over
the whole text. `benchmarks/bench_search.py` measures it; docs/search.md has the figures.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Protocol

from recursa.base.extras import MissingExtra

PASSAGE_TOKENS = 256     # a few hundred tokens: a sub-model reads a dozen hits at once
OVERLAP_TOKENS = 48      # about one or two sentences shared with the passage before
MAX_UNIT_CHARS = 600     # a longer sentence / line is cut at a space
MIN_UNIT_CHARS = 40      # a shorter one joins the next (a lone "Yes." embeds as noise)
# Reciprocal rank fusion's constant. The usual 60 suits many rankings of like quality; here one
# of two is often blind (BM25 on a paraphrase scores the needle 0), and with a large constant
# passages that are middling in both lists beat the other list's clear winner. A small one
# keeps each list's first hits near the top (close to interleaving the two) while a passage
# high in both still rises. docs/search.md gives the figures (and how 3 was chosen).
RRF_K = 3
# "hybrid" adds the contextual ranking up to this many sentences (~50k tokens, ~20 s of
# encoding on a 2-core machine before the first search answers, twice that on one half as
# fast): above it the default stays cheap (docs/search.md); mode="contextual" still can.
HYBRID_CONTEXTUAL_MAX_UNITS = 2000
FUSE_DEPTH = 100         # each ranking contributes its best this many passages
EMBED_DIM = 256
_BLOCK_ROWS = 4096       # vectors gathered at once when summing them (cache-sized)

Mode = Literal["hybrid", "bm25", "semantic", "contextual"]
MODES = ("hybrid", "bm25", "semantic", "contextual")
Ranking = Literal["bm25", "semantic", "contextual"]

# bm25s's own default token pattern: words of two or more word characters
_WORD = re.compile(r"\w\w+")
# a unit ends at a line break, or after . ! ? (and closing quotes / brackets) before a space;
# the match takes the whitespace after it. It starts with a character class, which re scans
# for quickly (a leading \s* would be tried at every space of the text).
_BREAK = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+|\n\s*")
_IMAGE_MARK = "__recursa_image__"   # images travel as such dicts (sandbox/worker.py)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise MissingExtra("search", "semantic search", module="numpy") from None
    return numpy


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError:
        raise MissingExtra("search", "semantic search", module="bm25s") from None
    return bm25s


# ---------------------------------------------------------------- the embedding model
class WordEmbedder(Protocol):
    """Static embeddings: a word's vector does not depend on its neighbours."""

    dim: int

    def word_vectors(self, words: Sequence[str]) -> tuple[Any, Any]:
        """(sums, counts): per word, the sum of its token vectors (row i of a (words, dim)
        array) and its number of tokens."""
        ...


class WordLlamaEmbedder:
    """WordLlama's default model (l2_supercat, 256 dims), loaded from the files in its wheel.

    Never downloads: the weights and tokenizer ship in the wheel, and `disable_download` makes
    a missing file an error instead of a request to the Hugging Face Hub."""

    def __init__(self, dim: int = EMBED_DIM) -> None:
        """`dim`: 256, or a prefix of it (64, 128: Matryoshka-trained, so a prefix is a
        smaller model of its own)."""
        np = _numpy()
        wordllama = _import_wordllama()
        from pathlib import Path
        # The wheel keeps the tokenizer in wordllama/tokenizers/ but WordLlama.load looks for
        # it in wordllama/tokenizer/ first; as cache_dir, the package directory is where both
        # files are found (weights/ and tokenizers/), so nothing is fetched or written.
        here = Path(wordllama.__file__).parent
        model = wordllama.WordLlama.load(cache_dir=here, dim=EMBED_DIM, disable_download=True)
        self.matrix = np.ascontiguousarray(model.embedding[:, :dim], dtype=np.float32)
        self.tokenizer = model.tokenizer
        self.tokenizer.no_padding()      # this instance is ours: one word, no pad tokens
        self.dim = int(self.matrix.shape[1])

    def word_vectors(self, words: Sequence[str]) -> tuple[Any, Any]:
        np = _numpy()
        n = len(words)
        if not n:
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.float32)
        # one pre-tokenized sequence: each word is BPE-encoded on its own (with its leading
        # space marker, as inside a sentence) and `word_ids` says which word a token belongs to
        enc = self.tokenizer.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        ids = np.asarray(enc.ids, dtype=np.int64)
        owner = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
        keep = owner >= 0
        ids, owner = ids[keep], owner[keep]
        sums = group_sums(np, rows_of(self.matrix, ids), owner, n, self.dim)
        return sums, np.bincount(owner, minlength=n).astype(np.float32)


def rows_of(table: Any, index: Any) -> Any:
    """`rows(lo, hi)` for group_sums: the rows of `table` named by index[lo:hi]."""
    return lambda lo, hi: table[index[lo:hi]]


def group_sums(np: Any, rows: Any, owner: Any, n: int, dim: int) -> Any:
    """out[g] = the sum of the rows whose `owner` is g (owner sorted ascending), for g < n.

    `rows(lo, hi)` gives rows lo..hi, made block by block (_BLOCK_ROWS at a time, a few MB,
    so the gather and the reduction stay in cache and memory stays bounded whatever the
    number of rows). A group with no rows is 0."""
    out = np.zeros((n, dim), dtype=np.float32)
    for lo in range(0, len(owner), _BLOCK_ROWS):
        hi = min(lo + _BLOCK_ROWS, len(owner))
        o = owner[lo:hi]
        starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        # owners are unique within a block; a group cut by a block edge is added twice
        out[o[starts]] += np.add.reduceat(rows(lo, hi), starts, axis=0)
    return out


def _import_wordllama() -> Any:
    """Import wordllama, undoing the root-logger set-up its import does.

    wordllama.inference calls logging.basicConfig(level=INFO) at import time, which would give
    the host's root logger a handler and a level it never asked for (and print other libraries'
    log lines); a library import must not change process-wide state, so it is put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    except ImportError:
        raise MissingExtra("search", "semantic search", module="wordllama") from None
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return wordllama


@cache
def default_embedder() -> WordEmbedder:
    """The process's one WordLlama model (16 MB; ~0.5 s to load), loaded on first use."""
    return WordLlamaEmbedder()


# ---------------------------------------------------------------- cutting the context
def documents(context: Any) -> list[tuple[int | str | None, str]]:
    """[(item, text)]: the whole text for a str context (item None), one entry per item of a
    list (its index) or dict (its key). A non-str item is searched as its JSON text, so the
    positions of its hits index `json.dumps(item, ensure_ascii=False)`; images are left out."""
    if isinstance(context, str):
        return [(None, context)]
    if isinstance(context, list):
        pairs: list[tuple[int | str | None, Any]] = list(enumerate(context))
    elif isinstance(context, dict):
        pairs = [(str(k), v) for k, v in context.items()]
    else:
        raise TypeError(f"search indexes a str, list or dict context, not "
                        f"{type(context).__name__}")
    out: list[tuple[int | str | None, str]] = []
    for key, value in pairs:
        if isinstance(value, str):
            out.append((key, value))
        elif not (isinstance(value, dict) and _IMAGE_MARK in value):
            out.append((key, json.dumps(value, ensure_ascii=False, default=str)))
    return out


def units(text: str) -> list[tuple[int, int]]:
    """Sentence / line spans (start, end) of `text`, without the whitespace between them:
    pieces shorter than MIN_UNIT_CHARS join the next (a short last one joins the one before),
    longer than MAX_UNIT_CHARS are cut at the last space before the limit (or hard at it)."""
    spans: list[tuple[int, int]] = []
    pos = len(text) - len(text.lstrip())
    for m in _BREAK.finditer(text, pos):
        end = m.end(1) if m.start(1) >= 0 else m.start()
        if end > pos:
            spans.append((pos, end))
        pos = m.end()
    end = len(text.rstrip())
    if end > pos:
        spans.append((pos, end))
    out: list[tuple[int, int]] = []
    start: int | None = None          # where a run of short pieces began
    for s, e in spans:
        s = s if start is None else start
        if e - s < MIN_UNIT_CHARS:
            start = s
            continue
        start = None
        while e - s > MAX_UNIT_CHARS:
            cut = text.rfind(" ", s + MIN_UNIT_CHARS, s + MAX_UNIT_CHARS)
            cut = cut if cut > 0 else s + MAX_UNIT_CHARS
            out.append((s, cut))
            s = cut
            while s < e and text[s].isspace():
                s += 1
        if e > s:
            out.append((s, e))
    if start is not None:
        end = spans[-1][1]
        if out and end - out[-1][0] <= MAX_UNIT_CHARS:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def unit_tokens(text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """The spans' token estimates, as budgets count them (recursa.core.dispatch.text_tokens: ~4
    ASCII characters a token, about one a character for other scripts)."""
    if text.isascii():
        return [(e - s + 3) // 4 for s, e in spans]
    from recursa.core.dispatch import text_tokens
    return [text_tokens(text[s:e]) for s, e in spans]


def passages(tokens: Sequence[int], passage_tokens: int = PASSAGE_TOKENS,
             overlap_tokens: int = OVERLAP_TOKENS) -> list[tuple[int, int]]:
    """Group consecutive units (their token counts given) into passages [(first, stop)]: up to
    `passage_tokens` each (a longer unit alone), the next starting with the last units of the
    one before that fit in `overlap_tokens`."""
    out: list[tuple[int, int]] = []
    n = len(tokens)
    a = 0
    while a < n:
        b, total = a + 1, tokens[a]
        while b < n and total + tokens[b] <= passage_tokens:
            total += tokens[b]
            b += 1
        out.append((a, b))
        if b >= n:
            break
        nxt, shared = b, 0
        while nxt - 1 > a and shared + tokens[nxt - 1] <= overlap_tokens:
            nxt -= 1
            shared += tokens[nxt]
        a = nxt
    return out


# ---------------------------------------------------------------- the index
@dataclass(frozen=True)
class Passage:
    item: int | str | None   # list index / dict key; None for a str context
    start: int               # char offsets into the item's text (the str context itself)
    end: int


class SentenceEncoder(Protocol):
    """Contextual embeddings: a whole sentence in, one vector out (recursa.core.contextual)."""

    def encode(self, texts: list[str], *, remember: bool = True) -> Any:
        """Unit vectors, one row per text."""
        ...


class SemanticIndex:
    """Passages of a context, searchable by words (BM25), meaning (embeddings) or both."""

    def __init__(self, context: Any, *, passage_tokens: int = PASSAGE_TOKENS,
                 overlap_tokens: int = OVERLAP_TOKENS, embedder: WordEmbedder | None = None,
                 encoder: SentenceEncoder | None = None):
        if passage_tokens < 1 or not 0 <= overlap_tokens < passage_tokens:
            raise ValueError("need passage_tokens >= 1 and 0 <= overlap_tokens < passage_tokens")
        np, bm25s = _numpy(), _bm25s()
        from bm25s.stopwords import STOPWORDS_EN
        self.embedder = embedder or default_embedder()
        self.docs = documents(context)
        self.tokens = 0

        # 1. units (sentences / lines) and their words, as ids into one vocabulary
        all_words: list[str] = []
        bounds = [0]                     # unit u's words: all_words[bounds[u]:bounds[u + 1]]
        spans: list[tuple[int, int]] = []
        plist: list[tuple[int, int]] = []      # passages as unit ranges [first, stop)
        pdoc: list[int] = []
        units_per_doc: list[int] = []
        for d, (_, text) in enumerate(self.docs):
            us = units(text)
            units_per_doc.append(len(us))
            first = len(spans)
            for s, e in us:
                all_words += _WORD.findall(text, s, e)
                bounds.append(len(all_words))
            spans += us
            toks = unit_tokens(text, us)
            self.tokens += sum(toks)
            for a, b in passages(toks, passage_tokens, overlap_tokens):
                plist.append((first + a, first + b))
                pdoc.append(d)
        self.passages = [Passage(self.docs[d][0], spans[a][0], spans[b - 1][1])
                         for (a, b), d in zip(plist, pdoc, strict=True)]
        self._pdoc = pdoc
        self._spans = spans
        self._udoc = np.repeat(np.arange(len(self.docs), dtype=np.int64), units_per_doc)
        self._encoder = encoder
        self._ctx_lock = threading.Lock()
        self._ctx_vecs: Any = None        # (units, 384): the contextual ranking, made on first use
        self._first = np.asarray([a for a, _ in plist], dtype=np.int64)
        self._stop = np.asarray([b for _, b in plist], dtype=np.int64)
        words = list(dict.fromkeys(all_words))          # the vocabulary, first seen first
        vocab = {w: i for i, w in enumerate(words)}
        wid = np.fromiter(map(vocab.__getitem__, all_words), dtype=np.int64,
                          count=len(all_words))
        del all_words
        ubound = np.asarray(bounds, dtype=np.int64)
        self._worded = np.flatnonzero(np.diff(ubound) > 0)   # units with a word: encoded

        # 2. content words: lower-cased, stopwords out (for BM25 and for the embeddings)
        stop = frozenset(STOPWORDS_EN)
        lower: dict[str, int] = {}
        to_lower = np.full(len(words), -1, dtype=np.int64)
        for i, w in enumerate(words):
            lw = w.lower()
            if lw not in stop:
                to_lower[i] = lower.setdefault(lw, len(lower))
        lid = to_lower[wid]
        content = lid >= 0

        # 3. sentence vectors: the IDF-weighted sum of their content words' vectors (a word
        # rare in this context says more about a sentence's topic), normalised
        owner = np.repeat(np.arange(len(spans), dtype=np.int64), np.diff(ubound))[content]
        cw = wid[content]
        self._lower = lower
        self._max_idf = float(np.log1p(max(1, len(spans))))    # a word the context lacks
        self.idf = np.zeros(len(lower), dtype=np.float32)
        if len(cw):   # by occurrences, not sentences (a word seldom repeats in one sentence)
            df = np.bincount(lid[content], minlength=len(lower))
            self.idf = np.log1p(len(spans) / np.maximum(df, 1)).astype(np.float32)
        sums, _ = self.embedder.word_vectors(words)
        sums *= np.where(to_lower >= 0, self.idf[np.maximum(to_lower, 0)], 0)[:, None]
        vecs = group_sums(np, rows_of(sums, cw), owner, len(spans), self.embedder.dim)
        del sums, owner, cw                # the build's largest temporaries, before BM25's
        norms = np.linalg.norm(vecs, axis=1)
        vecs /= np.where(norms > 0, norms, 1.0)[:, None]
        self.unit_vecs = vecs              # (units, dim), unit length (0: no content word)

        # 4. BM25 over each passage's content words
        self.bm25: Any = None
        if lower:
            corpus = [lid[ubound[a]:ubound[b]] for a, b in plist]
            self.bm25 = bm25s.BM25()
            self.bm25.index(bm25s.tokenization.Tokenized(
                ids=[c[c >= 0].tolist() for c in corpus], vocab=lower), show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def text(self, i: int) -> str:
        """Passage i's text."""
        p = self.passages[i]
        return self.docs[self._pdoc[i]][1][p.start:p.end]

    # ------------------------------------------------------------ queries
    def search(self, query: str, k: int = 5, mode: Mode = "hybrid") -> list[dict[str, Any]]:
        """The best `k` passages for `query`: [{"id", "score", "text", "start", "end"}, plus
        "item" (list index / dict key) for list and dict contexts], best first.

        mode "bm25": words only; "semantic": meaning by static word vectors; "contextual":
        meaning by a sentence encoder (the `contextual` extra); "hybrid": the rankings of
        `hybrid_rankings()`, fused by reciprocal rank. An empty query or context gives []."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        k = max(1, min(int(k), FUSE_DEPTH))
        query = str(query)
        if not self.passages or not query.strip():
            return []
        return [self._hit(i, s) for i, s in self.rank(query, mode)[:k]]

    def hybrid_rankings(self) -> tuple[Ranking, ...]:
        """What "hybrid" fuses: BM25 and the static vectors, plus the contextual encoder when
        its extra is installed and the context has at most HYBRID_CONTEXTUAL_MAX_UNITS
        sentences (encoding costs ~20 ms a sentence on one core: docs/search.md)."""
        from recursa.core import contextual
        if (self._encoder is not None or contextual.available()) and \
                len(self._spans) <= HYBRID_CONTEXTUAL_MAX_UNITS:
            return ("bm25", "semantic", "contextual")
        return ("bm25", "semantic")

    def rank(self, query: str, mode: Mode = "hybrid") -> list[tuple[int, float]]:
        """[(passage id, score)], best first: each ranking's best FUSE_DEPTH passages with a
        score above 0 (hybrid: their union, scored by reciprocal rank fusion)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode == "hybrid":
            return self.fuse(query, self.hybrid_rankings())
        return self.fuse(query, (mode,))

    def fuse(self, query: str, rankings: Sequence[Ranking]) -> list[tuple[int, float]]:
        """[(passage id, score)] of these rankings: one alone keeps its own scores; two or
        more are fused by reciprocal rank (each contributing its best FUSE_DEPTH)."""
        np = _numpy()
        score_of = {"bm25": self.bm25_scores, "semantic": self.semantic_scores,
                    "contextual": self.contextual_scores}
        lists = [score_of[r](query) for r in rankings]
        if len(lists) == 1:
            scores = lists[0]
            return [(int(i), float(scores[i])) for i in _top(np, scores, FUSE_DEPTH)]
        fused: dict[int, float] = {}
        for scores in lists:
            for r, i in enumerate(_top(np, scores, FUSE_DEPTH)):
                fused[int(i)] = fused.get(int(i), 0.0) + 1.0 / (RRF_K + r + 1)
        return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))

    def bm25_scores(self, query: str) -> Any:
        """BM25 score of every passage (0: no query word in it)."""
        np = _numpy()
        bm25 = self.bm25
        ids = [] if bm25 is None else \
            bm25.get_tokens_ids([w.lower() for w in _WORD.findall(query)])
        if bm25 is None or not ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        return np.asarray(bm25.get_scores(ids), dtype=np.float32)

    def semantic_scores(self, query: str) -> Any:
        """Per passage, the cosine between the query and the passage's closest sentence."""
        np = _numpy()
        q = self.query_vector(query)
        if q is None or not self.passages:
            return np.zeros(len(self.passages), dtype=np.float32)
        return self._best_unit(np, self.unit_vecs @ q)

    def contextual_scores(self, query: str) -> Any:
        """Per passage, the cosine between the query and the passage's closest sentence, both
        embedded by the contextual encoder (the sentences once per index, on first use)."""
        np = _numpy()
        if not self.passages or not _WORD.search(query):
            return np.zeros(len(self.passages), dtype=np.float32)
        vecs = self.contextual_vectors()
        q = self._sentence_encoder().encode([query], remember=False)[0]
        return self._best_unit(np, vecs @ q.astype(np.float32))

    def contextual_vectors(self) -> Any:
        """(units, 384) unit vectors of every sentence (0 for one without a word, as in the
        static ranking); encoded on the first call (the cost of the contextual ranking: seconds
        per hundred sentences on a busy 2-core machine: docs/search.md), under a lock."""
        np = _numpy()
        with self._ctx_lock:
            if self._ctx_vecs is None:
                texts = [self.docs[int(self._udoc[u])][1][slice(*self._spans[u])]
                         for u in self._worded]
                vecs = np.zeros((len(self._spans), 384), dtype=np.float32)
                if texts:
                    vecs[self._worded] = self._sentence_encoder().encode(texts, remember=False)
                self._ctx_vecs = vecs
            return self._ctx_vecs

    def _sentence_encoder(self) -> SentenceEncoder:
        if self._encoder is None:
            from recursa.core.contextual import encoder
            self._encoder = encoder()
        return self._encoder

    def _best_unit(self, np: Any, unit_scores: Any) -> Any:
        """Per passage, the best of its units' scores."""
        sims = np.append(unit_scores, np.float32(-1.0))   # a sentinel past the end
        # max over each passage's units [first, stop): reduceat over (first, stop) pairs
        edges = np.stack([self._first, self._stop], axis=1).ravel()
        return np.maximum.reduceat(sims, edges)[::2]

    def query_vector(self, query: str) -> Any:
        """The query's normalised vector over its content words (all its words if it has only
        stopwords); None when it has no words."""
        np = _numpy()
        from bm25s.stopwords import STOPWORDS_EN
        words = _WORD.findall(query)
        content = [w for w in words if w.lower() not in STOPWORDS_EN] or words
        if not content:
            return None
        sums, _ = self.embedder.word_vectors(content)
        weight = [self.idf[self._lower[w.lower()]] if w.lower() in self._lower
                  else self._max_idf for w in content]
        v = np.asarray(weight, dtype=np.float32) @ sums
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else None

    def _hit(self, i: int, score: float) -> dict[str, Any]:
        p = self.passages[i]
        hit: dict[str, Any] = {"id": i, "score": round(score, 4), "text": self.text(i),
                               "start": p.start, "end": p.end}
        if p.item is not None:
            hit["item"] = p.item
        return hit


def _top(np: Any, scores: Any, n: int) -> Any:
    """Indices of the n best positive scores (semantic: above -1), best first, ties by index."""
    n = min(n, len(scores))
    idx = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
    idx = idx[np.lexsort((idx, -scores[idx]))]
    return idx[scores[idx] > 0]
