"""search()'s contextual ranking (recursa.core.contextual's MiniLM, the real int8 ONNX model, a
few hundred ms to load): a paraphrased needle BM25 cannot see, three-way hybrid fusion, the
lazy sentence encoding, the missing-extra error and the bench's re-export."""

from __future__ import annotations

import importlib.util
import sys

import pytest

if not all(importlib.util.find_spec(m) for m in ("wordllama", "bm25s")):
    pytest.skip("needs the search extra: pip install 'recursa[search]'", allow_module_level=True)

from recursa.base.extras import MissingExtra  # noqa: E402
from recursa.core import contextual  # noqa: E402
from recursa.core.semantic import RRF_K, SemanticIndex  # noqa: E402

needs_model = pytest.mark.skipif(not contextual.available(),
                                 reason="needs the contextual extra: pip install "
                                        "'recursa[contextual]'")

# the needle shares no content word with the question (BM25 scores every passage 0), and the
# filler is about the same kinds of things (travel, weather, money) so a topic match is not enough
NEEDLE = "Our flight to Reykjavik was cancelled because a blizzard closed the airport for days."
QUESTION = "Why could the trip to Iceland's capital by plane not happen?"
FILLER = [
    "The train to Lyon left on time and the passengers slept through the tunnels.",
    "A sunny afternoon brought crowds of tourists to the beaches of the southern coast.",
    "The bank raised its interest rates twice during the autumn of that year.",
    "Hikers crossed the mountain pass in summer, carrying tents and enough food for a week.",
    "The harbour cranes unloaded containers of coffee beans from the cargo ship at dawn.",
    "Snow fell gently on the village while the bakers prepared bread for the festival.",
]


@pytest.fixture(scope="module")
def index() -> SemanticIndex:
    text = "\n\n".join(FILLER[:3] + [NEEDLE] + FILLER[3:])
    return SemanticIndex(text, passage_tokens=24, overlap_tokens=0)


def test_needle_shares_no_word_bm25_could_match(index):
    assert index.search(QUESTION, 3, mode="bm25") == []


@needs_model
def test_contextual_mode_ranks_a_paraphrased_needle_first(index):
    hits = index.search(QUESTION, 3, mode="contextual")
    assert hits[0]["text"] == NEEDLE
    assert hits[0]["score"] > hits[1]["score"] + 0.1      # first by a margin, not by a tie


@needs_model
def test_hybrid_fuses_three_rankings_when_the_extra_is_installed(index):
    assert index.hybrid_rankings() == ("bm25", "semantic", "contextual")
    q = "passengers on the train to Lyon"
    lists = [index.rank(q, m) for m in index.hybrid_rankings()]
    fused = dict(index.rank(q, "hybrid"))
    for pid, score in fused.items():
        want = sum(1.0 / (RRF_K + r + 1) for ranking in lists
                   for r, (i, _) in enumerate(ranking) if i == pid)
        assert score == pytest.approx(want)
    assert index.search(QUESTION, 1)[0]["text"] == NEEDLE


def test_hybrid_falls_back_to_two_rankings_without_the_extra(monkeypatch):
    monkeypatch.setattr(contextual, "available", lambda: False)
    ix = SemanticIndex("A short text about a comet seen from the observatory on the hill.")
    assert ix.hybrid_rankings() == ("bm25", "semantic")
    assert ix.search("comet", 1)           # and the search itself never loads the encoder
    assert ix._ctx_vecs is None


def test_hybrid_skips_the_encoder_on_a_large_context(monkeypatch):
    from recursa.core import semantic
    monkeypatch.setattr(semantic, "HYBRID_CONTEXTUAL_MAX_UNITS", 1)
    ix = SemanticIndex("First sentence about comets and stars.\nSecond one about the moon and "
                       "tides.\nThird about a harbour in a storm at night.")
    assert ix.hybrid_rankings() == ("bm25", "semantic")


class CountingEncoder:
    """The real encoder, counting the texts it is asked for."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts: list[str], *, remember: bool = True):
        self.calls.append(len(texts))
        return contextual.encoder().encode(texts, remember=remember)


@needs_model
def test_sentences_are_encoded_once_and_only_when_asked():
    enc = CountingEncoder()
    ix = SemanticIndex("\n".join(FILLER + [NEEDLE]), encoder=enc)
    ix.search("comet", 2, mode="bm25")
    ix.search("comet", 2, mode="semantic")
    assert enc.calls == []                     # building and the other modes never encode
    ix.search(QUESTION, 2, mode="contextual")
    ix.search("a second question", 2, mode="contextual")
    assert enc.calls == [len(FILLER) + 1, 1, 1]   # the sentences once, then a query each


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # makes `import onnxruntime` fail
    with pytest.raises(MissingExtra, match=r"recursa\[contextual\]") as e:
        contextual.MiniLM().load()
    assert e.value.extra == "contextual" and isinstance(e.value, contextual.EmbedUnavailable)


def test_missing_weights_package_names_the_extra():
    with pytest.raises(MissingExtra, match=r"recursa\[contextual\].*no-such-dist is not "
                                           r"installed"):
        contextual.pinned_file("no-such-dist", "model.onnx", "0" * 64)


def test_contextual_mode_without_the_extra_raises_it(monkeypatch):
    ix = SemanticIndex("The ferry stopped when the harbour froze. Bread is baked at dawn.",
                       encoder=contextual.MiniLM())          # a fresh, unloaded encoder
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingExtra, match="contextual"):
        ix.search("boat service suspended", 1, mode="contextual")


def test_bench_embed_reexports_the_core_encoder():
    from recursa.bench import embed
    assert embed.encoder is contextual.encoder and embed.MiniLM is contextual.MiniLM
    assert embed.pinned_file is contextual.pinned_file
    assert embed.EmbedUnavailable is contextual.EmbedUnavailable
    assert embed.encoder() is contextual.encoder()
