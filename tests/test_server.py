"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn
server in a thread (ephemeral loopback port), with a scripted model and a counting sandbox."""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from helpers_server import KEY, CountingSandboxes, Scripted, Server, code, make_server  # noqa: E402
from recursa.core.config import RLMConfig  # noqa: E402
from recursa.core.rlm import RLM  # noqa: E402
from recursa.server.openai_app import RunSpec, ServerConfig, create_app, parse_chat  # noqa: E402


# ---------------------------------------------------------------- harness
def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def echo_context_root(messages: list[dict[str, Any]]) -> str:
    """Answers with a description of `context` and one sub-call, so usage has both roles."""
    return code("s = llm_query('summarise')\n"
                "FINAL('type=' + type(context).__name__ + ' size=' + str(len(context))"
                " + ' keys=' + (','.join(sorted(context)) if isinstance(context, dict) else '-')"
                " + ' sub=' + s)")


# ---------------------------------------------------------------- unit: request parsing
def test_parse_chat_context_rules() -> None:
    cfg = ServerConfig(rlm=RLMConfig.build(model="replay:", max_iterations=5, max_cost_usd=1.0))
    one = parse_chat({"messages": [{"role": "user", "content": "What is 2+2?"}]}, cfg)
    assert one.query == "What is 2+2?" and one.context == "What is 2+2?"

    big = "x" * 5000
    r = parse_chat({"messages": [{"role": "user", "content": big}]}, cfg)
    assert r.context == big and len(r.query) < 1700 and "REPL variable `context`" in r.query

    r = parse_chat({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "doc one"},
                                 {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": "  the question  "}]}, cfg)
    assert r.query == "the question\n\nInstructions from the chat's system prompt:\nbe brief"
    assert r.context == "[user]\ndoc one\n\n[assistant]\nok"

    data = base64.b64encode(b"file body").decode()
    r = parse_chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "q?"},
        {"type": "file", "file": {"filename": "a.txt",
                                  "file_data": f"data:text/plain;base64,{data}"}}]}],
        "context": {"k": "v"}, "recursa": {"max_iterations": 50, "max_depth": 0}}, cfg)
    assert r.query == "q?"
    assert r.context == {"context": {"k": "v"}, "files": {"a.txt": "file body"}}
    assert r.limits == {"max_iterations": 5, "max_depth": 0} and r.clamped == ["max_iterations"]


# ---------------------------------------------------------------- pasted documents
def server_log(chars: int = 11_500) -> str:
    """A deterministic service log of about `chars` characters (no blank lines, like most logs)."""
    out, i = [], 0
    levels = ("INFO", "INFO", "WARN", "ERROR")
    services = ("api", "db", "auth", "worker", "cache")
    while sum(map(len, out)) < chars:
        out.append(f"2024-05-01 12:{i // 60 % 60:02d}:{i % 60:02d} {levels[i % 4]} "
                   f"{services[i % 5]}: request {i} took {(i * 37) % 900} ms\n")
        i += 1
    return "".join(out)


LOG = server_log()
QUESTION = "Which service logs the most errors?"
CONTINUE_SYSTEM = ("<important_rules>\n  Always include the language and file name in the info "
                   "string when you write code blocks. If you are editing \"src/main.py\" for "
                   "example, your code block should start with '```python src/main.py'\n"
                   "</important_rules>")
OPEN_WEBUI_RAG = ("### Task:\nRespond to the user query using the provided context, "
                  "incorporating inline citations in the format [id] only when the <source> "
                  "tag includes an explicit id attribute.\n\n### Guidelines:\n- If you don't "
                  "know the answer, clearly state that.\n\n<context>\n<source id=\"1\" "
                  "name=\"app.log\">{doc}</source>\n</context>\n\n<user_query>\n{q}\n"
                  "</user_query>")


def text_parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


# Request bodies as each client sends them: (name, messages, the question, text the document
# must contain). The question must come out as the query; the log must be the context.
CLIENT_SHAPES: list[tuple[str, list[dict[str, Any]]]] = [
    ("issue 13: system first, question then log", [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"{QUESTION}\n{LOG}"}]),
    ("curl: question, blank line, log", [
        {"role": "user", "content": f"{QUESTION}\n\n{LOG}"}]),
    ("curl: intro, question, log", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Here is my server log.\n\n{QUESTION}\n\n{LOG}"}]),
    ("curl: log then question", [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"{LOG}\n\n{QUESTION}"}]),
    ("llm CLI: cat app.log | llm -s 'be brief' QUESTION", [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"{LOG} {QUESTION}"}]),
    ("Open WebUI: system prompt, earlier turns, pasted text", [
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": f"{LOG}\n\n{QUESTION}"}]),
    ("Open WebUI: RAG template in the user message", [
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": OPEN_WEBUI_RAG.format(doc=LOG, q=QUESTION)}]),
    ("Open WebUI: content parts", [
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": text_parts(f"{QUESTION}\n\n{LOG}")}]),
    ("LibreChat: attached text fenced before the question", [
        {"role": "system", "content": "You are a log analyst. Be concise."},
        {"role": "user", "content": text_parts(
            f"Attached document(s):\n```md\n# \"app.log\"\n{LOG}```\n\n{QUESTION}")}]),
    ("Continue: context item part, then question part", [
        {"role": "system", "content": CONTINUE_SYSTEM},
        {"role": "user", "content": "What does this repo do?"},
        {"role": "assistant", "content": "It is a web service."},
        {"role": "user", "content": text_parts(f"```logs/app.log\n{LOG}```", QUESTION)}]),
    ("Continue: fenced file then question in one string", [
        {"role": "system", "content": CONTINUE_SYSTEM},
        {"role": "user", "content": f"```logs/app.log\n{LOG}```\n\n{QUESTION}"}]),
]


@pytest.mark.parametrize("name, messages", CLIENT_SHAPES, ids=[n for n, _ in CLIENT_SHAPES])
def test_pasted_document_is_the_context_not_the_query(name: str,
                                                      messages: list[dict[str, Any]]) -> None:
    r = parse_chat({"messages": messages}, ServerConfig(rlm=RLMConfig.build(model="replay:")))
    asked = r.query.split("\n\nInstructions from")[0]
    assert asked.endswith(QUESTION) and len(asked) < 100, r.query   # the question, maybe an intro
    assert "ERROR" not in r.query
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    if system is not None:    # a short system prompt instructs the answer, it is not context
        assert r.query.endswith(f"Instructions from the chat's system prompt:\n{system}")
    doc = r.context["document"] if isinstance(r.context, dict) else r.context
    assert isinstance(doc, str) and LOG.strip() in doc and QUESTION not in doc
    assert len(doc) < len(LOG) + 100
    if sum(m["role"] in ("user", "assistant") for m in messages) > 1:   # earlier turns kept
        assert isinstance(r.context, dict) and set(r.context) == {"document", "conversation"}
        assert r.context["conversation"].startswith("[user]\n")


def test_long_system_prompt_is_a_document_and_unsplittable_text_stays_whole() -> None:
    cfg = ServerConfig(rlm=RLMConfig.build(model="replay:"))
    # `llm -s "$(cat app.log)" QUESTION`: the document is the system prompt.
    r = parse_chat({"messages": [{"role": "system", "content": LOG},
                                 {"role": "user", "content": QUESTION}]}, cfg)
    assert r.query == QUESTION and r.context == LOG
    # Open WebUI with the RAG template in the system message: the context is inside the tags.
    r = parse_chat({"messages": [
        {"role": "system", "content": OPEN_WEBUI_RAG.format(doc=LOG, q="")},
        {"role": "user", "content": QUESTION}]}, cfg)
    assert r.query == QUESTION and LOG in r.context and "### Task" not in r.context
    # No end of the message reads like a question: the whole message is the context and the
    # query shows both of its ends.
    r = parse_chat({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": LOG}]}, cfg)
    assert r.context == LOG.strip()
    assert LOG[:100] in r.query and LOG.rstrip()[-100:] in r.query
    assert r.query.endswith("Instructions from the chat's system prompt:\nbe brief")
    # A short message with a system prompt is not split.
    r = parse_chat({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "What is 2+2?\nThink."}]}, cfg)
    assert r.context == "What is 2+2?\nThink." and r.query.startswith("What is 2+2?\nThink.")


@pytest.mark.parametrize("body, needle", [
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "system", "content": "hi"}]}, "no user message"),
    ({"messages": [{"role": "user", "content": "   "}]}, "no text"),
    ({"messages": [{"role": "user", "content": "q"}], "context": ""}, "empty"),
    ({"messages": [{"role": "user", "content": "q"}], "recursa": {"max_bogus": 1}},
     "unknown limit"),
    ({"messages": [{"role": "user", "content": "q"}], "recursa": {"sub_model": "openai:x"}},
     "not allowed"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "needs image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "unsupported content part"),
    ({"messages": [{"role": "user", "content": "q"}], "n": 2}, "n=1"),
])
def test_parse_chat_rejects(body: dict[str, Any], needle: str) -> None:
    from recursa.server.common import RequestError
    with pytest.raises(RequestError, match=needle):
        parse_chat(body, ServerConfig(rlm=RLMConfig.build(model="replay:")))


# ---------------------------------------------------------------- end to end
@pytest.fixture
def boxes() -> CountingSandboxes:
    return CountingSandboxes()


@pytest.fixture
def server(boxes: CountingSandboxes) -> Iterator[Server]:
    with make_server(Scripted(echo_context_root), boxes,
                     max_iterations=4, max_cost_usd=5.0) as srv:
        yield srv


def test_models_and_auth(server: Server) -> None:
    ids = [m.id for m in server.client().models.list()]
    assert ids == ["recursa"]
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").models.list()
    assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").chat.completions.create(
            model="recursa", messages=[{"role": "user", "content": "q"}])
    assert httpx.get(server.base + "/health").json()["status"] == "ok"


def test_plain_completion_usage_and_cost(server: Server, boxes: CountingSandboxes) -> None:
    resp = server.client().chat.completions.create(
        model="recursa", messages=[{"role": "user", "content": "How big?"}],
        extra_body={"context": "a" * 1234})
    msg = resp.choices[0].message.content
    assert msg == "type=str size=1234 keys=- sub=sub answer"
    assert resp.choices[0].finish_reason == "stop"
    rec = resp.model_extra["recursa"]
    assert rec["status"] == "final" and rec["turns"] == 1 and rec["subcalls"] == 1
    assert set(rec["usage_by_role"]) == {"root", "sub"}
    # usage covers the root turn and the sub-call; cost is the scripted $0.001 per call
    root, sub = rec["usage_by_role"]["root"], rec["usage_by_role"]["sub"]
    assert resp.usage.prompt_tokens == root["input_tokens"] + sub["input_tokens"]
    assert resp.usage.completion_tokens == root["output_tokens"] + sub["output_tokens"]
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.usage.model_extra["cost"] == pytest.approx(0.002)
    assert rec["cost_usd"] == pytest.approx(0.002)
    assert boxes.started == 1 and boxes.open == 0


def test_history_context_and_files_become_a_dict(server: Server) -> None:
    data = base64.b64encode(b"hello file").decode()
    resp = server.client().chat.completions.create(model="recursa", messages=[
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": [
            {"type": "text", "text": "Summarise."},
            {"type": "file", "file": {"filename": "notes.txt", "file_data": data}}]}],
        extra_body={"context": ["r1", "r2"]})
    assert resp.choices[0].message.content.startswith(
        "type=dict size=3 keys=context,conversation,files")


def test_streaming_progress_answer_and_usage(server: Server, boxes: CountingSandboxes) -> None:
    stream = server.client().chat.completions.create(
        model="recursa", messages=[{"role": "user", "content": "How big?"}],
        extra_body={"context": "abc"}, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    progress = [c.model_extra.get("recursa_progress") for c in chunks
                if c.model_extra.get("recursa_progress")]
    lines = [p["line"] for p in progress]
    assert lines[0] == "turn 1" and any("sub-call to" in x for x in lines)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    assert "turn 1" in reasoning
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "type=str size=3 keys=- sub=sub answer"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    assert finish[0].model_extra["recursa"]["status"] == "final"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert chunks[-1].usage.model_extra["cost"] == pytest.approx(0.002)
    # progress is emitted as it happens: it precedes the answer
    first_content = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    first_progress = next(i for i, c in enumerate(chunks) if c.model_extra.get("recursa_progress"))
    assert first_progress < first_content
    assert boxes.open == 0


def test_stream_without_include_usage_has_no_usage_chunk(server: Server) -> None:
    chunks = list(server.client().chat.completions.create(
        model="recursa", messages=[{"role": "user", "content": "q"}], stream=True))
    assert all(c.choices for c in chunks)


def test_bad_requests_are_400_in_openai_shape(server: Server) -> None:
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="recursa", messages=[{"role": "system", "content": "x"}])
    assert "no user message" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": "q"}],
                                  extra_body={"context": []})
    assert e.value.body["param"] == "context"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": "q"}],
                                  extra_body={"recursa": {"sub_model": "openai:gpt-5"}})
    assert e.value.code == "sub_model_not_allowed"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": "q"}],
                                  extra_body={"recursa": {"strategy": "planned"}})
    assert e.value.body["param"] == "recursa.strategy" and "code, plan, auto" in e.value.message
    r = httpx.post(server.base + "/v1/chat/completions", content=b"{not json",
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_pasted_document_with_a_system_prompt_end_to_end(server: Server) -> None:
    """Issue 13 item 7 through the server: the log is the context the run sees."""
    resp = server.client().chat.completions.create(model="recursa", messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"{QUESTION}\n{LOG}"}])
    assert resp.choices[0].message.content.startswith(
        f"type=str size={len(LOG)} keys=-")


def test_unknown_routes_and_methods_are_openai_errors(server: Server) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    for method, path, status in [("GET", "/v1/nope", 404), ("POST", "/v1/embeddings", 404),
                                 ("POST", "/v1/completions", 404), ("GET", "/", 404),
                                 ("GET", "/v1/chat/completions", 405),
                                 ("DELETE", "/v1/models", 405), ("PUT", "/health", 405)]:
        r = httpx.request(method, server.base + path, headers=auth, json={})
        assert r.status_code == status, (method, path, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert path in err["message"] and err["type"] == "invalid_request_error"
        assert err["code"] == ("unknown_url" if status == 404 else "method_not_allowed")
        if status == 405:
            assert "GET" in r.headers["allow"] or "POST" in r.headers["allow"]
    # The official client raises its typed error for them.
    with pytest.raises(openai.NotFoundError):
        server.client().embeddings.create(model="recursa", input="x")


def test_per_request_limits_are_clamped(server: Server) -> None:
    resp = server.client().chat.completions.create(
        model="recursa", messages=[{"role": "user", "content": "q"}],
        extra_body={"recursa": {"max_iterations": 99, "max_cost_usd": 0.5}})
    rec = resp.model_extra["recursa"]
    assert rec["limits"] == {"max_iterations": 4, "max_cost_usd": 0.5}
    assert rec["clamped"] == ["max_iterations"]


def test_oversize_request_is_413_before_parsing() -> None:
    with make_server(Scripted(echo_context_root), max_request_bytes=4096) as srv:
        with pytest.raises(openai.APIStatusError) as e:
            srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}],
                extra_body={"context": "z" * 10_000})
        assert e.value.status_code == 413 and e.value.code == "request_too_large"

        def body() -> Iterator[bytes]:   # chunked, no Content-Length: caught while streaming
            yield b'{"messages": [{"role": "user", "content": "q"}], "context": "'
            for _ in range(10):
                yield b"z" * 1000
            yield b'"}'
        r = httpx.post(srv.base + "/v1/chat/completions", content=body(),
                       headers={"authorization": f"Bearer {KEY}",
                                "content-type": "application/json"})
        assert r.status_code == 413
        assert srv.app.state.slots.used == 0


def slow_root(messages: list[dict[str, Any]]) -> Any:
    async def later() -> str:
        await asyncio.sleep(60)
        return code("FINAL('too late')")
    return later()


def test_concurrency_limit_429() -> None:
    boxes = CountingSandboxes()
    with make_server(Scripted(slow_root), boxes, max_runs=1) as srv:
        busy = srv.client(timeout=3)   # gives up (and disconnects) after 3 s
        t = threading.Thread(target=lambda: _swallow(lambda: busy.chat.completions.create(
            model="recursa", messages=[{"role": "user", "content": "q"}])), daemon=True)
        t.start()
        wait_for(lambda: boxes.started == 1)
        with pytest.raises(openai.RateLimitError) as e:
            srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}])
        assert e.value.code == "concurrency_limit"
        assert e.value.response.headers["retry-after"] == "1"
        t.join(10)   # the first client timed out and dropped its connection: run cancelled
        wait_for(lambda: boxes.open == 0 and srv.app.state.slots.used == 0)


def _swallow(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        pass


def test_disconnect_cancels_plain_run_and_closes_sandbox() -> None:
    boxes = CountingSandboxes()
    with make_server(Scripted(slow_root), boxes) as srv:
        with pytest.raises(openai.APITimeoutError):
            srv.client(timeout=1.0).chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}])
        wait_for(lambda: boxes.closed == 1 and srv.app.state.slots.used == 0, timeout=5)
        assert boxes.started == 1


def test_disconnect_cancels_streaming_run_and_closes_sandbox() -> None:
    boxes = CountingSandboxes()
    with make_server(Scripted(slow_root), boxes) as srv:
        stream = srv.client(timeout=30).chat.completions.create(
            model="recursa", messages=[{"role": "user", "content": "q"}], stream=True)
        first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
        wait_for(lambda: boxes.started == 1)
        stream.close()
        wait_for(lambda: boxes.closed == 1 and srv.app.state.slots.used == 0, timeout=5)


def test_disconnect_kills_a_running_local_sandbox_cell() -> None:
    """With the isolated worker: a cell busy sleeping is ended with the run."""
    boxes = CountingSandboxes("local")
    root = Scripted(lambda m: code("import time\ntime.sleep(60)\nFINAL('late')"))
    with make_server(root, boxes, cell_timeout=120) as srv:
        with pytest.raises(openai.APITimeoutError):
            srv.client(timeout=2.0).chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}])
        wait_for(lambda: boxes.closed == 1, timeout=10)


def test_failed_run_is_502() -> None:
    def broken(messages: list[dict[str, Any]]) -> str:
        from recursa.base.types import ModelError
        raise ModelError("upstream exploded")
    with make_server(Scripted(broken)) as srv:
        with pytest.raises(openai.APIStatusError) as e:
            srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}])
        assert e.value.status_code == 502 and "upstream exploded" in e.value.message
        with pytest.raises(openai.APIError, match="upstream exploded"):
            list(srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}], stream=True))


def test_limit_reached_is_finish_reason_length() -> None:
    with make_server(Scripted(lambda m: code("answer['content'] = 'partial'")),
                     max_iterations=1) as srv:
        resp = srv.client().chat.completions.create(
            model="recursa", messages=[{"role": "user", "content": "q"}])
        assert resp.model_extra["recursa"]["status"] in ("extracted", "limit")
        assert resp.choices[0].message.content


def test_no_api_key_means_open_server() -> None:
    with make_server(Scripted(echo_context_root), api_key=None) as srv:
        assert srv.client(key="anything").models.list().data[0].id == "recursa"


# ---------------------------------------------------------------- overhead
@pytest.mark.slow
def test_measure_server_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    """Median time of a request through the server vs a direct acompletion (same script)."""
    scripted = Scripted(lambda m: code("FINAL('ok')"))
    n = 30
    direct: list[float] = []

    async def direct_runs() -> None:   # one event loop, as the server has
        for _ in range(n + 1):
            rlm = RLM(model=scripted.root, sub_model=scripted.sub, sandbox="inprocess")
            t0 = time.perf_counter()
            await rlm.acompletion("q", "ctx")
            direct.append(time.perf_counter() - t0)
    asyncio.run(direct_runs())
    direct = direct[1:]   # the first run warms imports up
    served: list[float] = []
    with make_server(scripted) as srv:
        c = srv.client()
        c.chat.completions.create(model="recursa", messages=[{"role": "user", "content": "q"}])
        for _ in range(n):
            t0 = time.perf_counter()
            c.chat.completions.create(model="recursa",
                                      messages=[{"role": "user", "content": "q"}],
                                      extra_body={"context": "ctx"})
            served.append(time.perf_counter() - t0)
    d, s = statistics.median(direct), statistics.median(served)
    with capsys.disabled():
        print(f"\nserver overhead: direct {d * 1000:.1f} ms, served {s * 1000:.1f} ms, "
              f"overhead {(s - d) * 1000:.1f} ms (median of {n})")
    assert s - d < 0.5


def test_progress_field_mode_and_keepalive() -> None:
    def slowish(messages: list[dict[str, Any]]) -> Any:
        async def later() -> str:
            await asyncio.sleep(0.5)
            return code("FINAL('done')")
        return later()
    with make_server(Scripted(slowish), progress="field", keepalive_s=0.1) as srv:
        with httpx.stream("POST", srv.base + "/v1/chat/completions", json={
                "model": "recursa", "stream": True,
                "messages": [{"role": "user", "content": "q"}]},
                headers={"authorization": f"Bearer {KEY}"}, timeout=10) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = "".join(r.iter_text())
    assert ": keep-alive" in raw
    events = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    progress = [e for e in events if "recursa_progress" in e]
    assert progress and all(e["choices"][0]["delta"] == {} for e in progress)
    assert raw.rstrip().endswith("data: [DONE]")


def test_serve_refuses_public_host_without_key(tmp_path: Any) -> None:
    from recursa.cli import main
    assert main(["serve", "--model", "replay:", "--host", "0.0.0.0", "--port", "1"]) == 2
    from recursa.server.cli import _is_loopback
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0")


def test_rlm_that_cannot_be_built_is_500_json() -> None:
    def factory(cfg: ServerConfig, spec: RunSpec) -> RLM:
        raise ValueError("model spec 'nope': no provider prefix")
    app = create_app(ServerConfig(rlm=RLMConfig.build(model="replay:"), rlm_factory=factory))
    with Server(app) as srv:
        with pytest.raises(openai.InternalServerError) as e:
            srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}])
        assert "no provider prefix" in e.value.message
        wait_for(lambda: app.state.slots.used == 0)


def test_full_chain_through_a_real_upstream_http_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """openai client -> recursa server (default RLM factory) -> OpenAIClient -> an HTTP model.

    The server's own key is never sent upstream. (For a custom base_url the OpenAI client sends
    no environment key at all, by design of recursa.models: OPENAI_API_KEY goes only to OpenAI.)
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from openai_testserver import OpenAITestServer

    def upstream_model(req: dict[str, Any]) -> str:
        last = req["messages"][-1]["content"]
        if "summarise" in str(last):
            return "a short summary"
        return code("s = llm_query('summarise this')\nFINAL('upstream says: ' + s)")

    monkeypatch.setenv("OPENAI_API_KEY", "sk-upstream-key-for-tests-0000")
    with OpenAITestServer(responder=upstream_model) as up:
        cfg = ServerConfig(rlm=RLMConfig.build(model="openai:test-model", base_url=up.base_url,
                                               sandbox="inprocess", max_iterations=3),
                           api_key=KEY)
        with Server(create_app(cfg)) as srv:
            for _ in range(3):
                resp = srv.client().chat.completions.create(
                    model="recursa", messages=[{"role": "user", "content": "q"}],
                    extra_body={"context": "some text"})
            # Every request's RLM used the one shared upstream client, whose keep-alive
            # connection served all six requests (they came one after another).
            shared = list(cfg.shared_clients.values())
            assert len(shared) == 1
            pools = shared[0].adapter.pool._clients        # the httpx pool shards of the server's loop
            assert sum(len(c._transport.pool.connections) for c in pools) == 1
        assert resp.choices[0].message.content == "upstream says: a short summary"
        assert up.request_count == 6                      # a root turn and a sub-call each
        auth = {h.get("authorization") for h in up.headers}
        assert auth and not any(KEY in (a or "") or "sk-upstream" in (a or "") for a in auth)
        rec = resp.model_extra["recursa"]
        assert rec["usage_by_role"]["root"]["calls"] == 1
        assert rec["usage_by_role"]["sub"]["calls"] == 1
        assert resp.usage.total_tokens == rec["total_tokens"] > 0


def test_the_serve_command_shares_its_upstream_clients_between_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The app `recursa serve` builds gives every request's RLM the server's shared model client
    (not a client of its own per request, with its own connections, closed at the end)."""
    import argparse
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from openai_testserver import OpenAITestServer
    from recursa.server import cli as server_cli
    from recursa.server import openai_app

    apps: list[Any] = []
    monkeypatch.setattr(openai_app, "serve", lambda app, **kw: apps.append(app))
    parser = argparse.ArgumentParser()
    server_cli.register(parser.add_subparsers())

    def upstream_model(req: dict[str, Any]) -> str:
        if "summarise" in str(req["messages"][-1]["content"]):
            return "a short summary"
        return code("s = llm_query('summarise this')\nFINAL('upstream says: ' + s)")

    with OpenAITestServer(responder=upstream_model) as up:
        a = parser.parse_args(["serve", "--model", "openai:test-model", "--base-url",
                               up.base_url, "--sandbox", "inprocess", "--api-key", KEY,
                               "--max-iterations", "3"])
        assert a.fn(a) == 0 and len(apps) == 1
        with Server(apps[0]) as srv:
            for _ in range(3):
                resp = srv.client().chat.completions.create(
                    model="recursa", messages=[{"role": "user", "content": "q"}],
                    extra_body={"context": "some text"})
            shared = list(apps[0].state.config.shared_clients.values())
            assert len(shared) == 1
            pools = shared[0].adapter.pool._clients
            assert sum(len(c._transport.pool.connections) for c in pools) == 1
    assert resp.choices[0].message.content == "upstream says: a short summary"
    assert up.request_count == 6


def test_progress_is_streamed_while_the_run_is_still_going() -> None:
    """The second root turn waits until the client has *received* progress of the first: were
    progress buffered until the end, it would wait in vain."""
    seen = threading.Event()
    calls = []

    def root(messages: list[dict[str, Any]]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return code("print('step one')")

        async def second() -> str:
            for _ in range(200):
                if seen.is_set():
                    return code("FINAL('saw progress live')")
                await asyncio.sleep(0.05)
            return code("FINAL('progress never arrived')")
        return second()

    with make_server(Scripted(root)) as srv:
        answer = ""
        for chunk in srv.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}], stream=True):
            if chunk.model_extra.get("recursa_progress"):
                seen.set()
            if chunk.choices and chunk.choices[0].delta.content:
                answer += chunk.choices[0].delta.content
    assert answer == "saw progress live"


# ---------------------------------------------------------------- typed answers
def test_response_format_json_schema_validates_and_retries() -> None:
    """The first committed answer misses a field and is sent back; the reply is the valid JSON."""
    def root(messages: list[dict[str, Any]]) -> str:
        if any("does not match" in str(m.get("content")) for m in messages):
            return code('FINAL(\'{"city": "Oslo", "people": 709000}\')')
        return code("FINAL('{\"city\": \"Oslo\"}')")
    schema = {"type": "object", "required": ["city", "people"],
              "properties": {"city": {"type": "string"}, "people": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    with make_server(Scripted(root)) as server:
        c = server.client()
        resp = c.chat.completions.create(model="recursa", response_format=fmt,
                                         messages=[{"role": "user", "content": "Which city?"}],
                                         extra_body={"context": "Oslo has 709000 people."})
        assert json.loads(resp.choices[0].message.content) == {"city": "Oslo", "people": 709000}
        rec = resp.model_extra["recursa"]
        assert rec["output_error"] is None and rec["turns"] == 2
        chunks = list(c.chat.completions.create(
            model="recursa", response_format=fmt, stream=True,
            messages=[{"role": "user", "content": "Which city?"}],
            extra_body={"context": "Oslo has 709000 people."}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert json.loads(text)["people"] == 709000
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
        assert e.value.body["param"] == "response_format"


def test_a_cost_cap_on_an_unpriced_model_is_a_400_and_spends_nothing() -> None:
    calls: list[int] = []

    def root(messages: list[dict[str, Any]]) -> str:
        calls.append(1)
        return code("FINAL('x')")
    with make_server(Scripted(root, cost=None)) as server:
        with pytest.raises(openai.BadRequestError) as e:
            server.client().chat.completions.create(
                model="recursa", messages=[{"role": "user", "content": "q"}],
                extra_body={"context": "c", "recursa": {"max_cost_usd": 0.01}})
        assert e.value.code == "preflight_failed" and "price" in e.value.message
        assert calls == []
