"""Preflight and cost caps: a run that cannot work, or whose cost limit could not be kept,
fails before its first model call, having spent nothing (library: PreflightError; CLI: exit 2).
Against real HTTP servers speaking the OpenAI protocol (tests/openai_testserver.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from openai_testserver import OpenAITestServer
from recursa import RLM
from recursa.core.preflight import PreflightError
from recursa.obs.trace import load

LOOP = "```repl\nfor i in range(20):\n    llm_query('hi ' + str(i))\n```"


def looping(request: dict[str, Any]) -> str:
    """The root keeps asking for sub-calls, in a new block each turn (the same block again
    counts as a failed turn, which would end the run before its cost cap); sub-calls answer
    'ok'."""
    msgs = request["messages"]
    return LOOP.replace("for", f"turn = {len(msgs)}\nfor", 1) if msgs[0]["role"] == "system" \
        else "ok"


def closed_port() -> int:
    with socket.socket() as s:       # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(args: list[str], env: dict[str, str] | None = None, stdin: bytes = b"some data",
        timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "recursa.cli", *args], input=stdin,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})


# ---------------------------------------------------------------- cost caps, library
def test_a_cost_cap_on_an_unpriced_model_refuses_to_start():
    with OpenAITestServer(looping) as srv:
        rlm = RLM(model="openai:unpriced", base_url=srv.base_url, sandbox="inprocess",
                  max_cost_usd=0.0001)
        with pytest.raises(PreflightError, match=r"no price for openai:unpriced.*prices="):
            rlm.completion("q", "context")
        assert srv.request_count == 0
        # without the cap the same model runs (cost unknown, not zero)
        res = RLM(model="openai:unpriced", base_url=srv.base_url, sandbox="inprocess",
                  max_iterations=1, max_subcalls=2).completion("q", "context")
        assert srv.request_count > 0 and res.cost_usd is None


def test_a_price_the_user_gives_keeps_the_cap(tmp_path: Path):
    with OpenAITestServer(looping) as srv:
        rlm = RLM(model="openai:unpriced", base_url=srv.base_url, sandbox="inprocess",
                  prices={"openai:unpriced": (1.0, 1.0)}, max_cost_usd=0.01,
                  trace_path=tmp_path / "t.jsonl")
        res = rlm.completion("q", "context")
        assert res.status == "limit" and res.limit == "max_cost_usd"
        # every call stays inside the cap but the root's one last-answer turn at the limit,
        # which may pass it by its own cost (budget.py); calls cut to the room left spend
        # up to the cap, so that turn now starts near it
        last = [n.data for n in load(tmp_path / "t.jsonl").nodes.values()
                if n.kind == "turn" and n.data.get("last")]
        assert len(last) == 1 and last[0]["cost_usd"] > 0
        assert res.cost_usd is not None and 0 < res.cost_usd - last[0]["cost_usd"] <= 0.01
        tokens = sum(u.usage.total_tokens for u in res.usage.values())
        assert res.cost_usd == pytest.approx(tokens / 1e6)     # $1 per 1M tokens either way
        assert res.subcalls >= 1


def test_a_provider_reported_cost_keeps_the_cap(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "test-key")
    with OpenAITestServer(looping, reported_cost=0.002) as srv:
        res = RLM(model="openrouter:vendor/unpriced", base_url=srv.base_url,
                  sandbox="inprocess", max_cost_usd=0.01).completion("q", "context")
        assert res.status == "limit" and res.limit == "max_cost_usd"
        calls = srv.request_count
        assert res.cost_usd == pytest.approx(0.002 * calls)
        assert res.cost_usd <= 0.01 + 0.002 * 1.5      # at most the root's one last answer turn
        # OpenRouter is asked to report the cost
        assert srv.requests[0]["usage"] == {"include": True}


def test_a_call_without_a_reported_cost_ends_a_capped_run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "test-key")
    with OpenAITestServer(looping) as srv:        # reports no cost
        res = RLM(model="openrouter:vendor/unpriced", base_url=srv.base_url,
                  sandbox="inprocess", max_cost_usd=5.0).completion("q", "context")
        assert res.status == "limit" and res.limit == "max_cost_usd" and res.cost_usd is None
        assert srv.request_count <= 2             # the first turn, then one last answer turn
        assert res.subcalls == 0


# ---------------------------------------------------------------- other checks, library
def test_unreachable_endpoint_and_missing_model_file_fail_before_any_call(tmp_path: Path):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(PreflightError, match="cannot reach .*connection refused"):
        RLM(model="openai:m", base_url=url, sandbox="inprocess").completion("q", "c")
    with pytest.raises(PreflightError, match="no such model file"):
        RLM(model=f"local:{tmp_path}/missing.gguf", sandbox="inprocess").completion("q", "c")
    # every problem at once
    with pytest.raises(PreflightError) as e:
        RLM(model=f"local:{tmp_path}/missing.gguf", sandbox="e2b",
            sandbox_options={}).completion("q", "c")
    assert len(e.value.problems) == 2


def test_sandbox_engines_and_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from recursa.core.preflight import check
    for var in ("E2B_API_KEY", "DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "MODAL_TOKEN_ID",
                "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "none.toml"))
    with pytest.raises(PreflightError, match="docker CLI.*not on PATH"):
        check([], sandbox="docker", sandbox_options={"docker": "no-such-docker-binary"})
    for kind, needs in (("e2b", "E2B_API_KEY"), ("daytona", "DAYTONA_API_KEY"),
                        ("modal", "MODAL_TOKEN_ID")):
        with pytest.raises(PreflightError, match=f"{needs}|pip install 'recursa\\[{kind}\\]'"):
            check([], sandbox=kind)
    monkeypatch.setenv("E2B_API_KEY", "k")
    try:
        check([], sandbox="e2b")
    except PreflightError as e:          # only a missing SDK may remain
        assert "pip install 'recursa[e2b]'" in str(e)
    monkeypatch.setitem(sys.modules, "e2b", None)
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "e2b" else real(name, *a))
    with pytest.raises(PreflightError, match=r"sandbox='e2b' needs the 'e2b' package: "
                                             r"pip install 'recursa\[e2b\]'"):
        check([], sandbox="e2b")


# ---------------------------------------------------------------- the front ends
def test_cli_run_refuses_an_unkeepable_cap_and_keeps_a_priced_one(tmp_path: Path):
    with OpenAITestServer(looping) as srv:
        base = ["run", "q", "--context", "-", "--model", "openai:unpriced", "--base-url",
                srv.base_url, "--sandbox", "inprocess"]
        p = cli([*base, "--max-cost", "0.001"])
        err = p.stderr.decode()
        assert p.returncode == 2 and srv.request_count == 0 and p.stdout == b""
        assert "no price for openai:unpriced" in err and "--price openai:unpriced=IN/OUT" in err
        p = cli([*base, "--max-cost", "0.01", "--price", "1/1", "--json"])
        res = json.loads(p.stdout)
        assert p.returncode == 4, p.stderr.decode()      # exit 4: a limit stopped the run
        # at most the last-answer turn past the cap (its ~1,800 input tokens: ~$0.002)
        assert res["limit"] == "max_cost_usd" and 0 < res["cost_usd"] <= 0.01 + 0.003


def test_bench_serve_mcp_and_ablate_run_the_same_checks(tmp_path: Path):
    with OpenAITestServer(looping) as srv:
        common = ["--model", "openai:unpriced", "--base-url", srv.base_url, "--max-cost", "0.01",
                  "--sandbox", "inprocess"]
        runs = {
            "bench": ["bench", "run", "--task", "sniah", "--lengths", "1k", "-n", "1",
                      "--method", "rlm", "--out", str(tmp_path / "b"), "--no-progress"],
            "serve": ["serve", "--port", str(closed_port())],
            "mcp": ["mcp"],
            "ablate": ["ablate", "--env", "oolong", "-n", "1", "--out", str(tmp_path / "a")],
        }
        for name, args in runs.items():
            p = cli([*args, *common], stdin=b"")
            assert p.returncode == 2, (name, p.stderr.decode())
            assert "--price openai:unpriced=IN/OUT" in p.stderr.decode(), name
        assert srv.request_count == 0
        assert not (tmp_path / "b" / "rows.jsonl").exists()


def test_cli_cache_option_reaches_the_rlm(tmp_path: Path):
    """`--cache PATH` (the shared option) passes cache= to RLM: the same run again is answered
    from the file, and the endpoint sees no new request."""
    def final(request: dict[str, Any]) -> str:
        return "```repl\nFINAL('cached?')\n```"
    with OpenAITestServer(final) as srv:
        args = ["run", "q", "--context", "-", "--model", "openai:m", "--base-url", srv.base_url,
                "--sandbox", "inprocess", "--temperature", "0", "-q",
                f"--cache={tmp_path / 'cache.sqlite'}"]
        first = cli(args)
        assert first.returncode == 0, first.stderr.decode()
        n = srv.request_count
        second = cli(args)
        assert second.returncode == 0 and second.stdout == first.stdout == b"cached?\n"
        assert n >= 1 and srv.request_count == n
