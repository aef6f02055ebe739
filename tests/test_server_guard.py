"""`recursa serve` cannot be driven by a web page: the real command, real HTTP clients (the
official openai SDK, curl, httpx as a browser would send), one test per refusal and per client
that must keep working."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from recursa.server.common import unconfined_on_network  # noqa: E402
from recursa.server.guard import RequestPolicy, host_name  # noqa: E402
from serve_process import ServeProcess, recursa_serve  # noqa: E402

UI = "http://localhost:3000"        # where an Open WebUI-style chat UI is served from
ASK = {"model": "recursa", "messages": [{"role": "user", "content": "How long is it?"}],
       "context": "abcdef"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServeProcess]]:
    """The real command, with no --api-key (so it makes one up) and one allowed web origin."""
    script = tmp_path_factory.mktemp("guard") / "script.json"
    script.write_text(json.dumps({"cycle": [
        "```repl\nFINAL('context has ' + str(len(context)) + ' chars')\n```"]}))
    with recursa_serve("--model", f"replay-file:{script}", "--sandbox", "inprocess",
                       "--allow-origin", UI, "--log-level", "warning") as (base, proc):
        yield base, proc


def key_of(served: tuple[str, ServeProcess]) -> str:
    key = served[1].printed_key
    assert key, served[1].output()
    return key


def post(base: str, body: bytes | str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", content=body, headers=headers, timeout=30)


# ---------------------------------------------------------------- what keeps working
def test_a_loopback_server_makes_up_a_key_and_the_openai_client_uses_it(served: Any) -> None:
    base, proc = served
    key = key_of(served)
    assert len(key) >= 32 and key in proc.output()
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    resp = client.chat.completions.create(model="recursa", messages=ASK["messages"],
                                          extra_body={"context": "abcdef"})
    assert resp.choices[0].message.content == "context has 6 chars"
    streamed = client.chat.completions.create(model="recursa", messages=ASK["messages"],
                                              extra_body={"context": "abcdef"}, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        "context has 6 chars"
    # without the key, or with another, the client gets its usual error
    for wrong in ("none", "sk-" + "0" * 40):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key=wrong,
                          max_retries=0).models.list()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_with_json_works_and_curl_with_a_form_body_is_415(served: Any) -> None:
    base, _ = served
    key = key_of(served)
    url = base + "/v1/chat/completions"
    auth = ["-H", f"Authorization: Bearer {key}"]
    ok = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *auth, "--json",
                         json.dumps(ASK), url], capture_output=True, text=True, timeout=30)
    body, status = ok.stdout.rsplit("\n", 1)
    assert status == "200", ok.stdout
    assert json.loads(body)["choices"][0]["message"]["content"] == "context has 6 chars"
    # `curl -d` sends application/x-www-form-urlencoded, a type any page may POST
    form = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *auth, "-d", json.dumps(ASK),
                           url], capture_output=True, text=True, timeout=30)
    body, status = form.stdout.rsplit("\n", 1)
    assert status == "415" and json.loads(body)["error"]["code"] == "unsupported_media_type"


def test_an_allowed_origin_gets_cors_and_its_requests_are_answered(served: Any) -> None:
    """A browser chat UI the user allowed (--allow-origin): the preflight, then the call."""
    base, _ = served
    key = key_of(served)
    pre = httpx.options(base + "/v1/chat/completions", headers={
        "Origin": UI, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == UI
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    r = post(base, json.dumps(ASK), {"Origin": UI, "Content-Type": "application/json",
                                     "Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == UI
    # the official client, sending the UI's origin as a browser would
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0,
                           default_headers={"Origin": UI})
    assert [m.id for m in client.models.list()] == ["recursa"]


def test_same_origin_and_localhost_are_this_server(served: Any) -> None:
    base, _ = served
    port = base.rsplit(":", 1)[1]
    key = key_of(served)
    for host, origin in ((f"127.0.0.1:{port}", base), (f"localhost:{port}", None),
                         (f"[::1]:{port}", None)):
        headers = {"Host": host, "Authorization": f"Bearer {key}"}
        if origin:
            headers["Origin"] = origin
        assert httpx.get(base + "/v1/models", headers=headers).status_code == 200, host


# ---------------------------------------------------------------- what is refused
def test_dns_rebinding_a_foreign_host_is_refused(served: Any) -> None:
    """A page on evil.example whose name now resolves to 127.0.0.1: its requests name its own
    host. Refused even with the right key and a JSON body."""
    base, _ = served
    port = base.rsplit(":", 1)[1]
    key = key_of(served)
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("GET", "/health")):
        r = httpx.request(method, base + path, headers={
            "Host": f"evil.example:{port}", "Content-Type": "application/json",
            "Authorization": f"Bearer {key}"}, content=json.dumps(ASK) if method == "POST"
            else None)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "host_not_allowed"


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_dns_rebinding_through_a_resolver_is_refused(served: Any) -> None:
    """The same as a browser does it: the name resolves to 127.0.0.1 (curl --resolve)."""
    base, _ = served
    port = base.rsplit(":", 1)[1]
    r = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--resolve",
                        f"evil.example:{port}:127.0.0.1", f"http://evil.example:{port}/v1/models"],
                       capture_output=True, text=True, timeout=30)
    body, status = r.stdout.rsplit("\n", 1)
    assert status == "403" and "evil.example" in json.loads(body)["error"]["message"]


def test_a_foreign_origin_is_refused_even_with_the_key(served: Any) -> None:
    base, _ = served
    key = key_of(served)
    for origin in ("http://evil.example", "null", "http://localhost:3001"):
        r = post(base, json.dumps(ASK), {"Origin": origin, "Content-Type": "application/json",
                                         "Authorization": f"Bearer {key}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        pre = httpx.options(base + "/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    r = httpx.get(base + "/v1/models", headers={"Origin": "http://evil.example",
                                                "Authorization": f"Bearer {key}"})
    assert r.status_code == 403


@pytest.mark.parametrize("content_type", [None, "text/plain", "text/plain;charset=UTF-8",
                                          "multipart/form-data; boundary=x",
                                          "application/x-www-form-urlencoded"])
def test_a_post_body_that_is_not_declared_json_is_415(served: Any,
                                                      content_type: str | None) -> None:
    """The types a page may POST without a CORS preflight, and none at all (a Blob body)."""
    base, _ = served
    key = key_of(served)
    headers = {"Authorization": f"Bearer {key}"}
    if content_type:
        headers["Content-Type"] = content_type
    r = post(base, json.dumps(ASK).encode(), headers)
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("body", ["[" * 100_000, '{"a":' * 50_000, "[" * 100_000 + "]" * 100_000,
                                  '{"messages": ' + "[" * 200 + "]" * 200 + "}"])
def test_json_of_any_depth_is_a_400(served: Any, body: str) -> None:
    base, proc = served
    key = key_of(served)
    r = post(base, body, {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert proc.poll() is None


def test_no_token_serves_without_a_key() -> None:
    with recursa_serve("--model", "replay:", "--sandbox", "inprocess", "--no-token",
                       "--log-level", "warning") as (base, proc):
        assert proc.printed_key is None
        assert httpx.get(base + "/v1/models").status_code == 200
        assert "auth OFF" in proc.output()


def test_a_given_key_is_used_and_not_printed() -> None:
    key = "my-own-server-key-0123456789"
    with recursa_serve("--model", "replay:", "--sandbox", "inprocess", "--api-key", key,
                       "--log-level", "warning") as (base, proc):
        assert proc.printed_key is None and key not in proc.output()
        assert httpx.get(base + "/v1/models").status_code == 401
        assert httpx.get(base + "/v1/models",
                         headers={"Authorization": f"Bearer {key}"}).status_code == 200


# ---------------------------------------------------------------- unconfined sandboxes
def test_serve_refuses_an_unconfined_sandbox_on_a_non_loopback_address() -> None:
    r = subprocess.run([sys.executable, "-m", "recursa.cli", "serve", "--model", "replay:",
                        "--sandbox", "inprocess", "--host", "0.0.0.0", "--api-key", "k" * 20,
                        "--port", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "refusing to serve sandbox 'inprocess' on 0.0.0.0" in r.stderr
    assert "does not isolate" in r.stderr
    for kind in ("limits", "inprocess", "in-process"):
        assert unconfined_on_network(kind, "192.168.1.5", is_loopback=False)
        assert unconfined_on_network(kind, "127.0.0.1", is_loopback=True) is None
    for kind in ("local", "docker", "modal", "wasm"):
        assert unconfined_on_network(kind, "0.0.0.0", is_loopback=False) is None


def test_which_sandboxes_serve_beyond_loopback_is_what_their_kinds_declare() -> None:
    from recursa.sandbox.kinds import KINDS, SandboxKind, kind_names, register_sandbox
    register_sandbox(SandboxKind("bare-host", lambda **o: None, "runs as you",  # type: ignore
                                 isolates=False))
    register_sandbox(SandboxKind("walled", lambda **o: None, "a VM"))   # type: ignore
    try:
        msg = unconfined_on_network("bare-host", "192.168.1.5", is_loopback=False)
        assert msg is not None and "does not isolate" in msg
        assert unconfined_on_network("walled", "192.168.1.5", is_loopback=False) is None
        # the way out names every kind that isolates, this process's own included
        named = msg.split("isolating sandbox (", 1)[1].split(")", 1)[0].split(", ")
        assert named == kind_names(isolates=True) and "wasm" in named and "walled" in named
    finally:
        KINDS.unregister("bare-host")
        KINDS.unregister("walled")


# ---------------------------------------------------------------- the policy
def test_host_policy_by_bound_address() -> None:
    assert host_name("Example.COM:8000") == "example.com" and host_name("[::1]:80") == "::1"
    lo = RequestPolicy.for_bind("127.0.0.1")
    assert lo.host_allowed("127.0.0.1:8000") and lo.host_allowed("localhost:8000")
    assert lo.host_allowed("[::1]:8000") and lo.host_allowed(None)
    assert not lo.host_allowed("evil.example:8000") and not lo.host_allowed("10.0.0.5:8000")
    assert not lo.host_allowed("localhost.evil.example")
    lan = RequestPolicy.for_bind("192.168.1.5", allow_hosts=["llm.example.org"])
    assert lan.host_allowed("192.168.1.5:8000") and lan.host_allowed("llm.example.org")
    assert not lan.host_allowed("localhost:8000") and not lan.host_allowed("evil.example")
    anyif = RequestPolicy.for_bind("0.0.0.0")
    assert anyif.host_allowed("10.1.2.3:8000") and anyif.host_allowed("localhost")
    assert not anyif.host_allowed("evil.example")
    assert RequestPolicy.for_bind("127.0.0.1", allow_hosts=["*"]).host_allowed("a.b")
    assert lo.origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not lo.origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8000")
    ui = RequestPolicy.for_bind("127.0.0.1", allow_origins=["http://LOCALHOST:3000/"])
    assert ui.origin_allowed("http://localhost:3000", "127.0.0.1:8000")

