"""`recursa serve`'s app in a real uvicorn server on a thread (an ephemeral loopback port), with
scripted root and sub-models and a sandbox factory that counts what it started and closed.
Importers skip first when openai, uvicorn or starlette is missing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import uvicorn

from helpers_scripted import repl as code  # a root reply: one code block
from recursa.core.config import RLMConfig
from recursa.core.rlm import RLM
from recursa.models.replay import ReplayClient
from recursa.sandbox import make_sandbox
from recursa.server.openai_app import RunSpec, ServerConfig, create_app

__all__ = ["KEY", "CountingSandboxes", "Scripted", "Server", "code", "make_server"]

KEY = "test-server-key-123"


class CountingSandboxes:
    """Wraps a sandbox kind; counts sandboxes started and closed, so tests can see cleanup."""

    def __init__(self, kind: str = "inprocess"):
        self.kind = kind
        self.started = 0
        self.closed = 0
        self.lock = threading.Lock()

    @property
    def open(self) -> int:
        with self.lock:
            return self.started - self.closed

    def __call__(self) -> Any:
        inner = make_sandbox(self.kind)
        counter = self

        class Counted:
            isolation = inner.isolation

            async def start(self, payload: Any, handler: Any) -> None:
                with counter.lock:
                    counter.started += 1
                await inner.start(payload, handler)

            async def run(self, code: str, **kw: Any) -> Any:
                return await inner.run(code, **kw)

            async def close(self) -> None:
                try:
                    await inner.close()
                finally:
                    with counter.lock:
                        counter.closed += 1
        return Counted()


class Scripted:
    """Root and sub-model responders; the root one is a function of the first user message."""

    def __init__(self, root: Callable[[list[dict[str, Any]]], Any],
                 sub: Callable[[list[dict[str, Any]]], Any] | None = None,
                 cost: float | None = 0.001):
        self.root = ReplayClient(root, name="replay:root", cost_usd=cost)
        self.sub = ReplayClient(sub or (lambda m: "sub answer"), name="replay:sub",
                                cost_usd=cost)


class Server:
    def __init__(self, app: Any):
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def client(self, key: str | None = KEY, **kw: Any) -> Any:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key or "none", max_retries=0,
                             **kw)


def make_server(scripted: Scripted, sandboxes: CountingSandboxes | None = None,
                **config: Any) -> Server:
    boxes = sandboxes or CountingSandboxes()

    def factory(cfg: ServerConfig, spec: RunSpec) -> RLM:
        hook = {"on_event": spec.on_event} if spec.on_event else {}
        return RLM(config=cfg.rlm.replace(sub_model=scripted.sub, sandbox=boxes, **hook))
    # RLM keywords (route, cell_timeout, ...) configure the runs, the rest the server
    # (`api_key` is the key clients present to it)
    rlm = RLMConfig.build(model=scripted.root, **{
        k: config.pop(k) for k in list(config) if k in RLMConfig.KEYWORDS and k != "api_key"})
    config.setdefault("api_key", KEY)
    config.setdefault("sessions", 0)   # one sandbox per request here (test_server_sessions.py)
    cfg = ServerConfig(rlm=rlm, rlm_factory=factory, **config)
    return Server(create_app(cfg))
