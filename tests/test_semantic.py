"""recursa.core.semantic: cutting a context into passages, positions of hits, rank fusion, contexts
of every shape, offline loading and the missing-extra error (the real WordLlama model)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# find_spec, not importorskip: importing wordllama outside recursa's guard would configure
# the root logger (recursa.core.semantic._import_wordllama)
if not all(importlib.util.find_spec(m) for m in ("wordllama", "bm25s")):
    pytest.skip("needs the search extra: pip install 'recursa[search]'", allow_module_level=True)

from recursa.base.extras import MissingExtra  # noqa: E402
from recursa.core import semantic  # noqa: E402
from recursa.core.semantic import (  # noqa: E402
    MAX_UNIT_CHARS,
    RRF_K,
    SemanticIndex,
    passages,
    units,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")

TEXT = "\n".join([
    "The harbour of the old town was rebuilt after the great storm of 1887.",
    "Fishermen moved their boats to the northern pier. Trade slowly came back!",
    "Short line.",
    "",
    "Astronomers at the observatory measured the orbit of a faint comet for three winters.",
    "The telescope, a gift from a merchant, still stands on the hill above the library.",
] * 40)


@pytest.fixture(scope="module")
def index() -> SemanticIndex:
    return SemanticIndex(TEXT, passage_tokens=64, overlap_tokens=16)


# ---------------------------------------------------------------- cutting
def test_units_are_stripped_sentences_and_lines():
    text = "  First sentence here, long enough to stand alone.  Second one? Yes!\n\nThird line" \
           " that is also long enough to be a unit.\n  "
    spans = units(text)
    pieces = [text[s:e] for s, e in spans]
    assert pieces == ["First sentence here, long enough to stand alone.",
                      "Second one? Yes!\n\nThird line that is also long enough to be a unit."]
    for s, e in spans:
        assert text[s:e] == text[s:e].strip()


def test_long_units_are_cut_at_spaces_and_short_tail_joins():
    word = "abcdefghi "
    text = word * 200 + "\nend."
    spans = units(text)
    assert all(e - s <= MAX_UNIT_CHARS for s, e in spans)
    assert all(text[s] != " " and text[e - 1] != " " for s, e in spans)
    # every non-space character is in exactly one unit, in order
    covered = "".join(text[s:e] for s, e in spans)
    assert covered.replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")
    assert text[spans[-1][0]:spans[-1][1]].endswith("\nend.")   # "end." joined the unit before


def test_units_of_empty_and_blank_text():
    assert units("") == []
    assert units(" \n\n  ") == []
    assert units("hi") == [(0, 2)]


@pytest.mark.parametrize("tokens", [[10] * 50, [3, 90, 5, 5, 70, 1, 1, 200, 2], [300], []])
def test_passages_cover_every_unit_with_bounded_size_and_overlap(tokens):
    size, overlap = 64, 16
    groups = passages(tokens, size, overlap)
    seen: set[int] = set()
    for i, (a, b) in enumerate(groups):
        assert a < b
        assert b - a == 1 or sum(tokens[a:b]) <= size
        seen |= set(range(a, b))
        if i:
            pa, pb = groups[i - 1]
            assert pa < a <= pb                                # progress, no gap
            assert sum(tokens[a:pb]) <= overlap or pb - a == 0
    assert seen == set(range(len(tokens)))


def test_passages_overlap_by_whole_units():
    groups = passages([10] * 20, 50, 20)
    assert groups[:2] == [(0, 5), (3, 8)]


# ---------------------------------------------------------------- hits and positions
def test_hits_carry_exact_positions(index):
    hits = index.search("comet orbit measured by astronomers", 5)
    assert hits and len(hits) <= 5
    for h in hits:
        assert set(h) == {"id", "score", "text", "start", "end"}
        assert TEXT[h["start"]:h["end"]] == h["text"]
        assert h["text"] == h["text"].strip()
    assert "comet" in hits[0]["text"]
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_passages_tile_the_text(index):
    covered = bytearray(len(TEXT))
    for p in index.passages:
        covered[p.start:p.end] = b"\1" * (p.end - p.start)
    assert all(covered[i] or TEXT[i].isspace() for i in range(len(TEXT)))


@pytest.mark.parametrize("mode", ["bm25", "semantic", "hybrid"])
def test_each_mode_finds_a_literal_query(index, mode):
    hits = index.search("telescope gift from a merchant", 3, mode=mode)
    assert "telescope" in hits[0]["text"]


def test_semantic_mode_finds_a_paraphrase_bm25_cannot(index):
    # no word of the query is in the text: BM25 scores every passage 0
    q = "stargazers tracked a dim icy wanderer"
    assert index.search(q, 3, mode="bm25") == []
    hits = index.search(q, 3, mode="semantic")
    assert hits and "comet" in hits[0]["text"]


def test_hybrid_is_reciprocal_rank_fusion_of_its_rankings(index):
    q = "harbour storm boats"
    bm = index.rank(q, "bm25")
    se = index.rank(q, "semantic")
    others = [index.rank(q, m) for m in index.hybrid_rankings()[2:]]   # contextual, if installed
    fused = dict(index.rank(q, "hybrid"))
    for pid, score in fused.items():
        want = 0.0
        for ranking in (bm, se, *others):
            for r, (i, _) in enumerate(ranking):
                if i == pid:
                    want += 1.0 / (RRF_K + r + 1)
        assert score == pytest.approx(want)
    # each ranking's best passage stays near the top of the fused one
    top5 = [i for i, _ in index.rank(q, "hybrid")[:5]]
    assert bm[0][0] in top5 and se[0][0] in top5


def test_k_and_mode_are_checked(index):
    assert len(index.search("comet", 1)) == 1
    assert len(index.search("comet", 0)) == 1          # at least one
    with pytest.raises(ValueError, match="mode"):
        index.search("comet", 3, mode="fuzzy")  # type: ignore[arg-type]


# ---------------------------------------------------------------- contexts of every shape
def test_empty_and_wordless_contexts_and_queries():
    assert SemanticIndex("").search("anything") == []
    dots = SemanticIndex("... --- !!! ???")
    assert len(dots) == 1 and dots.search("anything") == []
    short = SemanticIndex("A tiny context.")
    assert [h["text"] for h in short.search("tiny")] == ["A tiny context."]
    assert short.search("") == [] and short.search("  ?! ") == []


def test_list_context_hits_name_their_item():
    ctx = ["The violinist tuned her instrument before the concert.",
           {"id": 7, "note": "The bakery sold out of rye bread by noon."},
           "Rain flooded the lower streets of the village overnight."]
    ix = SemanticIndex(ctx)
    hit = ix.search("bakery rye bread", 1)[0]
    assert hit["item"] == 1
    assert json.dumps(ctx[1], ensure_ascii=False)[hit["start"]:hit["end"]] == hit["text"]
    hit = ix.search("flooded streets", 1)[0]
    assert hit["item"] == 2 and ctx[2][hit["start"]:hit["end"]] == hit["text"]


def test_dict_context_hits_name_their_key_and_skip_images():
    ctx = {"minutes": "The board approved the new budget after a long debate.",
           "photo": {"__recursa_image__": 1, "b64": "aGVsbG8=", "format": "png"},
           "memo": "Please water the office plants on Fridays."}
    ix = SemanticIndex(ctx)
    assert {p.item for p in ix.passages} == {"minutes", "memo"}
    hit = ix.search("watering plants", 1)[0]
    assert hit["item"] == "memo" and ctx["memo"][hit["start"]:hit["end"]] == hit["text"]


def test_passages_never_cross_items():
    ctx = ["one two three four five six seven eight nine ten. " * 3] * 30
    ix = SemanticIndex(ctx, passage_tokens=200, overlap_tokens=10)
    for p in ix.passages:
        assert p.end <= len(ctx[p.item])


def test_bad_context_type():
    with pytest.raises(TypeError, match="str, list or dict"):
        SemanticIndex(42)


def test_bad_sizes():
    with pytest.raises(ValueError, match="overlap_tokens"):
        SemanticIndex("text", passage_tokens=10, overlap_tokens=10)


# ---------------------------------------------------------------- the model
def test_word_vectors_are_sums_of_token_vectors():
    import numpy as np
    emb = semantic.default_embedder()
    assert isinstance(emb, semantic.WordLlamaEmbedder)
    sums, counts = emb.word_vectors(["unbelievable", "Paris", "1987"])
    for i, w in enumerate(["unbelievable", "Paris", "1987"]):
        ids = emb.tokenizer.encode([w], is_pretokenized=True, add_special_tokens=False).ids
        assert counts[i] == len(ids) >= 1
        assert np.allclose(sums[i], emb.matrix[ids].sum(axis=0), atol=1e-5)


def test_missing_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wordllama", None)   # makes `import wordllama` fail
    with pytest.raises(MissingExtra, match=r"recursa\[search\]") as e:
        semantic.WordLlamaEmbedder()
    assert e.value.extra == "search"


def _run_isolated(code: str, *prefix: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(home)}
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env.pop(k, None)
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


SEARCH_ONCE = """
    import logging, socket
    from recursa.core.semantic import SemanticIndex
    ix = SemanticIndex("The ferry stopped when the harbour froze. Bread is baked at dawn.")
    hits = ix.search("boat service suspended in winter ice", 1)
    assert hits and "ferry" in hits[0]["text"], hits
    assert logging.getLogger().handlers == [], logging.getLogger().handlers
    print("ok")
"""


def test_works_with_the_network_unreachable(tmp_path):
    """The model loads from the wheel: in a network namespace with no interfaces up (and a
    fresh HOME, so no cache to fall back on), indexing and searching work, nothing is written
    under HOME, and the host's root logger is left as it was."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rn", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("no unprivileged network namespace here (unshare -rn)")
    probe = _run_isolated("""
        import socket
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=3)
            print("reachable")
        except OSError:
            print("unreachable")
    """, unshare, "-rn", home=tmp_path)
    assert probe.stdout.strip() == "unreachable"
    res = _run_isolated(SEARCH_ONCE, unshare, "-rn", home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
    assert list(tmp_path.iterdir()) == []


def test_import_leaves_root_logger_alone():
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    semantic._import_wordllama()
    assert (list(root.handlers), root.level) == before
