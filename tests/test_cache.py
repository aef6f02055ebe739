"""Response cache: keys, the temperature rule, hits in Result and trace, a bench re-run that makes
no model request (counted by a real OpenAI-protocol server), two processes writing at once,
and bad files (corrupt, unwritable)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from helpers_scripted import SYSTEM_MARK, lookup, sniah_model, tool_responder
from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.base.types import Completion, ModelClient, ModelError, Usage
from recursa.core.tools import native_calls
from recursa.models import make_client
from recursa.models.cache import (
    CachedClient,
    CacheError,
    ResponseCache,
    cached,
    clear_cache,
    client_identity,
    default_cache_path,
    open_cache,
    request_key,
)
from recursa.models.replay import ReplayClient
from recursa.obs.trace import read_trace

SRC = Path(__file__).parents[1] / "src"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
IDENT = {"name": "openai:m", "model": "m", "base_url": "http://h/v1", "defaults": {}}


def run(coro: Any) -> Any:
    import asyncio
    return asyncio.run(coro)


# ---------------------------------------------------------------- keys
def test_key_ignores_spelling_but_not_meaning() -> None:
    k = request_key(IDENT, MSGS, {"temperature": 0, "max_tokens": 10})
    # same request written differently: 0.0 for 0, other key order, a timeout, a None option
    same = request_key(dict(reversed(IDENT.items())),
                       [dict(reversed(m.items())) for m in MSGS],
                       {"max_tokens": 10.0, "temperature": 0.0, "timeout": 3, "seed": None})
    assert k == same and re.fullmatch(r"[0-9a-f]{64}", k)
    changed = [
        request_key(IDENT, [*MSGS[:1], {"role": "user", "content": "2+3?"}], {"temperature": 0,
                                                                             "max_tokens": 10}),
        request_key(IDENT, MSGS, {"temperature": 0, "max_tokens": 11}),
        request_key(IDENT, MSGS, {"temperature": 0.5, "max_tokens": 10}),
        request_key(IDENT, MSGS, {"temperature": 0, "max_tokens": 10, "stop": ["\n"]}),
        request_key(IDENT, MSGS, {"temperature": 0, "max_tokens": 10,
                                  "response_format": {"type": "json_object"}}),
        request_key(IDENT, MSGS, {"temperature": 0, "max_tokens": 10,
                                  "tools": [{"type": "function", "function": {"name": "f"}}]}),
        request_key({**IDENT, "model": "m2"}, MSGS, {"temperature": 0, "max_tokens": 10}),
        request_key({**IDENT, "base_url": "http://other/v1"}, MSGS,
                    {"temperature": 0, "max_tokens": 10}),
    ]
    assert len({k, *changed}) == len(changed) + 1
    # long strings enter the key by their hash: one changed character still changes it
    long = "x" * 5000
    keys = {request_key(IDENT, [{"role": "user", "content": c}], {"temperature": 0})
            for c in (long, long[:2500] + "y" + long[2501:], long + "x", "日本語 \ud800" * 900)}
    assert len(keys) == 4


def test_key_is_the_same_in_another_process() -> None:
    code = textwrap.dedent(f"""
        from recursa.models.cache import request_key
        print(request_key({IDENT!r}, {MSGS!r}, {{"temperature": 0, "max_tokens": 10}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    assert out == request_key(IDENT, MSGS, {"max_tokens": 10, "temperature": 0.0})
    # pinned: a change here makes every existing cache miss, so it must be deliberate
    assert out == "f38943e72b68ae8959c4a295778e490aea1dcae946086c520075b19e985f1d52"


def test_identity_has_endpoint_and_default_options() -> None:
    c = make_client("openai:m", base_url="http://127.0.0.1:9/v1", api_key="k",
                    default_options={"temperature": 0})
    ident = client_identity(c)
    assert ident == {"name": "openai:m", "model": "m", "base_url": "http://127.0.0.1:9/v1",
                     "defaults": {"temperature": 0}}
    assert "k" not in json.dumps(ident).replace('"', " ").split()   # never the key


# ---------------------------------------------------------------- the wrapper
def test_hit_replays_reply_at_zero_cost(tmp_path: Path) -> None:
    inner = ReplayClient(["four"], cost_usd=0.25)
    client = cached(inner, tmp_path / "c.sqlite")
    assert isinstance(client, CachedClient) and isinstance(client, ModelClient)
    assert client.name == inner.name
    assert client.model == "replay"                          # attributes pass through
    first = run(client.complete(MSGS, temperature=0))
    second = run(client.complete(MSGS, temperature=0, timeout=5))
    assert len(inner.calls) == 1                              # the script had one reply
    assert (first.cached, first.cost_usd) == (False, 0.25)
    assert (second.cached, second.cost_usd, second.text) == (True, 0.0, "four")
    assert second.usage == first.usage and second.usage.input_tokens > 0
    assert (client.hits, client.misses) == (1, 1)
    assert cached(client, tmp_path / "c.sqlite") is client    # never wrapped twice
    assert cached(inner, None) is inner and cached(inner, False) is inner


def test_sampled_calls_are_cached_only_with_a_seed_or_when_asked(tmp_path: Path,
                                                                 caplog: Any) -> None:
    store = ResponseCache(tmp_path / "c.sqlite")
    inner = ReplayClient(lambda m: "x")
    client = CachedClient(inner, store)
    with caplog.at_level(logging.WARNING, logger="recursa.models"):
        for opts in ({}, {}, {"temperature": 0.7}, {"temperature": 0.7}):
            assert not run(client.complete(MSGS, **opts)).cached
    assert len(inner.calls) == 4 and client.skipped == 4 and len(store) == 0
    assert sum("not cached" in r.message for r in caplog.records) == 1   # warned once
    for _ in range(2):
        run(client.complete(MSGS, temperature=0.7, seed=1))
    assert len(inner.calls) == 5 and client.hits == 1
    loose = CachedClient(inner, store, nondeterministic=True)
    for _ in range(2):
        run(loose.complete(MSGS, temperature=0.7))
    assert len(inner.calls) == 6 and loose.hits == 1
    # a client whose own defaults say temperature 0 is deterministic without being told
    steady = CachedClient(_Fixed(defaults={"temperature": 0}), store)
    run(steady.complete(MSGS)), run(steady.complete(MSGS))
    assert steady.hits == 1


class _Fixed:
    """A client answering one OpenAI-shaped raw response (tool calls included)."""

    name = "fixed:m"
    model = "m"

    def __init__(self, defaults: dict[str, Any] | None = None, raw: Any = None):
        self.default_options = defaults or {}
        self.raw = raw
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], **options: Any) -> Completion:
        self.calls += 1
        return Completion(text="t", usage=Usage(input_tokens=3, output_tokens=1), cost_usd=0.1,
                          model="m", raw=self.raw)

    async def aclose(self) -> None:
        pass


def test_the_cli_names_its_own_flag_for_caching_sampled_replies(tmp_path: Path) -> None:
    """`recursa run --cache` at the provider's temperature: the note names the flags that work
    (--temperature 0, --cache-nondeterministic), not the library's argument; the flag caches."""
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"cycle": ["```repl\nFINAL('4')\n```"]}))
    ctx = tmp_path / "c.txt"
    ctx.write_text("two and two")
    db = tmp_path / "c.sqlite"

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "recursa.cli", "run", "Sum?", "-c", str(ctx),
                               "--model", f"replay-file:{script}", "--sandbox", "inprocess",
                               *extra], capture_output=True, text=True, timeout=60)

    p = cli(f"--cache={db}")
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stderr
    err = " ".join(p.stderr.split())
    assert "not cached" in err and "pass --cache-nondeterministic" in err, err
    assert "--temperature 0" in err and "cache_nondeterministic=" not in err
    assert len(ResponseCache(db)) == 0
    p = cli(f"--cache={db}", "--cache-nondeterministic")
    assert p.returncode == 0 and "not cached" not in p.stderr, p.stderr
    assert len(ResponseCache(db)) == 1
    p = cli("--cache-nondeterministic")
    assert p.returncode == 2 and "give --cache too" in p.stderr


def test_tool_calls_in_the_raw_reply_survive_the_cache(tmp_path: Path) -> None:
    raw = {"choices": [{"message": {"content": None, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "lookup", "arguments": '{"city": "Paris"}'}}]}}]}
    client = cached(_Fixed(raw=raw), tmp_path / "c.sqlite")
    run(client.complete(MSGS, temperature=0))
    hit = run(client.complete(MSGS, temperature=0))
    assert hit.cached and client.inner.calls == 1
    assert [(c.name, c.arguments) for c in native_calls(hit)] == [("lookup", {"city": "Paris"})]


# ---------------------------------------------------------------- RLM over HTTP


def rlm_responder(req: dict[str, Any]) -> str:
    msgs = req["messages"]
    if SYSTEM_MARK in str(msgs[0]["content"]):
        done = sum(m["role"] == "assistant" for m in msgs)
        return ("```repl\nparts = llm_batch(['word one: ' + context[:5], 'word two: ' + "
                "context[5:]])\nprint(parts)\n```") if done == 0 else \
            "```repl\nFINAL(' '.join(parts))\n```"
    return msgs[-1]["content"].split(": ", 1)[1].upper()


def test_rlm_rerun_is_answered_from_cache_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with OpenAITestServer(responder=rlm_responder) as srv:
        def once(i: int) -> Any:
            return RLM(model="openai:m", base_url=srv.base_url, sandbox="inprocess",
                       model_options={"temperature": 0}, sub_model_options={"temperature": 0},
                       trace_path=tmp_path / f"t{i}.jsonl", cache=path
                       ).completion("q", context="helloworld")
        first = once(1)
        sent = srv.request_count
        second = once(2)
        assert srv.request_count == sent == 4   # 2 root turns + 2 sub-calls, then none
    assert first.answer == second.answer == "HELLO WORLD"
    assert (first.cache_hits, second.cache_hits) == (0, 4)
    assert second.cost_usd == 0.0 and second.usage["root"].usage.input_tokens > 0
    ev = read_trace(tmp_path / "t2.jsonl").events
    marked = [(e.kind, e.phase) for e in ev if e.data.get("cached") is True]
    assert sorted(marked) == sorted([("turn", "update"), ("turn", "end")] * 2
                                    + [("subcall", "end")] * 2)
    assert not any("cached" in e.data for e in read_trace(tmp_path / "t1.jsonl").events)


def test_native_tool_loop_replays_from_cache(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with OpenAITestServer(responder=tool_responder) as srv:
        answers = []
        for _ in range(2):
            root = ReplayClient(["```repl\nr = llm_query('Population of Paris?')\nprint(r)\n```",
                                 "```repl\nFINAL(r)\n```"])
            sub = make_client("openai:sub-model", base_url=srv.base_url, api_key="k")
            res = RLM(model=root, sub_model=sub, sandbox="inprocess", sub_tools=[lookup],
                      sub_model_options={"temperature": 0}, cache=path
                      ).completion("q", context="ctx")
            answers.append((res.answer, res.cache_hits))
        assert srv.request_count == 2        # the tool turn and the answer, once
    assert answers == [("about two million", 0), ("about two million", 2)]


# ---------------------------------------------------------------- bench
def bench_specs(srv: OpenAITestServer, cache: Path, traces: Path) -> list[dict[str, Any]]:
    from recursa.bench.methods import MethodConfig, parse_method
    from recursa.bench.runner import make_specs
    cfgs = []
    for m in ("rlm", "direct", "compaction", "codeact-bm25"):
        name, depth, trunc = parse_method(m)
        cfgs.append(MethodConfig(method=name, depth=depth, truncate=trunc, model="openai:m",
                                 base_url=srv.base_url, sandbox="inprocess",
                                 limits={"max_iterations": 3}, window_tokens=100_000,
                                 chunk_tokens=300, model_options={"temperature": 0},
                                 cache=cache))     # a Path: stored as its string
    return make_specs(["sniah"], [1024], range(2), cfgs, str(traces))


def test_bench_rerun_with_cache_makes_no_model_request(tmp_path: Path) -> None:
    from recursa.bench.runner import AsyncioExecutor, load_rows, run_bench
    cache = tmp_path / "c.sqlite"
    with OpenAITestServer(responder=lambda req: sniah_model(req["messages"])) as srv:
        s1 = run_bench(bench_specs(srv, cache, tmp_path / "a" / "traces"), tmp_path / "a",
                       executor=AsyncioExecutor(4), progress=False)
        first = srv.request_count
        s2 = run_bench(bench_specs(srv, cache, tmp_path / "b" / "traces"), tmp_path / "b",
                       executor=AsyncioExecutor(4), progress=False)
        assert srv.request_count == first > 8      # the second run asked the model nothing
    assert s1["ran"] == s2["ran"] == 8 and s1["errors"] == s2["errors"] == 0
    a = {r["key"]: r for r in load_rows(tmp_path / "a")}
    b = {r["key"]: r for r in load_rows(tmp_path / "b")}
    assert sum(r["cache_hits"] for r in b.values()) == first
    for k, r in b.items():
        assert r["score"] == a[k]["score"] == 1.0 and r["answer"] == a[k]["answer"]
        assert r["tokens"] == a[k]["tokens"] and a[k]["cache_hits"] == 0
        assert r["cache_hits"] == r["turns"] + r["subcalls"] > 0


# ---------------------------------------------------------------- the store
WRITER = textwrap.dedent("""
    import sys, time
    from recursa.models.cache import ResponseCache
    path, who, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    while time.time() < start:
        time.sleep(0.001)
    store = ResponseCache(path)        # both create the same new file at the same moment
    other = "b" if who == "a" else "a"
    for i in range(n):
        store.put(f"{who}-{i}", {"text": f"{who} {i}"}, model=who)
        store.put(f"shared-{i}", {"text": f"shared {i}"}, model="shared")
        if i == 0:      # a barrier: the rest is written while the other process writes too
            deadline = time.time() + 60
            while store.get(f"{other}-0") is None and time.time() < deadline:
                time.sleep(0.001)
    print(len(store))
""")


def test_two_processes_write_at_once(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "c.sqlite"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who, "600", str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for who in ("a", "b")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    store = ResponseCache(path)
    try:
        assert len(store) == 1800
        assert store.stats()["by_model"] == {"a": 600, "b": 600, "shared": 600}
        assert store.get("b-599") == {"text": "b 599"}
        assert store.path.with_name("c.sqlite-wal").exists()      # WAL mode
    finally:
        store.close()


def test_connections_of_ended_threads_are_closed(tmp_path: Path) -> None:
    """Each thread gets a connection (two file descriptors); a process that makes a thread per
    session must not keep one per thread it ever had."""
    import threading

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    store = ResponseCache(tmp_path / "c.sqlite")
    store.put("k", {"text": "v"}, model="m")
    before = fds()
    for _ in range(40):
        t = threading.Thread(target=lambda: store.get("k"))
        t.start()
        t.join()
    assert fds() <= before + 4          # 40 threads' connections left open would be +80
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(store.get("k")))
    t.start()
    t.join()
    assert got == [{"text": "v"}] and store.get("k") == {"text": "v"}
    store.close()
    assert fds() < before


def test_clear_and_stats(tmp_path: Path) -> None:
    store = ResponseCache(tmp_path / "c.sqlite")
    store.put("k1", {"text": "a"}, model="x")
    store.put("k2", {"text": "b"}, model="y")
    assert store.stats()["entries"] == 2 and store.stats()["bytes"] > 0
    assert store.clear(model="x") == 1 and store.get("k1") is None and len(store) == 1
    store.close()
    assert clear_cache(tmp_path / "c.sqlite") == 1
    assert clear_cache(tmp_path / "missing.sqlite") == 0


def test_default_path_and_open_shares_one_store(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECURSA_RESPONSE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "recursa" / "responses.sqlite"
    monkeypatch.setenv("RECURSA_RESPONSE_CACHE", str(tmp_path / "env.sqlite"))
    store = open_cache(True)
    assert store is not None and store.path == tmp_path / "env.sqlite"
    assert open_cache(str(tmp_path / "env.sqlite")) is store and open_cache(store) is store
    assert open_cache(None) is None and open_cache(False) is None
    with pytest.raises(TypeError, match="cache= takes"):
        open_cache(3)
    store.close()


def test_corrupt_file_is_a_clear_error_and_clear_cache_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not sqlite at all, just some bytes " * 100)
    with pytest.raises(CacheError, match=r"c\.sqlite is corrupt or not a recursa cache") as e:
        RLM(model=ReplayClient(["x"]), cache=path)
    assert e.value.reason == "corrupt"
    assert clear_cache(path) == 0 and not path.exists()
    assert len(ResponseCache(path)) == 0                    # rebuilt, empty


def test_foreign_sqlite_format_is_refused(tmp_path: Path) -> None:
    import sqlite3
    path = tmp_path / "c.sqlite"
    store = ResponseCache(path)
    store._conn().execute("UPDATE meta SET value = 'recursa-cache/9' WHERE name = 'format'")
    store.close()
    with pytest.raises(CacheError, match="recursa-cache/9"):
        ResponseCache(path)
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)").connection.close()
    assert len(ResponseCache(tmp_path / "other.sqlite")) == 0   # a sqlite file gains our tables


def test_unwritable_paths_are_clear_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="cannot create its directory"):
        RLM(model=ReplayClient(["x"]), cache=blocker / "c.sqlite")
    with pytest.raises(CacheError, match="is a directory"):
        ResponseCache(tmp_path)
    with pytest.raises(CacheError, match="empty"):
        open_cache("  ")


# ---------------------------------------------------------------- the local model
@pytest.mark.model
def test_local_model_reply_is_cached_and_replayed_without_a_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recursa.models import llama_server
    from recursa.models.fetch import fetch_model
    from recursa.models.local import LocalClient
    smol = fetch_model("smollm2-135m")
    path = tmp_path / "c.sqlite"
    question = [{"role": "user", "content": "What is 2+3? Reply with just the number."}]
    llama_server.stop_all()
    try:
        first = run(cached(LocalClient(str(smol), n_ctx=1024, slots=1), path).complete(
            question, temperature=0, max_tokens=8))
    finally:
        llama_server.stop_all()
    # no server may start now: a hit must not need the model at all
    monkeypatch.setenv("RECURSA_LLAMA_SERVER", "/bin/false")
    again = cached(LocalClient(str(smol), n_ctx=1024, slots=1), path)
    second = run(again.complete(question, temperature=0, max_tokens=8))
    assert not first.cached and second.cached and second.text == first.text
    assert second.usage == first.usage and llama_server.running() == []
    with pytest.raises(ModelError, match="llama.cpp server .* died"):
        run(again.complete(question, temperature=0, max_tokens=9))   # a miss does need it
