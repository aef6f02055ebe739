"""The server's `recursa` field carries the answer's checked sources: the official openai client
against a real uvicorn server in a thread, a scripted root model, an in-process sandbox."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from recursa.core import prompts  # noqa: E402
from recursa.core.config import RLMConfig  # noqa: E402
from recursa.core.rlm import RLM  # noqa: E402
from recursa.models.replay import ReplayClient  # noqa: E402
from recursa.server.openai_app import RunSpec, ServerConfig, create_app  # noqa: E402

DOC = "Minutes.\nThe Ada meeting was held in Lyon on 3 May.\nNothing else happened.\n"
COMMIT = ('```repl\nFINAL("Lyon", sources=["The Ada meeting was held in Lyon", '
          '"It was held in Paris, said the minutes"])\n```')


@pytest.fixture
def served() -> Iterator[tuple[str, ReplayClient]]:
    root = ReplayClient(lambda m: COMMIT, name="replay:root")

    def factory(cfg: ServerConfig, spec: RunSpec) -> RLM:
        return RLM(config=cfg.rlm.replace(sandbox="inprocess", on_event=spec.on_event))
    app = create_app(ServerConfig(rlm=RLMConfig.build(model=root), rlm_factory=factory,
                                  sessions=0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", root
    finally:
        server.should_exit = True
        thread.join(10)


def ask(base: str, **recursa: Any) -> Any:
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
    return client.chat.completions.create(
        model="recursa", messages=[{"role": "user", "content": "Where was the Ada meeting?"}],
        extra_body={"context": DOC, **({"recursa": recursa} if recursa else {})})


def test_response_carries_checked_sources_and_the_request_asks_for_them(served):
    base, root = served
    resp = ask(base, sources=True)
    assert resp.choices[0].message.content == "Lyon"
    rec = resp.model_extra["recursa"]
    assert rec["sources_verified"] is False          # one of the two is not in the document
    found, unfound = rec["sources"]
    assert found["found"] is True and found["match"] == "exact"
    assert found["location"]["line"] == 2 and found["location"]["label"] == "line 2"
    assert found["text"] == "The Ada meeting was held in Lyon"
    assert unfound["found"] is False and unfound["note"] == "not found in the context"
    # `recursa.sources: true` put the rule in the root's prompt
    assert prompts.SOURCES in root.calls[-1][0]["content"]


def test_sources_are_reported_without_asking_and_bad_values_are_refused(served):
    base, root = served
    rec = ask(base).model_extra["recursa"]
    assert len(rec["sources"]) == 2                   # the model gave them: they are checked
    assert prompts.SOURCES not in root.calls[-1][0]["content"]
    with pytest.raises(openai.BadRequestError, match="sources must be true or false"):
        ask(base, sources="yes")
