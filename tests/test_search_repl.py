"""search() in the REPL, end to end: a scripted root model, the real local sandbox (bubblewrap
where available), the host-side index (recursa.core.search_host) and the real WordLlama model."""

from __future__ import annotations

import importlib.util
import json

import pytest

# find_spec, not importorskip: importing wordllama outside recursa's guard would configure
# the root logger (recursa.core.semantic._import_wordllama)
if not all(importlib.util.find_spec(m) for m in ("wordllama", "bm25s")):
    pytest.skip("needs the search extra: pip install 'recursa[search]'", allow_module_level=True)

from helpers_scripted import repl
from recursa import RLM  # noqa: E402
from recursa.core import search_host  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402

NEEDLE = "The chef refused to serve shellfish after three diners fell ill with food poisoning."
FILLER = ("The committee met on Tuesday to read the annual report aloud. "
          "Members asked about the roof of the town hall and the cost of paint.\n")
TEXT = FILLER * 150 + NEEDLE + "\n" + FILLER * 150
QUERY = "Why did the cook stop offering seafood dishes to restaurant guests?"


def run(context, *cells: str, sandbox: str = "local"):
    replies = iter(cells)
    client = ReplayClient(lambda m: repl(next(replies, 'FINAL("no more cells")')))
    return RLM(model=client, sandbox=sandbox).completion("q?", context=context)


@pytest.fixture(autouse=True)
def fresh_cache():
    search_host.clear_cache()
    yield
    search_host.clear_cache()


def test_search_finds_a_paraphrased_needle_with_its_position():
    res = run(TEXT, f"""
hits = search({QUERY!r}, 3)
h = hits[0]
assert context[h["start"]:h["end"]] == h["text"], h
assert sorted(h) == ["end", "id", "score", "start", "text"], sorted(h)
FINAL(h["text"])""")
    assert res.status == "final", res.error
    assert NEEDLE in res.answer


def test_search_over_a_list_context_names_the_item():
    records = [f"Record {i}: the library lent {i} books to the school." for i in range(200)]
    records[137] = "Record 137: " + NEEDLE
    res = run(records, f"""
h = search({QUERY!r}, 5)[0]
assert context[h["item"]][h["start"]:h["end"]] == h["text"], h
FINAL(repr([h["item"], h["text"]]))
""")
    assert res.status == "final", res.error
    assert "137" in res.answer and "shellfish" in res.answer


def test_search_survives_a_worker_restart():
    res = run(TEXT,
              'first = search("seafood", 1)[0]["id"]\nprint(first)',
              "import os\nos._exit(3)",          # the worker dies: the sandbox restarts it
              f'h = search({QUERY!r}, 1)[0]\nFINAL(h["text"])')
    assert res.status == "final", res.error
    assert NEEDLE in res.answer
    assert res.turns == 3


def test_bad_k_is_an_error_in_the_cell():
    res = run(TEXT, 'try:\n    search("x", 0)\nexcept RuntimeError as e:\n    FINAL(str(e))')
    assert res.status == "final"
    assert "k must be at least 1" in res.answer


def test_search_modes_from_the_repl():
    res = run(TEXT, """
out = []
out.append(search("shellfish", 1, mode="bm25")[0]["text"])
out.append(len(search("seafood dishes", 3, mode="bm25")))
try:
    search("x", 1, mode="fuzzy")
except RuntimeError as e:
    out.append(str(e))
FINAL(repr(out))""")
    assert res.status == "final", res.error
    assert "shellfish" in res.answer and ", 0," in res.answer   # no word of it in the text
    assert "mode must be one of hybrid, bm25, semantic" in res.answer


def test_index_is_built_once_per_context():
    run(TEXT, 'search("a", 1)\nsearch("b", 1)\nFINAL("done")')
    assert len(search_host._cache) == 1
    index = next(iter(search_host._cache.values()))
    run(TEXT, 'search("c", 1)\nFINAL("done")')
    assert next(iter(search_host._cache.values())) is index


def test_payload_round_trip_matches_the_worker(tmp_path):
    from recursa.core import context as ctx
    value = {"a": "x", "b": [1, "two"]}
    prep = ctx.prepare(value, tmp_path)
    assert search_host.load_payload(prep.payload) == json.loads(json.dumps(value))
