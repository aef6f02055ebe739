"""`recursa serve --route auto`: a short request is answered by one model call, a long one by
the RLM; the response names the path (header and `recursa.route`)."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers_server import KEY, CountingSandboxes, Scripted, code, make_server  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402


def test_serve_route_auto_answers_both_paths_and_names_them() -> None:
    boxes = CountingSandboxes()
    scripted = Scripted(lambda m: code("FINAL('looped')") if "REPL" in str(m) else "direct!")
    scripted.root = ReplayClient(scripted.root._fn, name="replay:root", context_window=4096)
    with make_server(scripted, boxes, route="auto", sessions=4) as srv:
        url = srv.base + "/v1/chat/completions"
        auth = {"authorization": f"Bearer {KEY}"}
        short = httpx.post(url, headers=auth, json={
            "model": "recursa", "messages": [{"role": "user", "content": "2+2?"}]})
        assert short.status_code == 200, short.text
        assert short.headers["x-recursa-route"] == "direct"
        body = short.json()
        assert body["choices"][0]["message"]["content"] == "direct!"
        assert body["recursa"]["route"] == "direct" and boxes.started == 0
        long = srv.client().chat.completions.with_raw_response.create(
            model="recursa", messages=[{"role": "user", "content": "How long?"}],
            extra_body={"context": "lorem ipsum " * 2000})
        assert long.headers["x-recursa-route"] == "rlm"
        resp = long.parse()
        assert resp.choices[0].message.content == "looped"
        assert resp.model_extra["recursa"]["route"] == "rlm" and boxes.started == 1
        # a request may pick its own path
        forced = httpx.post(url, headers=auth, json={
            "model": "recursa", "messages": [{"role": "user", "content": "2+2?"}],
            "recursa": {"route": "rlm"}})
        assert forced.headers["x-recursa-route"] == "rlm"
        stream = httpx.post(url, headers=auth, json={
            "model": "recursa", "stream": True,
            "messages": [{"role": "user", "content": "2+2?"}]})
        assert stream.headers["x-recursa-route"] == "direct" and "direct!" in stream.text
        bad = httpx.post(url, headers=auth, json={
            "model": "recursa", "messages": [{"role": "user", "content": "q"}],
            "recursa": {"route": "fast"}})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "recursa.route"
        assert "route must be one of rlm, direct, auto" in bad.json()["error"]["message"]
