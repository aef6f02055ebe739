"""recursa sandbox worker: a persistent Python REPL driven over framed messages.

This file is a standalone program. It uses only the standard library and is started with a
bare interpreter (``python -I -S worker.py``), possibly inside bubblewrap or a container, where
recursa itself is not importable. The host also imports it by file path to reuse the ``Repl``
class for the in-process sandbox, so importing it must have no side effects.

Wire format and messages are documented in ``recursa/sandbox/protocol.py``.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import linecache
import os
import queue
import signal
import struct
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

PROTOCOL_VERSION = 1
_HEADER = struct.Struct(">I")
_MAX_FRAME = 1 << 30
# Parsing and compiling cells is serialised: CPython before 3.11.9 / 3.12.3 fails two threads
# that build ASTs at once ("AST constructor recursion depth mismatch", python/cpython#106905). A
# worker process compiles one cell at a time anyway; the in-process sandbox runs many REPLs in
# the host's threads and replaces this with the host's own lock (recursa.base.locks.AST_LOCK).
AST_LOCK = threading.Lock()

# Names the REPL defines itself; never reported as user variables.
HELPER_NAMES = (
    "llm_query", "llm_batch", "llm_query_batched",
    "rlm_query", "rlm_batch", "rlm_query_batched",
    "FINAL", "FINAL_VAR", "SHOW_VARS", "Image", "list_images", "search",
    "chunk", "llm_map", "llm_filter", "llm_rank", "llm_reduce", "pairs",
)
RESERVED_NAMES = frozenset(HELPER_NAMES) | {"context", "answer"}
# host functions (Repl.define_functions): JSON-schema types as annotations, and the errors the
# host may name for a failed call (anything else raises RuntimeError)
_ANNOTATIONS = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                "object": dict}
_HOST_ERRORS = {"PermissionError": PermissionError, "ValueError": ValueError,
                "TimeoutError": TimeoutError, "RuntimeError": RuntimeError}


# ------------------------------------------------------------------ output capture
class Capture:
    """Keeps the first `limit` characters written and counts all of them (O(limit) memory)."""

    def __init__(self, limit: int):
        self.limit = max(0, int(limit))
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        with self._lock:
            self.total += n
            room = self.limit - self.kept
            if room > 0:
                part = s[:room]
                self.parts.append(part)
                self.kept += len(part)
        return n

    def getvalue(self) -> str:
        return "".join(self.parts)


class StreamRouter(io.TextIOBase):
    """Stands in for sys.stdout / sys.stderr and sends writes to the right Capture.

    Captures are registered per thread. A write from an unregistered thread (e.g. one started by
    user code) goes to the only active capture if there is exactly one -- always the case in the
    worker process -- and otherwise to the original stream.
    """

    def __init__(self, fallback: Any, name: str):
        super().__init__()
        self._fallback = fallback
        self._name = name
        self._by_thread: dict[int, Capture] = {}
        self._lock = threading.Lock()

    def register(self, ident: int, capture: Capture) -> None:
        with self._lock:
            self._by_thread[ident] = capture

    def unregister(self, ident: int) -> None:
        with self._lock:
            self._by_thread.pop(ident, None)

    def active(self) -> int:
        return len(self._by_thread)

    def _target(self) -> Any:
        cap = self._by_thread.get(threading.get_ident())
        if cap is not None:
            return cap
        with self._lock:
            if len(self._by_thread) == 1:
                return next(iter(self._by_thread.values()))
        return self._fallback

    def write(self, s: str) -> int:  # type: ignore[override]
        target = self._target()
        if target is None:
            return len(s)
        return target.write(s)

    def writelines(self, lines: Any) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        target = self._target()
        if target is not None and hasattr(target, "flush"):
            try:
                target.flush()
            except Exception:
                pass

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def name(self) -> str:
        return self._name


# ------------------------------------------------------------------ the REPL
Caller = Callable[[str, dict], Any]


def _cap_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [truncated, {len(text)} chars in total]"


def _tokens(text: str) -> int:
    # recursa.core.dispatch.text_tokens: ~4 ASCII characters a token, ~1 token a character otherwise
    extra = len(text.encode("utf-8", errors="surrogatepass")) - len(text)
    return (len(text) + 2 * extra + 3) // 4


# what an answer's sources may carry to the host (recursa/core/sources.py checks them there)
MAX_SOURCES = 20
MAX_SOURCE_CHARS = 20000
_SOURCE_KEYS = ("text", "start", "end", "item")


def _answer_sources(value: Any) -> list:
    """`answer["sources"]` as plain JSON: up to MAX_SOURCES quotes (str) or dicts with a text
    and, like a search() hit, its span (start, end, item); anything else as its str()."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    out: list = []
    for x in items[:MAX_SOURCES]:
        if isinstance(x, dict):
            d = {k: x[k] for k in _SOURCE_KEYS if k in x}
            d["text"] = str(d.get("text", ""))[:MAX_SOURCE_CHARS]
            for k in ("start", "end"):
                if k in d and not (isinstance(d[k], int) and not isinstance(d[k], bool)):
                    del d[k]
            if "item" in d and not isinstance(d["item"], str | int):
                d["item"] = str(d["item"])
            out.append(d)
        else:
            out.append((x if isinstance(x, str) else str(x))[:MAX_SOURCE_CHARS])
    return out


def _safe_repr(value: Any, limit: int) -> str:
    # Avoid building a 40 MB repr only to throw most of it away.
    if isinstance(value, str | bytes | bytearray) and len(value) > limit:
        return repr(value[:limit]) + f"... [truncated, {len(value)} items in total]"
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not fail the cell
        text = f"<repr failed: {type(exc).__name__}: {exc}>"
    return _cap_text(text, limit)


class Repl:
    """The REPL namespace and cell execution, shared by the worker process and the host.

    `call(kind, args)` sends a request to the host and returns its result (blocking the calling
    thread). `stdout` / `stderr` are StreamRouters installed as sys.stdout / sys.stderr.
    """

    def __init__(self, call: Caller, stdout: StreamRouter, stderr: StreamRouter):
        self._call = call
        self._stdout = stdout
        self._stderr = stderr
        self._cell_no = 0
        self.globals: dict[str, Any] = {}
        self._helpers: dict[str, Any] = {}
        self._builtins: dict[str, Any] = {}
        self._setup_namespace()

    # -- namespace
    def _setup_namespace(self) -> None:
        h = self._helpers
        h["llm_query"] = self.llm_query
        h["llm_batch"] = self.llm_batch
        h["llm_query_batched"] = self.llm_batch
        h["rlm_query"] = self.rlm_query
        h["rlm_batch"] = self.rlm_batch
        h["rlm_query_batched"] = self.rlm_batch
        h["FINAL"] = self.FINAL
        h["FINAL_VAR"] = self.FINAL_VAR
        h["SHOW_VARS"] = self.SHOW_VARS
        h["Image"] = Image
        h["list_images"] = self.list_images
        h["search"] = self.search
        h["chunk"] = self.chunk
        h["llm_map"] = self.llm_map
        h["llm_filter"] = self.llm_filter
        h["llm_rank"] = self.llm_rank
        h["llm_reduce"] = self.llm_reduce
        h["pairs"] = self.pairs
        # A private builtins dict: if user code deletes a helper from globals, the name still
        # resolves (to the original) through builtins.
        bdict = self._builtins = dict(builtins.__dict__)
        bdict.update(h)
        g = self.globals
        g["__name__"] = "__main__"
        g["__builtins__"] = bdict
        g.update(h)
        # modules small models use without importing them (a missing `import re` cost runs)
        import collections
        import math
        import re
        g.update(re=re, json=json, math=math, collections=collections)
        g["context"] = None
        g["answer"] = {"content": "", "ready": False}

    def define_functions(self, specs: Any) -> None:
        """Functions the host answers (MCP tools: recursa/core/mcp_tools.py), defined beside the
        helpers: typed by their spec, each call sent to the host as a `host_function` call."""
        for spec in specs or []:
            fn = self._host_function(spec)
            self._helpers[fn.__name__] = fn
            self._builtins[fn.__name__] = fn
            self.globals[fn.__name__] = fn

    def _host_function(self, spec: Any) -> Callable[..., Any]:
        import inspect  # only a run with host functions pays for it at start-up
        import keyword
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
                or name.startswith("_") or name in RESERVED_NAMES or name in self._helpers:
            raise ValueError(f"bad host function name {name!r}")
        params, extra = [], None
        for p in spec.get("params") or []:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            ann = _ANNOTATIONS.get(p.get("type"), inspect.Parameter.empty)
            default = inspect.Parameter.empty if p.get("required") else p.get("default")
            params.append(inspect.Parameter(str(p["name"]), kind, default=default,
                                            annotation=ann))
        if spec.get("extra"):    # argument names that are not identifiers go as **extra
            extra = inspect.Parameter(str(spec["extra"]), inspect.Parameter.VAR_KEYWORD)
            params.append(extra)
        params.sort(key=lambda q: (q.kind, q.default is not inspect.Parameter.empty))
        sig = inspect.Signature(params)
        call = self._call

        def host_function(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{name}(): {exc}") from None
            arguments = dict(bound.arguments)     # only what the caller gave: no defaults
            if extra is not None:
                arguments.update(arguments.pop(extra.name, {}))
            res = call("host_function", {"name": name, "arguments": arguments})
            if isinstance(res, dict) and "error" in res:
                exc_type = _HOST_ERRORS.get(str(res.get("type")), RuntimeError)
                raise exc_type(res["error"])
            if isinstance(res, dict) and "value" in res:
                return res["value"]
            raise RuntimeError(f"{name}(): {res}")   # the host's "Error: ..." string

        host_function.__name__ = host_function.__qualname__ = name
        host_function.__doc__ = str(spec.get("doc") or "")
        host_function.__signature__ = sig  # type: ignore[attr-defined]
        return host_function

    def set_context(self, value: Any) -> None:
        self.globals["context"] = value

    def load_context(self, path: str | None, kind: str, fd: int | None = None) -> None:
        """Load the context once, from an open fd if given (pre-opened before a uid drop)."""
        if fd is not None:
            os.lseek(fd, 0, os.SEEK_SET)
            f = open(fd, "rb", closefd=True)
        else:
            f = open(path or "", "rb")
        with f:
            if kind == "json":
                raw = f.read()
                # images and documents travel as {"__recursa_image__" / "__recursa_doc__": 1,
                # ...}: revive only when present
                hook = _revive if (IMAGE_MARK.encode() in raw
                                   or DOC_MARK.encode() in raw) else None
                value = json.loads(raw, object_hook=hook)
            elif kind == "text":
                value = f.read().decode("utf-8", errors="replace")
            else:
                raise ValueError(f"unknown context kind {kind!r}")
        self.set_context(value)

    # -- helpers visible to user code
    def llm_query(self, prompt: Any, model: str | None = None, images: Any = None,
                  **opts: Any) -> str:
        args = {"prompt": prompt, "model": model, "opts": opts}
        if images is not None:
            args["images"] = _images_arg(images)
        return self._call("llm", args)

    def llm_batch(self, prompts: Any, model: str | None = None, images: Any = None,
                  **opts: Any) -> list:
        prompts = list(prompts)
        args = {"prompts": prompts, "model": model, "opts": opts}
        if images is not None:   # one entry per prompt: an Image, a list of them, or None
            images = list(images)
            if len(images) != len(prompts):
                raise ValueError(f"llm_batch got {len(prompts)} prompts but {len(images)} "
                                 "entries in images= (give one per prompt: an Image, a list "
                                 "of Images, or None)")
            args["images"] = [None if i is None else _images_arg(i) for i in images]
        return self._call("llm_batch", args)

    def list_images(self, value: Any = None) -> list:
        """[(where, Image)] for every image in `value` (default: the context)."""
        return _find_images(self.globals.get("context") if value is None else value, "context")

    def search(self, query: Any, k: int = 5, mode: str = "hybrid") -> list:
        """Passages of the context ranked by meaning and words (BM25 and embeddings, fused;
        mode "bm25", "semantic" or "contextual": one of them): [{"id", "score", "text", "start", "end"} +
        "item" for a list / dict context], best first; context[start:end]
        (context[item][start:end]) is the passage. The host builds the index on the first
        call (recursa/core/search_host.py)."""
        hits = self._call("search", {"query": str(query), "k": int(k), "mode": str(mode)})
        if isinstance(hits, str):   # the host's error string (a missing extra, a bad k)
            raise RuntimeError(hits.removeprefix("Error: "))
        return hits

    def rlm_query(self, prompt: Any, context: Any = None, **opts: Any) -> str:
        return self._call("rlm", {"prompt": prompt, "context": context, "opts": opts})

    def rlm_batch(self, prompts: Any, contexts: Any = None, **opts: Any) -> list:
        ctx = None if contexts is None else list(contexts)
        return self._call("rlm_batch", {"prompts": list(prompts), "contexts": ctx, "opts": opts})

    # -- combinators: the host builds prompts and constraints (recursa/core/combinators.py)
    def _combinator(self, kind: str, args: dict) -> Any:
        res = self._call(kind, args)
        if not isinstance(res, dict):
            raise RuntimeError(f"{kind}: {res}")
        if "error" in res:
            raise ValueError(f"{kind}: {res['error']}")
        if "estimate" in res:
            return res["estimate"]
        if res.get("note"):
            print(res["note"])
        return res.get("values")

    def chunk(self, text: Any, size: Any = None, overlap: int = 0) -> list:
        """`text` cut into pieces of about `size` tokens (default: what fits one sub-call),
        consecutive pieces sharing `overlap` tokens; cuts fall on line ends where possible."""
        text = str(text)
        if size is None:
            size = int(self._call("leaf_size", {}).get("tokens", 4000) * 0.9)
        size, overlap = int(size), int(overlap)
        if size < 16 or not 0 <= overlap < size // 2:
            raise ValueError("chunk: size must be at least 16 tokens and overlap from 0 to "
                             "less than half the size")
        per = len(text) / max(1, _tokens(text))        # characters per token in this text
        width, back = max(1, int(size * per)), int(overlap * per)
        out, start = [], 0
        while start < len(text):
            end = min(len(text), start + width)
            if end < len(text):                         # a line end, else a space, near the end
                cut = text.rfind("\n", start + width * 4 // 5, end)
                if cut <= start:
                    cut = text.rfind(" ", start + width * 9 // 10, end)
                end = cut + 1 if cut > start else end
            out.append(text[start:end])
            if end >= len(text):
                break
            start = max(start + 1, end - back)
        return out

    def llm_map(self, instruction: Any, items: Any, labels: Any = None, output: Any = None,
                dry_run: bool = False, max_tokens: Any = None, model: Any = None) -> Any:
        """One sub-call per item: `instruction` applied to it. labels=[...] / output='number'
        etc. type the answers (None where a reply does not fit); dry_run=True returns the
        number of calls and tokens instead of running."""
        return self._combinator("llm_map", {
            "instruction": instruction, "items": list(items), "labels": labels,
            "output": output, "dry_run": bool(dry_run), "max_tokens": max_tokens,
            "model": model})

    def llm_filter(self, question: Any, items: Any, dry_run: bool = False,
                   model: Any = None) -> Any:
        """The items for which a sub-call answers yes to `question`."""
        items = list(items)
        res = self._combinator("llm_filter", {"question": question, "items": items,
                                              "dry_run": bool(dry_run), "model": model})
        return res if dry_run else [items[i] for i in res]

    def llm_rank(self, question: Any, items: Any, k: Any = None, dry_run: bool = False,
                 model: Any = None) -> Any:
        """The items ordered by how sure a sub-call is that each answers `question`, best
        first (the `k` best when given): one yes / no call per item, scored by the model's
        probability of yes where it gives one. Finer than llm_filter when many items look
        alike (only the sure ones come first)."""
        items = list(items)
        res = self._combinator("llm_rank", {"question": question, "items": items,
                                            "dry_run": bool(dry_run), "model": model})
        if dry_run:
            return res
        order = sorted(range(len(items)), key=lambda i: (res[i] is None, -(res[i] or 0.0), i))
        return [items[i] for i in order[:None if k is None else int(k)]]

    def llm_reduce(self, instruction: Any, items: Any, dry_run: bool = False,
                   max_tokens: Any = None, model: Any = None) -> Any:
        """One answer from many items, combined tree-wise in pieces that fit a sub-call."""
        return self._combinator("llm_reduce", {
            "instruction": instruction, "items": list(items), "dry_run": bool(dry_run),
            "max_tokens": max_tokens, "model": model})

    def pairs(self, items: Any, labels: Any = None, keep: Any = None, where: Any = None,
              limit: int = 1_000_000) -> list:
        """Unordered pairs (a, b) of items, without a model call: only items whose label (from
        the parallel list `labels`) is in `keep`, and only pairs where `where(a, b)` is true."""
        items = list(items)
        idx = list(range(len(items)))
        if keep is not None:
            if labels is None or len(list(labels)) != len(items):
                raise ValueError("pairs: keep= needs labels=, one label per item")
            labels = list(labels)
            wanted = {keep} if isinstance(keep, str) else set(keep)
            idx = [i for i in idx if labels[i] in wanted]
        out = []
        for n, i in enumerate(idx):
            for j in idx[n + 1:]:
                if where is None or where(items[i], items[j]):
                    out.append((items[i], items[j]))
                    if len(out) > limit:
                        raise ValueError(f"pairs: more than {limit:,} pairs; narrow them "
                                         "with keep= or where=")
        return out

    def FINAL(self, text: Any, sources: Any = None) -> None:  # noqa: N802 - fixed by the RLM convention
        # Models often write FINAL(answer) with the answer dict itself: commit its content.
        if isinstance(text, dict) and set(text) <= {"content", "ready", "sources"} \
                and "content" in text:
            sources = text.get("sources") if sources is None else sources
            text = text["content"]
        self._commit(str(text), sources)

    def _commit(self, text: str, sources: Any) -> None:
        """The answer, final, with the given sources or else those already in `answer`."""
        prev = self.globals.get("answer")
        if sources is None and isinstance(prev, dict):
            sources = prev.get("sources")
        self.globals["answer"] = {"content": text, "ready": True,
                                  **({"sources": sources} if sources is not None else {})}

    def FINAL_VAR(self, name: Any, sources: Any = None) -> None:  # noqa: N802
        key = str(name).strip().strip("'\"").strip()
        if key not in self.globals or key in self._helpers:
            shown = ", ".join(self.user_variables()) or "(none)"
            print(f"FINAL_VAR: no variable named {key!r}; the answer was NOT finalized. "
                  f"Defined variables: {shown}")
            return
        self._commit(str(self.globals[key]), sources)

    def SHOW_VARS(self) -> None:  # noqa: N802
        names = self.user_variables()
        if not names:
            print("No user variables defined.")
            return
        for n in names:
            print(f"{n}: {type(self.globals[n]).__name__}")

    def user_variables(self) -> list[str]:
        out = []
        for name, value in self.globals.items():
            if name.startswith("__") or name in ("context", "answer"):
                continue
            if self._helpers.get(name) is value:
                continue
            if isinstance(value, types.ModuleType):
                continue
            out.append(name)
        return out

    # -- running a cell
    def _compile(self, code: str, filename: str) -> tuple[Any, Any]:
        with AST_LOCK:   # see AST_LOCK
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                tail = tree.body.pop()
                assert isinstance(tail, ast.Expr)
                last = ast.Expression(tail.value)
            body = compile(tree, filename, "exec")
            expr = compile(last, filename, "eval") if last is not None else None
        return body, expr

    def _format_exc(self, exc: BaseException, filename: str) -> str:
        if isinstance(exc, SyntaxError) and exc.filename == filename:
            msg = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
            return f"{msg}\n(the cell was not run: fix the syntax and send it again)"
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        frames = list(te.stack)
        for i, fr in enumerate(frames):  # drop REPL-machinery frames above the cell's own
            if fr.filename == filename:
                te.stack = traceback.StackSummary.from_list(frames[i:])
                break
        return "".join(te.format()).rstrip()

    def run(self, code: str, max_output_chars: int = 20000) -> dict[str, Any]:
        """Run one cell in the calling thread; returns the Cell fields as a dict."""
        self._cell_no += 1
        filename = f"<cell-{self._cell_no}>"
        # Register the source so tracebacks can show the offending lines.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        stale = f"<cell-{self._cell_no - 200}>"
        linecache.cache.pop(stale, None)

        g = self.globals
        if "answer" not in g:  # deleted by user code: start a fresh one
            g["answer"] = {"content": "", "ready": False}
        if "context" not in g:  # deleted by user code: nothing to restore from here
            g["context"] = None

        out, err = Capture(max_output_chars), Capture(max_output_chars)
        ident = threading.get_ident()
        self._stdout.register(ident, out)
        self._stderr.register(ident, err)
        value = error = None
        t0 = time.perf_counter()
        try:
            try:
                body, expr = self._compile(code, filename)
                exec(body, g)
                if expr is not None:
                    result = eval(expr, g)
                    if result is not None:
                        value = _safe_repr(result, max_output_chars)
            except BaseException as exc:  # noqa: BLE001 - user code may raise anything
                error = _cap_text(self._format_exc(exc, filename), max(max_output_chars, 2000))
        finally:
            elapsed = time.perf_counter() - t0
            self._stdout.unregister(ident)
            self._stderr.unregister(ident)

        ans = g.get("answer")
        final = None
        stderr_extra = ""
        if isinstance(ans, dict):
            content = ans.get("content", "")
            ready = bool(ans.get("ready", False))
            answer = {"content": content if isinstance(content, str) else str(content),
                      "ready": ready}
            if ans.get("sources") is not None:
                answer["sources"] = _answer_sources(ans["sources"])
            if ready:
                final = answer["content"]
        else:
            stderr_extra = (f"warning: `answer` is a {type(ans).__name__}, not a dict like "
                            f'{{"content": "...", "ready": True}}; it was not treated as final\n')
            answer = {"content": "", "ready": False}
        stderr = err.getvalue()
        if stderr_extra:
            stderr = stderr_extra + stderr
        return {
            "stdout": out.getvalue(),
            "stderr": stderr,
            "value": value,
            "error": error,
            "elapsed_s": elapsed,
            "stdout_chars": out.total,
            "stderr_chars": err.total + len(stderr_extra),
            "answer": answer,
            "final": final,
            "variables": self.user_variables(),
        }


# ------------------------------------------------------------------ images
IMAGE_MARK = "__recursa_image__"
SANDBOX_PILLOW = "/recursa/site"    # the local sandbox binds the host's PIL here, read-only
_PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP"}


class Image:
    """An image of the context, or a crop of one. `.size` (w, h), `.format`, `.name`, `.data`
    (the encoded bytes) work everywhere; `.crop()` and `.pil()` need Pillow in the sandbox."""

    __slots__ = ("data", "format", "width", "height", "name")

    def __init__(self, data: bytes, format: str, width: int, height: int,  # noqa: A002
                 name: str = ""):
        self.data = bytes(data)
        self.format = str(format)
        self.width = int(width)
        self.height = int(height)
        self.name = str(name)

    @property
    def size(self) -> tuple:
        return (self.width, self.height)

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        return f"Image({label}{self.format}, {self.width}x{self.height}, {len(self.data):,} bytes)"

    __str__ = __repr__

    def _wire(self) -> dict:
        return {IMAGE_MARK: 1, "name": self.name, "format": self.format, "width": self.width,
                "height": self.height, "b64": base64.b64encode(self.data).decode("ascii")}

    def pil(self) -> Any:
        """The image as a Pillow image (decoded here, in the sandbox)."""
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise RuntimeError(
                "Pillow is not available in this sandbox, so images cannot be decoded or "
                "cropped here (listing them, .size and sending them with llm_query(..., "
                "images=[img]) still work). Install it on the host with "
                "pip install 'recursa[images]'") from None
        import io as _io
        img = PILImage.open(_io.BytesIO(self.data))
        img.load()
        return img

    def crop(self, box: Any) -> Image:
        """A new Image of the region box=(left, top, right, bottom) in pixels."""
        try:
            left, top, right, bottom = (int(v) for v in box)
        except (TypeError, ValueError):
            raise ValueError(f"crop box must be (left, top, right, bottom) integers, got "
                             f"{box!r}") from None
        if not (0 <= left < right <= self.width and 0 <= top < bottom <= self.height):
            raise ValueError(f"crop box {(left, top, right, bottom)} is not inside the image "
                             f"(0, 0, {self.width}, {self.height}) or is empty")
        import io as _io
        region = self.pil().crop((left, top, right, bottom))
        fmt = "jpeg" if self.format == "jpeg" else "png"   # PNG keeps crops lossless
        if fmt == "png" and region.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"):
            region = region.convert("RGBA")
        buf = _io.BytesIO()
        region.save(buf, format=_PIL_FORMATS[fmt], **({"quality": 95} if fmt == "jpeg" else {}))
        name = f"{self.name or 'image'}[{left},{top},{right},{bottom}]"
        return Image(buf.getvalue(), fmt, right - left, bottom - top, name)


def _revive_image(d: dict) -> Any:
    if d.get(IMAGE_MARK) == 1 and "b64" in d:
        return Image(base64.b64decode(d["b64"]), d.get("format", ""), d.get("width", 0),
                     d.get("height", 0), d.get("name", ""))
    return d


# ------------------------------------------------------------------ documents in the context
# One definition for both sides: the host imports these as recursa.documents.Document / Part
# (recursa/documents/), the worker revives them from the payload's JSON. A Document *is* its
# whole text (a str), so code written for a text context keeps working, and carries its
# structure: pages, slides, sheets, sections, chapters or tables, each a str too.
DOC_MARK = "__recursa_doc__"


class Part(str):
    """One page / slide / sheet / section / chapter / table of a Document: its text, plus
    `.kind`, `.number` (1-based), `.name`, `.start`/`.end` (offsets in the document's text),
    `.doc` (the document's name) and, for tables, `.columns`, `.rows`, `.records`."""

    kind: str
    number: int
    name: str
    start: int
    end: int
    doc: str
    meta: dict

    def __new__(cls, text: str, kind: str = "part", number: int = 1, name: str = "",
                start: int = 0, end: int | None = None, doc: str = "",
                meta: dict | None = None) -> Part:
        self = super().__new__(cls, text)
        self.kind, self.number, self.name, self.doc = str(kind), int(number), str(name), str(doc)
        self.start = int(start)
        self.end = int(start) + len(text) if end is None else int(end)
        self.meta = dict(meta or {})
        return self

    def __reduce__(self) -> Any:
        return (Part, (str(self), self.kind, self.number, self.name, self.start, self.end,
                       self.doc, self.meta))

    @property
    def text(self) -> str:
        return str(self)

    @property
    def columns(self) -> list:
        return list(self.meta.get("columns") or [])

    @property
    def schema(self) -> str:
        return str(self.meta.get("schema") or "")

    @property
    def rows(self) -> list:
        """The table's rows: lists of str (CSV/TSV/sheets/Parquet/SQLite) or JSON values
        (JSON Lines), without the header row."""
        fmt = self.meta.get("format")
        if fmt == "jsonl":
            return [json.loads(line) for line in self.splitlines() if line.strip()]
        if fmt != "delimited":
            raise ValueError(f"{self.kind} {self.number} of {self.doc!r} is not a table; "
                             "only tables, sheets, CSV and JSON Lines have rows")
        import csv
        rows = list(csv.reader(io.StringIO(str(self)), delimiter=self.meta.get("delimiter", ",")))
        return rows[1:] if self.meta.get("header", True) else rows

    @property
    def records(self) -> list:
        """The rows as dicts keyed by column name."""
        if self.meta.get("format") == "jsonl":
            return self.rows
        cols = self.columns
        return [dict(zip(cols, row, strict=False)) for row in self.rows]


_PART_ALIASES = ("pages", "slides", "sheets", "sections", "chapters", "tables")


class Document(str):
    """A document of the context: it *is* its whole extracted text (a str), plus `.name`,
    `.kind` ('pdf', 'docx', 'csv', ...), `.parts` (also `.pages`, `.slides`, `.sheets`,
    `.sections`, `.chapters`, `.tables`: the same list of Part), `.meta` and `.notes`."""

    name: str
    kind: str
    meta: dict
    notes: list
    _raw: list
    _parts: list | None

    def __new__(cls, text: str, name: str = "", kind: str = "text",
                parts: Sequence[Sequence[Any]] = (), meta: dict | None = None,
                notes: Sequence[str] = ()) -> Document:
        self = super().__new__(cls, text)
        self.name, self.kind = str(name), str(kind)
        self.meta, self.notes = dict(meta or {}), [str(n) for n in notes]
        # [kind, number, name, start, end, meta]: Part objects are cut from the text on use
        self._raw = [list(p) for p in parts]
        self._parts = None
        return self

    def __reduce__(self) -> Any:
        return (Document, (str(self), self.name, self.kind, self._raw, self.meta, self.notes))

    @property
    def text(self) -> str:
        return str(self)

    @property
    def parts(self) -> list:
        if self._parts is None:
            self._parts = [Part(self[s:e], k, n, nm, s, e, self.name, m)
                           for k, n, nm, s, e, m in self._raw]
        return self._parts

    def __getattr__(self, attr: str) -> Any:
        if attr in _PART_ALIASES:
            return self.parts
        if attr in ("rows", "records", "columns", "schema"):
            tables = [p for p in self.parts if p.meta.get("format")]
            if len(tables) == 1:
                return getattr(tables[0], attr)
            raise AttributeError(f"{self.name!r} has {len(tables)} tables; use "
                                 f".parts[i].{attr} (each part has .name)")
        raise AttributeError(f"'Document' object has no attribute {attr!r}")

    def _wire(self) -> dict:
        return {DOC_MARK: 1, "name": self.name, "kind": self.kind, "text": str(self),
                "parts": self._raw, "meta": self.meta, "notes": self.notes}


def _revive(d: dict) -> Any:
    if d.get(DOC_MARK) == 1 and "text" in d:
        return Document(d["text"], d.get("name", ""), d.get("kind", "text"),
                        d.get("parts") or (), d.get("meta"), d.get("notes") or ())
    if d.get(IMAGE_MARK) == 1 and "b64" in d:
        return _revive_image(d)
    return d


def _images_arg(images: Any) -> list:
    items = [images] if isinstance(images, Image | bytes | bytearray) else list(images)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Image):
            out.append(item._wire())
        elif isinstance(item, bytes | bytearray):   # encoded image bytes; the host checks them
            out.append({IMAGE_MARK: 1, "name": "", "format": "", "width": 0, "height": 0,
                        "b64": base64.b64encode(bytes(item)).decode("ascii")})
        else:
            raise TypeError(f"images[{i}] is a {type(item).__name__}; images= takes Image "
                            "objects (e.g. from list_images() or img.crop(...)) or image bytes")
    return out


def _find_images(value: Any, where: str) -> list:
    if isinstance(value, Image):
        return [(where, value)]
    out: list = []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _find_images(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            out += _find_images(v, f"{where}[{i}]")
    return out


# ------------------------------------------------------------------ the worker process
class _Channel:
    """Framed JSON over two private fds; writes are serialised by a lock."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd
        self._wlock = threading.Lock()

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, default=_json_fallback, ensure_ascii=False).encode("utf-8")
        frame = _HEADER.pack(len(data)) + data
        # A SIGINT (cell interrupt) landing between two partial writes would corrupt the
        # stream, so the main thread holds it back while writing.
        main = threading.current_thread() is threading.main_thread()
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with self._wlock:
                view = memoryview(frame)
                while view:
                    n = os.write(self.wfd, view)
                    view = view[n:]
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(self.rfd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("host closed the channel")
            buf += chunk
        return bytes(buf)

    def receive(self) -> dict:
        (n,) = _HEADER.unpack(self._read_exact(_HEADER.size))
        if n > _MAX_FRAME:
            raise ValueError(f"frame too large: {n}")
        return json.loads(self._read_exact(n).decode("utf-8"))


def _json_fallback(obj: Any) -> Any:
    if isinstance(obj, Image):
        return obj._wire()
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    if isinstance(obj, bytes | bytearray):
        return obj.decode("utf-8", errors="replace")
    return repr(obj)


class _Slot:
    __slots__ = ("event", "value", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: str | None = None


class Worker:
    """The process side: a reader thread routes host messages; the main thread runs cells."""

    def __init__(self, channel: _Channel, preopened: dict[str, int]):
        self.ch = channel
        self.preopened = preopened
        self.requests: queue.Queue[dict | None] = queue.Queue()
        self.slots: dict[str, _Slot] = {}
        self.slots_lock = threading.Lock()
        self.next_call = 0
        self.current_cell: str | None = None
        self.dead = False
        self.stdout = StreamRouter(None, "<stdout>")
        self.stderr = StreamRouter(None, "<stderr>")
        sys.stdout, sys.stderr = self.stdout, self.stderr  # type: ignore[assignment]
        self.repl = Repl(self.call, self.stdout, self.stderr)

    # called from any user thread
    def call(self, kind: str, args: dict) -> Any:
        if self.dead:
            raise RuntimeError("the host connection is closed")
        slot = _Slot()
        with self.slots_lock:
            self.next_call += 1
            cid = f"c{self.next_call}"
            self.slots[cid] = slot
        try:
            self.ch.send({"type": "call", "id": cid, "kind": kind, "args": args})
            slot.event.wait()
        finally:
            with self.slots_lock:
                self.slots.pop(cid, None)
        if slot.error is not None:
            raise RuntimeError(slot.error)
        return slot.value

    def reader(self) -> None:
        try:
            while True:
                msg = self.ch.receive()
                t = msg.get("type")
                if t == "result":
                    with self.slots_lock:
                        slot = self.slots.get(str(msg.get("id")))
                    if slot is not None:
                        slot.value = msg.get("value")
                        slot.error = msg.get("error")
                        slot.event.set()
                elif t == "interrupt":
                    # A real SIGINT also breaks blocking sleeps/waits in the main thread. It is
                    # aimed at the main thread so that thread's sigmask (see _Channel.send)
                    # can hold it back while a frame is half written.
                    if self.current_cell is not None and msg.get("id") == self.current_cell:
                        main_id = threading.main_thread().ident
                        if main_id is not None:
                            signal.pthread_kill(main_id, signal.SIGINT)
                else:
                    self.requests.put(msg)
        except BaseException:
            pass
        # Host gone: fail pending calls, stop the main loop.
        self.dead = True
        with self.slots_lock:
            for slot in self.slots.values():
                slot.error = "the host connection is closed"
                slot.event.set()
        self.requests.put(None)

    def serve(self) -> None:
        threading.Thread(target=self.reader, name="recursa-reader", daemon=True).start()
        while True:
            try:
                msg = self.requests.get()
                if msg is None or msg.get("type") == "shutdown":
                    return
                self.handle(msg)
            except KeyboardInterrupt:
                continue  # an interrupt that arrived just after a cell finished

    def handle(self, msg: dict) -> None:
        t = msg.get("type")
        if t == "init":
            t0 = time.perf_counter()
            path = msg.get("context_path")
            try:
                fd = self.preopened.pop(path, None) if path else None
                if path is not None or fd is not None:
                    self.repl.load_context(path, msg.get("kind", "text"), fd=fd)
                self.repl.define_functions(msg.get("functions"))
            except Exception as exc:
                self.ch.send({"type": "init_error", "error": f"{type(exc).__name__}: {exc}"})
                return
            self.ch.send({"type": "ready", "load_s": time.perf_counter() - t0,
                          "python": sys.version.split()[0], "pid": os.getpid(),
                          "protocol": PROTOCOL_VERSION})
        elif t == "exec":
            cid = str(msg.get("id"))
            self.current_cell = cid
            try:
                res = self.repl.run(str(msg.get("code", "")),
                                    int(msg.get("max_output_chars", 20000)))
            finally:
                self.current_cell = None
            res["type"] = "done"
            res["id"] = cid
            self.ch.send(res)
        elif t == "ping":
            self.ch.send({"type": "pong", "id": msg.get("id")})
        else:
            self.ch.send({"type": "protocol_error", "error": f"unknown message type {t!r}"})


_libc: Any = None


def _prctl(option: int, arg: int) -> int:
    global _libc
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl(option, arg, 0, 0, 0)
    except Exception:  # not Linux, or no libc: these are extra safety nets only
        return -1


def _set_subreaper() -> None:
    # Orphaned grandchildren re-parent to us, so the host can find and kill them by ancestry.
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def _end_descendants(rounds: int = 50) -> None:
    """SIGKILL and reap every process model code left behind, before the worker exits. As a
    subreaper the worker holds them all; once it has exited they re-parent out of the host's
    reach by ancestry (a `shutdown` answered faster than the host's kill is that race)."""
    me = str(os.getpid()).encode()
    for _ in range(rounds):
        kids = []
        try:
            entries = os.listdir("/proc")
        except OSError:
            return  # not Linux: the host's kill is all there is
        for entry in entries:
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                # Field 4 (ppid) follows the parenthesised command name.
                if stat[stat.rfind(b")") + 2:].split()[1:2] == [me]:
                    kids.append(int(entry))
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError, PermissionError):
                pass


def _die_with_parent(parent: int) -> None:
    # If the host dies while a cell is busy, nobody would ever stop us otherwise.
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (must follow setuid, which clears it)
    if os.getppid() != parent:
        os._exit(1)


def _allow_pillow(where: str) -> None:
    """Let `import PIL` find Pillow in `where` without putting that directory on sys.path."""
    import importlib.machinery

    class _PillowOnly:
        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
            if name != "PIL":
                return None
            return importlib.machinery.PathFinder.find_spec(name, [where])

    sys.meta_path.append(_PillowOnly)


def _apply_limits(limits: dict[str, int]) -> None:
    try:
        import resource
    except ImportError:
        return
    names = {"as": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "fsize": "RLIMIT_FSIZE",
             "nproc": "RLIMIT_NPROC", "nofile": "RLIMIT_NOFILE", "core": "RLIMIT_CORE"}
    for key, value in limits.items():
        res = getattr(resource, names.get(key, ""), None)
        if res is None or value is None:
            continue
        try:
            soft, hard = resource.getrlimit(res)
            new = int(value)
            if hard != resource.RLIM_INFINITY:
                new = min(new, hard)
            resource.setrlimit(res, (new, new))
        except (ValueError, OSError):
            pass


apply_limits = _apply_limits   # for recursa's other confined programs (the document parser)


def _drop_bounding_caps() -> None:
    # Belt and braces: capabilities are cleared by setuid() below, and bubblewrap sets
    # no_new_privs, but with an empty bounding set nothing could ever regain one.
    try:
        with open("/proc/self/status") as f:
            bnd = next(int(ln.split()[1], 16) for ln in f if ln.startswith("CapBnd:"))
    except (OSError, StopIteration, ValueError, IndexError):
        bnd = (1 << 64) - 1
    for cap in range(64):
        if bnd >> cap & 1:
            _prctl(24, cap)  # PR_CAPBSET_DROP; fails harmlessly without CAP_SETPCAP


# ------------------------------------------------------------------ kernel surface
# A seccomp filter installed after set-up, before any user code: system calls that only serve
# to attack the kernel or leave the sandbox fail with EPERM. Namespace creation (the door to
# capabilities over fresh namespaces, where many kernel bugs were found) is refused by the
# flags of clone/unshare; clone3 answers ENOSYS (its flags sit in memory a filter cannot read)
# so that libc falls back to clone. Numbers per architecture (tests/test_sandbox_confinement.py
# checks them against the kernel headers); elsewhere no filter is installed.
_DENY_COMMON = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf",
    "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root", "chroot", "setns",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "perf_event_open", "userfaultfd", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "quotactl", "quotactl_fd", "lookup_dcookie",
    "open_by_handle_at", "nfsservctl", "syslog", "vhangup", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fanotify_init", "sethostname", "setdomainname")
SYSCALLS = {
    "x86_64": {
        "clone": 56, "unshare": 272, "clone3": 435, "ioctl": 16, "seccomp": 317,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "pidfd_getfd": 438, "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "setns": 308,
        "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320,
        "perf_event_open": 298, "userfaultfd": 323, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159,
        "quotactl": 179, "quotactl_fd": 443, "lookup_dcookie": 212, "open_by_handle_at": 304,
        "nfsservctl": 180, "syslog": 103, "vhangup": 153, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "fanotify_init": 300,
        "sethostname": 170, "setdomainname": 171,
        # x86 only
        "iopl": 172, "ioperm": 173, "modify_ldt": 154, "uselib": 134, "_sysctl": 156,
        "sysfs": 139, "create_module": 174, "get_kernel_syms": 177, "query_module": 178},
    "aarch64": {
        "clone": 220, "unshare": 97, "clone3": 435, "ioctl": 29, "seccomp": 277,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "pidfd_getfd": 438, "bpf": 280, "keyctl": 219, "add_key": 217, "request_key": 218,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "setns": 268,
        "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "kexec_load": 104, "kexec_file_load": 294,
        "perf_event_open": 241, "userfaultfd": 282, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
        "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171,
        "quotactl": 60, "quotactl_fd": 443, "lookup_dcookie": 18, "open_by_handle_at": 265,
        "nfsservctl": 42, "syslog": 116, "vhangup": 58, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "fanotify_init": 262,
        "sethostname": 161, "setdomainname": 162},
}
_X86_ONLY = ("iopl", "ioperm", "modify_ldt", "uselib", "_sysctl", "sysfs", "create_module",
             "get_kernel_syms", "query_module")
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET; unshare also NEWTIME
# (0x80, the exit-signal byte in clone's flags)
_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000
_NEWTIME = 0x00000080
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C   # push input into a terminal / console ioctls
_EPERM, _ENOSYS = 1, 38
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000


def seccomp_arch() -> str | None:
    """The architecture whose filter this process gets (None: no filter here). A 32-bit
    interpreter on a 64-bit kernel makes other system calls, so it gets none."""
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if sys.platform != "linux" or machine not in SYSCALLS or struct.calcsize("P") != 8:
        return None
    return machine


def seccomp_program(arch: str) -> bytes:
    """The classic BPF program (struct sock_filter[]) of the worker's filter for `arch`."""
    nr = SYSCALLS[arch]
    deny = [nr[n] for n in _DENY_COMMON] + ([nr[n] for n in _X86_ONLY] if arch == "x86_64"
                                            else [])
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list[tuple[int, int | str, int | str, int]] = []   # jump targets by label first
    labels: dict[str, int] = {}

    def op(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        prog.append((code, jt, jf, k))

    def label(name: str) -> None:
        labels[name] = len(prog)

    op(ld, 4)                                        # seccomp_data.arch
    op(jeq, _AUDIT_ARCH[arch], 0, "kill")            # another ABI (int 0x80...): killed
    op(ld, 0)                                        # seccomp_data.nr
    if arch == "x86_64":
        op(jge, 0x40000000, "eperm", 0)              # the x32 ABI
    op(jeq, nr["clone"], "clone", 0)
    op(jeq, nr["unshare"], "unshare", 0)
    op(jeq, nr["clone3"], "enosys", 0)
    op(jeq, nr["ioctl"], "ioctl", 0)
    for n in deny:
        op(jeq, n, "eperm", 0)
    op(ret, _RET_ALLOW)
    label("clone")
    op(ld, 16)                                       # args[0], low 32 bits (flags)
    op(jset, _NS_FLAGS, "eperm", 0)
    op(ret, _RET_ALLOW)
    label("unshare")
    op(ld, 16)
    op(jset, _NS_FLAGS | _NEWTIME, "eperm", 0)
    op(ret, _RET_ALLOW)
    label("ioctl")
    op(ld, 24)                                       # args[1] (the kernel reads 32 bits)
    op(jeq, _TIOCSTI, "eperm", 0)
    op(jeq, _TIOCLINUX, "eperm", 0)
    op(ret, _RET_ALLOW)
    label("enosys")
    op(ret, _RET_ERRNO | _ENOSYS)
    label("eperm")
    op(ret, _RET_ERRNO | _EPERM)
    label("kill")
    op(ret, _RET_KILL_PROCESS)

    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        jumps = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= j < 256 for j in jumps):
            raise ValueError("seccomp program: jump out of range")
        out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
    return bytes(out)


def _libc_fn() -> Any:
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def install_seccomp() -> bool:
    """Install the filter on every thread of this process (no_new_privs first, as the kernel
    requires without CAP_SYS_ADMIN); False where there is none for this architecture. Raises
    OSError if the kernel refuses it."""
    import ctypes

    arch = seccomp_arch()
    if arch is None:
        return False
    if arch not in _PROGRAMS:
        _PROGRAMS[arch] = seccomp_program(arch)
    code = _PROGRAMS[arch]
    libc = _libc_fn()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = ctypes.create_string_buffer(struct.pack("@HP", len(code) // 8, ctypes.addressof(buf)))
    if libc.prctl(38, 1, 0, 0, 0) != 0:   # PR_SET_NO_NEW_PRIVS
        err = ctypes.get_errno()
        raise OSError(err, f"PR_SET_NO_NEW_PRIVS: {os.strerror(err)}")
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, struct sock_fprog *): the
    # threads started earlier get it too
    rc = libc.syscall(ctypes.c_long(SYSCALLS[arch]["seccomp"]), 1, 1, prog)
    if rc != 0:
        err = ctypes.get_errno() if rc < 0 else 0
        raise OSError(err, f"seccomp: {os.strerror(err) if err else f'thread {rc} refused'}")
    return True


_PROGRAMS: dict[str, bytes] = {}   # built once (the zygote builds it before forking runs)


def clear_capabilities() -> None:
    """Keep no capability at all: bounding set emptied (where CAP_SETPCAP allows), ambient
    set cleared, and effective, permitted and inheritable set to nothing (setuid() from root
    clears the first two but keeps the inheritable set, which bubblewrap's --cap-add fills)."""
    import ctypes

    _drop_bounding_caps()
    libc = _libc_fn()
    libc.prctl(47, 4, 0, 0, 0)   # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = ctypes.create_string_buffer(struct.pack("@Ii", 0x20080522, 0))   # v3, this thread
    data = ctypes.create_string_buffer(24)   # 2 x {effective, permitted, inheritable}: all 0
    if libc.capset(header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def prepare_lock_down() -> None:
    """Build what `lock_down` needs ahead (a fork server, before forking)."""
    arch = seccomp_arch()
    if arch is not None and arch not in _PROGRAMS:
        _PROGRAMS[arch] = seccomp_program(arch)
    _libc_fn()


def lock_down(*, required: bool = True) -> None:
    """The last step of start-up, after the uid drop and before any user code: no
    capabilities, no_new_privs, the seccomp filter. `required`: a worker that cannot lock
    itself down exits instead of serving (the local sandbox); else it serves anyway (a remote
    sandbox, whose own container or VM is the isolation)."""
    if sys.platform != "linux":
        return
    for step in (clear_capabilities, install_seccomp):
        try:
            step()
        except OSError as exc:
            if required:
                raise SystemExit(f"recursa worker: could not lock itself down: {exc}") from None


def join_cgroups(fds: list[int]) -> None:
    """Move this process into the groups whose `cgroup.procs` the host opened for us ("0" is
    the writer itself), so every process started from here on is counted against the limits."""
    for fd in fds:
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def _drop_privileges(uid: int, gid: int | None) -> None:
    _drop_bounding_caps()
    os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop privileges")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="worker.py")
    ap.add_argument("--limits", default="{}", help="JSON {as, cpu, fsize, nproc, nofile}")
    ap.add_argument("--preopen", action="append", default=[],
                    help="open this file before dropping privileges (e.g. the context)")
    ap.add_argument("--uid", type=int, default=None)
    ap.add_argument("--gid", type=int, default=None)
    ap.add_argument("--no-pdeathsig", action="store_true",
                    help="forked by the zygote: dies with its pid namespace, not its parent")
    ap.add_argument("--late-context", action="store_true",
                    help="a pre-started worker: wait for the host's init, open its context_path, "
                         "and only then drop privileges (--uid) and serve. Nothing but init is "
                         "accepted first, so no user code can run before the drop")
    ap.add_argument("--pillow", default=None,
                    help="a directory holding the PIL package: make `import PIL` (only) work")
    ap.add_argument("--confine", choices=("require", "try", "off"), default="try",
                    help="lock down before user code (no capabilities, seccomp filter): "
                         "require (exit if the kernel refuses; the local sandbox), try "
                         "(default: remote sandboxes, whose container is the isolation), off")
    args = ap.parse_args(argv)
    return run(json.loads(args.limits), uid=args.uid, gid=args.gid, preopen=args.preopen,
               late_context=args.late_context, pdeathsig=not args.no_pdeathsig,
               pillow=args.pillow, confine=args.confine)


def run(limits: dict[str, int], *, uid: int | None = None, gid: int | None = None,
        preopen: Sequence[str] = (), late_context: bool = False, pdeathsig: bool = True,
        pillow: str | None = None, confine: str = "try") -> int:
    """The worker process proper (`main` without the command line: the zygote calls this).
    `confine`: end start-up with `lock_down()` (no capabilities, the seccomp filter):
    "require" (exit if it fails), "try" or "off"."""
    # Pillow for Image.crop: given, or where the local sandbox's bubblewrap shows it
    pillow = pillow or (SANDBOX_PILLOW if os.path.isdir(f"{SANDBOX_PILLOW}/PIL") else None)
    if pillow:
        _allow_pillow(pillow)
    # Keep the protocol on private fds; user code writing to fd 0/1 hits /dev/null instead.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115

    parent = os.getppid()
    _set_subreaper()
    preopened = {}
    for p in preopen:
        try:
            preopened[p] = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass
    _apply_limits(limits)
    if uid is not None and not late_context:
        _drop_privileges(uid, gid)
    if pdeathsig:
        _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    channel = _Channel(rfd, wfd)
    first = None
    if late_context:
        # Single-threaded until serve(): read the one message allowed before the drop.
        try:
            first = channel.receive()
        except (EOFError, OSError, ValueError):
            return 0  # the host discarded this spare
        kind = first.get("type") if isinstance(first, dict) else None
        if kind != "init":
            if kind != "shutdown":
                channel.send({"type": "init_error", "error": f"expected init first, got {kind!r}"})
            return 2
        path = first.get("context_path")
        if isinstance(path, str) and path:
            try:
                preopened[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # init below reports the error
        if uid is not None:
            _drop_privileges(uid, gid)
            if pdeathsig:
                _die_with_parent(parent)  # setuid cleared the parent-death signal
    if confine != "off":
        lock_down(required=confine == "require")
    worker = Worker(channel, preopened)
    if first is not None:
        worker.handle(first)
    try:
        worker.serve()
    finally:
        _end_descendants()
    return 0


if __name__ == "__main__":
    sys.exit(main())
