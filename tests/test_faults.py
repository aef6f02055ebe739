"""Provider faults: a real OpenAI-protocol HTTP server injects failures under a real RLM run.

The root model is scripted (ReplayClient); sub-calls go to `OpenAIClient` over HTTP to
`OpenAITestServer`. recursa must retry what is retryable, give up with a clear error after its
limit, count only what was spent, and keep the sub-call results that did finish.
"""

from __future__ import annotations

import time
import uuid

import pytest

from helpers_scripted import SYSTEM_MARK, repl
from openai_testserver import Fault, OpenAITestServer, count_tokens
from recursa import RLM
from recursa.models.openai_client import OpenAIClient
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load


def sub_client(srv: OpenAITestServer, **kw) -> OpenAIClient:
    kw = {"max_retries": 3, "retry_base_delay": 0.01, "retry_max_delay": 0.05,
          "timeout": 5.0, **kw}
    return OpenAIClient("test-model", base_url=srv.base_url, api_key="sk-test-faults", **kw)


def run_rlm(tmp_path, srv, code: str, *, client: OpenAIClient | None = None, **limits):
    replies = iter([repl(code), repl('FINAL("done")')])
    root = ReplayClient(lambda m: next(replies) if SYSTEM_MARK in m[0]["content"] else "?",
                        cost_usd=0.0)
    sub = client or sub_client(srv)
    trace = tmp_path / f"t-{uuid.uuid4().hex[:6]}.jsonl"
    res = RLM(model=root, sub_model=sub, sandbox="inprocess", trace_path=trace,
              **limits).completion("q", context="ctx")
    roots = [c for c in root.calls if SYSTEM_MARK in c[0]["content"]]
    feedback = roots[1][-1]["content"] if len(roots) > 1 else ""
    return res, sub, feedback, load(trace)


@pytest.fixture
def srv():
    with OpenAITestServer() as s:
        yield s


@pytest.mark.parametrize("fault", [
    Fault.status(429, retry_after="0.05"),
    Fault.status(429),
    Fault.status(500),
    Fault.status(503, retry_after="0"),
    Fault.drop(),
    Fault.malformed(),
    Fault.empty(),
    Fault.null(),
    Fault.no_choices(),
], ids=lambda f: f"{f.kind}-{f.code}-{f.retry_after}")
def test_retryable_fault_is_retried_and_the_call_succeeds(fault, tmp_path, srv):
    srv.inject(fault)
    res, sub, feedback, run = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert res.status == "final"
    assert "echo: hello" in feedback
    assert srv.request_count == 2 and sub.stats.retries == 1
    # only the successful attempt is billed, once
    assert res.subcalls == 1 and res.usage["sub"].calls == 1
    assert res.usage["sub"].usage.output_tokens == count_tokens("echo: hello")
    assert run.totals.subcalls == 1 and run.totals.failed_subcalls == 0


def test_timeout_is_retried(tmp_path, srv):
    srv.inject(Fault.hang(5))
    t0 = time.monotonic()
    res, sub, feedback, _ = run_rlm(tmp_path, srv, "print(llm_query('hello'))",
                                    client=sub_client(srv, timeout=0.5))
    assert time.monotonic() - t0 < 4
    assert "echo: hello" in feedback and sub.stats.retries == 1
    assert "timed out" in sub.stats.last_errors[0]


def test_retry_after_is_honoured(tmp_path, srv):
    srv.inject(Fault.status(429, retry_after="0.6"))
    t0 = time.monotonic()
    res, sub, feedback, _ = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert time.monotonic() - t0 >= 0.6
    assert sub.stats.slept_s == pytest.approx(0.6)
    assert "echo: hello" in feedback


def test_slow_response_within_timeout_is_not_retried(tmp_path, srv):
    srv.latency = 0.4
    res, sub, feedback, _ = run_rlm(tmp_path, srv, "print(llm_query('slow'))",
                                    client=sub_client(srv, timeout=3))
    assert "echo: slow" in feedback and sub.stats.retries == 0


def test_persistent_failure_gives_up_with_a_clear_error(tmp_path, srv):
    srv.inject(*[Fault.status(503)] * 10)
    res, sub, feedback, run = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert srv.request_count == 4                       # 1 + max_retries
    assert "Error:" in feedback and "HTTP 503" in feedback
    assert "gave up after 4 attempts" in feedback
    assert res.status == "final"                        # the run goes on
    assert res.subcalls == 0 and "sub" not in res.usage  # nothing was billed
    assert run.totals.failed_subcalls == 1


def test_persistent_empty_content_is_an_error_not_a_crash(tmp_path, srv):
    srv.inject(*[Fault.empty()] * 5)
    res, sub, feedback, _ = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert "returned no text" in feedback
    assert srv.request_count == 2                       # an empty reply is retried once only


def test_non_retryable_status_fails_at_once(tmp_path, srv):
    srv.inject(Fault.status(400, body="bad request: context too long"))
    res, sub, feedback, _ = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert srv.request_count == 1
    assert "HTTP 400" in feedback and "context too long" in feedback


def test_batch_keeps_finished_results_when_some_fail(tmp_path):
    def responder(req):
        text = req["messages"][-1]["content"]
        return Fault.status(500) if "bad" in text else f"ok:{text}"

    with OpenAITestServer(responder) as srv:
        code = ("r = llm_batch(['a', 'bad1', 'b', 'bad2', 'c'])\n"
                "print([x if not x.startswith('Error') else 'ERR' for x in r])")
        res, sub, feedback, run = run_rlm(tmp_path, srv, code)
    assert "['ok:a', 'ERR', 'ok:b', 'ERR', 'ok:c']" in feedback
    assert res.subcalls == 3 and res.usage["sub"].calls == 3
    assert run.totals.subcalls == 5 and run.totals.failed_subcalls == 2
    want = sum(count_tokens(t) + count_tokens("ok:" + t) for t in "abc")
    assert res.usage["sub"].usage.total_tokens == want


def test_root_model_failure_ends_the_run_with_the_spend_and_trace(tmp_path, srv):
    srv.inject(Fault.status(500))  # the first root turn: retried, then fine
    root = sub_client(srv)
    trace = tmp_path / "t.jsonl"
    res = RLM(model=root, sandbox="inprocess", trace_path=trace,
              max_iterations=2).completion("q", context="ctx")
    # the echo server never writes code: the run ends at its limit with an extracted answer
    assert res.status in ("extracted", "error", "limit")
    assert root.stats.retries == 1
    run = load(trace)
    assert run.finished and run.totals.tokens == sum(
        u.usage.total_tokens for u in res.usage.values())

    srv.reset()
    srv.inject(*[Fault.status(503)] * 20)
    root = sub_client(srv)
    res = RLM(model=root, sandbox="inprocess", trace_path=tmp_path / "t2.jsonl").completion(
        "q", context="ctx")
    assert res.status == "error" and "HTTP 503" in res.error and "gave up" in res.error
    assert load(tmp_path / "t2.jsonl").status == "error"


def test_sub_call_key_never_reaches_the_trace(tmp_path, srv):
    res, sub, feedback, run = run_rlm(tmp_path, srv, "print(llm_query('hello'))")
    assert srv.headers[0]["authorization"] == "Bearer sk-test-faults"
    assert "sk-test-faults" not in repr(sub)
