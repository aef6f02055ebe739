"""Response cache: a ModelClient wrapper that answers a request seen before from an on-disk store.

    RLM(model=..., cache=True)                       # ~/.cache/recursa/responses.sqlite
    RLM(model=..., cache="runs/responses.sqlite")    # a file of your own
    client = cached(make_client("openai:gpt-5-mini"), True)   # any ModelClient

The key is the sha256 of canonical JSON (sorted keys, no spaces, integral floats as ints) of the
client's identity (name, model, base URL, default options), the messages, and every option except
the ones that cannot change the reply (`timeout`, headers, slot and cache hints). The store is one
sqlite file (stdlib `sqlite3`) in WAL mode with a busy timeout, so many processes can read and
write it at once. A hit costs nothing: `cost_usd` 0.0, `cached=True`, the tokens of the reply it
replays (so token limits and tables read as on the first run).

Sampling at a temperature above 0 (or at the provider's default, which is above 0 everywhere)
gives a different reply each time, so such calls are cached only with a `seed` or when asked
(`nondeterministic=True`); otherwise they pass through, with one warning per client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import private_dir, touch_private
from recursa.base.types import (
    Capabilities,
    Completion,
    Message,
    ModelClient,
    RecursaError,
    Usage,
    model_identity,
)

from .declared import declared
from .streaming import OnDelta, complete_streaming

log = logging.getLogger("recursa.models")

FORMAT = "recursa-cache/1"
ENV_PATH = "RECURSA_RESPONSE_CACHE"      # overrides the default file
BUSY_TIMEOUT_S = 30.0                    # how long a write waits for another process's write
# options that cannot change the reply: left out of the key
IGNORED_OPTIONS = frozenset({"timeout", "extra_headers", "id_slot", "user", "prompt_cache_key",
                             "prompt_cache"})   # Anthropic cache breakpoints: billing only



class CacheError(RecursaError):
    """The response cache file cannot be used. `reason`: 'corrupt' (not a readable recursa
    cache), 'unwritable', 'format' (written by another version) or 'other'."""

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        self.reason = reason


def default_cache_path() -> Path:
    """$RECURSA_RESPONSE_CACHE, else $XDG_CACHE_HOME/recursa/responses.sqlite, else
    ~/.cache/recursa/responses.sqlite."""
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "recursa" / "responses.sqlite"


# ---------------------------------------------------------------- the key
LONG_STRING = 1024   # longer strings enter the key as their own sha256 (below)


def _canon(obj: Any) -> Any:
    """JSON-ready data whose dump does not depend on how equal values were written (0 vs 0.0,
    tuple vs list). A long string becomes {"sha256", "chars"}: hashing its bytes is ~4x faster
    than JSON-escaping it, and a hit on a 100 KiB prompt then costs ~0.1 ms, not ~0.4.
    Raises TypeError for what JSON cannot hold."""
    if isinstance(obj, str):
        if len(obj) <= LONG_STRING:
            return obj
        digest = hashlib.sha256(obj.encode("utf-8", "surrogatepass")).hexdigest()
        return {"sha256": digest, "chars": len(obj)}
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, str) else k: _canon(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canon(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return int(obj) if obj.is_integer() else obj
    if hasattr(obj, "model_dump"):      # a pydantic message or tool schema
        return _canon(obj.model_dump(mode="json"))
    raise TypeError(f"cannot key a {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    return json.dumps(_canon(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def client_identity(client: ModelClient) -> dict[str, Any]:
    """What names the model behind a client: what it declares (`capabilities.identity`), else
    its name."""
    return dict(client.capabilities.identity) or model_identity(client.name)


def request_key(identity: dict[str, Any], messages: list[Message], options: dict[str, Any]) -> str:
    """sha256 hex of the canonical request; the same in every process and Python version."""
    opts = {k: v for k, v in options.items() if k not in IGNORED_OPTIONS and v is not None}
    payload = canonical_json({"v": 1, "client": identity, "messages": messages, "options": opts})
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def deterministic(options: dict[str, Any]) -> bool:
    """True when the request asks for a reproducible reply: temperature 0, or a seed."""
    if options.get("seed") is not None:
        return True
    t = options.get("temperature")
    try:
        return t is not None and float(t) == 0.0
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------- the store
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS responses (
        key TEXT PRIMARY KEY,        -- request_key(): sha256 hex
        model TEXT NOT NULL,         -- the client's name, for stats() and clear(model)
        created REAL NOT NULL,       -- unix time of the call
        value TEXT NOT NULL          -- JSON: text, usage, model, cost_usd, latency_s, raw
    ) WITHOUT ROWID""",
)


class ResponseCache:
    """One sqlite file of responses, safe to share between threads and processes.

    Each thread gets its own connection (sqlite connections must not be shared across threads
    mid-statement); the connections of threads that have ended are closed when the next one is
    opened, so a long-lived process that makes threads (a session's runner thread each) keeps
    one per live thread, not one per thread it ever had (two file descriptors each). WAL lets readers run while one process writes, and the busy timeout makes a
    concurrent writer wait instead of failing. Opening checks the file at once: a corrupt or
    foreign file, or a directory that cannot be written, raises CacheError naming it.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 busy_timeout: float = BUSY_TIMEOUT_S):
        self.path = Path(path).expanduser() if path else default_cache_path()
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._conns: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        if self.path.is_dir():
            raise CacheError(f"response cache {self.path} is a directory; give a file path "
                             "(e.g. responses.sqlite)", "unwritable")
        try:
            # prompts and replies: a new file is 0600 in 0700 directories (privatefiles.py);
            # sqlite gives its -wal and -shm files the database file's mode
            private_dir(self.path.parent)
        except OSError as e:
            raise CacheError(f"response cache {self.path}: cannot create its directory "
                             f"({e.strerror or e})", "unwritable") from e
        if not os.access(self.path.parent, os.W_OK | os.X_OK) or (
                self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK)):
            raise CacheError(f"response cache {self.path} is not writable (check the "
                             "permissions, or pass another path)", "unwritable")
        try:
            touch_private(self.path)
        except OSError as e:
            raise CacheError(f"response cache {self.path}: cannot create it "
                             f"({e.strerror or e})", "unwritable") from e
        self._setup(self._conn())

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r})"

    # ------------------------------------------------------------ connections
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise CacheError(f"response cache {self.path} is closed")
        if os.getpid() != self._pid:   # a forked child must not touch the parent's handles
            self._local, self._conns, self._pid = threading.local(), [], os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                       isolation_level=None, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                conn.execute("PRAGMA synchronous = NORMAL")   # WAL: safe against crashes
            except sqlite3.Error as e:
                raise self._error(e) from e
            self._local.conn = conn
            with self._lock:
                ended = [c for t, c in self._conns if not t.is_alive()]
                self._conns = [(t, c) for t, c in self._conns if t.is_alive()]
                self._conns.append((threading.current_thread(), conn))
            for c in ended:      # their threads are gone: nothing can be mid-statement on them
                with contextlib.suppress(sqlite3.Error):
                    c.close()
        return conn

    def _error(self, e: BaseException) -> CacheError:
        msg = str(e)
        if isinstance(e, sqlite3.DatabaseError) and (
                "not a database" in msg or "malformed" in msg or "corrupt" in msg):
            return CacheError(f"response cache {self.path} is corrupt or not a recursa cache "
                              f"({msg}); remove it (`python -m recursa.models.cache clear {self.path}`)"
                              " and run again",
                              "corrupt")
        if "readonly" in msg or "unable to open" in msg or "read-only" in msg:
            return CacheError(f"response cache {self.path} cannot be written ({msg})",
                              "unwritable")
        return CacheError(f"response cache {self.path}: {type(e).__name__}: {msg}")

    def _setup(self, conn: sqlite3.Connection) -> None:
        # Two processes creating the file at once can get "database is locked" from the switch
        # to WAL without sqlite calling the busy handler (it would deadlock): retry that here.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                row = self._create(conn)
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or \
                        time.monotonic() > deadline:
                    raise self._error(e) from e
                time.sleep(random.uniform(0.005, 0.05))
            except sqlite3.Error as e:
                raise self._error(e) from e
        if row is not None and row[0] != FORMAT:
            raise CacheError(f"response cache {self.path} has format {row[0]!r}; this recursa "
                             f"reads {FORMAT!r} (use another path, or clear it)", "format")

    def _create(self, conn: sqlite3.Connection) -> Any:
        """WAL mode, the tables, the format mark; returns the format row found (None: new)."""
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":        # set once per file; later opens only read it
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("response cache %s: journal mode %s, not WAL (a network "
                            "filesystem?); concurrent writers may wait longer", self.path, mode)
        conn.execute("BEGIN IMMEDIATE")    # two processes creating it at once: one waits
        try:
            for stmt in _SCHEMA:
                conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return row

    # ------------------------------------------------------------ entries
    def get(self, key: str) -> dict[str, Any] | None:
        try:
            row = self._conn().execute("SELECT value FROM responses WHERE key = ?",
                                       (key,)).fetchone()
        except sqlite3.Error as e:
            raise self._error(e) from e
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except json.JSONDecodeError as e:
            raise CacheError(f"response cache {self.path}: entry {key[:12]} is not JSON "
                             f"({e}); clear the cache", "corrupt") from e

    def put(self, key: str, value: dict[str, Any], *, model: str = "") -> None:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        try:
            self._conn().execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                                 (key, model, time.time(), data))
        except sqlite3.Error as e:
            raise self._error(e) from e

    def __len__(self) -> int:
        try:
            return int(self._conn().execute("SELECT count(*) FROM responses").fetchone()[0])
        except sqlite3.Error as e:
            raise self._error(e) from e

    def stats(self) -> dict[str, Any]:
        """Entries per model and the file's size, for a `cache info` command."""
        try:
            rows = self._conn().execute(
                "SELECT model, count(*) FROM responses GROUP BY model ORDER BY 2 DESC").fetchall()
        except sqlite3.Error as e:
            raise self._error(e) from e
        size = sum(p.stat().st_size for p in _files(self.path) if p.exists())
        return {"path": str(self.path), "entries": sum(n for _, n in rows),
                "by_model": dict(rows), "bytes": size}

    def clear(self, model: str | None = None) -> int:
        """Delete every entry (or one model's); returns how many went."""
        try:
            conn = self._conn()
            if model is None:
                n = conn.execute("DELETE FROM responses").rowcount
            else:
                n = conn.execute("DELETE FROM responses WHERE model = ?", (model,)).rowcount
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:
            raise self._error(e) from e
        return int(n)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
            self._closed = True
        for _, c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        _OPEN.pop((os.getpid(), str(self.path.resolve())), None)


def _files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


_OPEN: dict[tuple[int, str], ResponseCache] = {}
_OPEN_LOCK = threading.Lock()


def open_cache(spec: Any) -> ResponseCache | None:
    """`cache=` as RLM and the bench take it: None/False (off), True (the default file), a path,
    or a ResponseCache. One store per file and process, shared by every run in it."""
    if spec is None or spec is False:
        return None
    if isinstance(spec, ResponseCache):
        return spec
    if spec is True:
        path = default_cache_path()
    elif isinstance(spec, str | os.PathLike):
        if not str(spec).strip():
            raise CacheError("cache path is empty")
        path = Path(spec).expanduser()
    else:
        raise TypeError(f"cache= takes True, a path or a ResponseCache, not {type(spec).__name__}")
    key = (os.getpid(), str(path.resolve()))
    with _OPEN_LOCK:
        store = _OPEN.get(key)
        if store is None:
            store = _OPEN[key] = ResponseCache(path)
        return store


def clear_cache(path: str | os.PathLike[str] | None = None) -> int:
    """Empty the cache at `path` (default: the default file). A file that is not a readable
    cache (corrupt) is removed with its -wal/-shm files instead. Returns the entries removed
    (0 for a removed corrupt file or a missing one)."""
    p = Path(path).expanduser() if path else default_cache_path()
    if not p.exists():
        return 0
    try:
        store = ResponseCache(p)
    except CacheError as e:
        if e.reason not in ("corrupt", "format"):
            raise
        for f in _files(p):
            f.unlink(missing_ok=True)
        log.warning("removed the unreadable response cache %s", p)
        return 0
    try:
        return store.clear()
    finally:
        store.close()


# ---------------------------------------------------------------- the client wrapper
def _raw_json(raw: Any) -> Any:
    """The provider's response as JSON data (tool calls live there), or None."""
    if raw is None:
        return None
    try:
        data = raw.model_dump(mode="json") if hasattr(raw, "model_dump") else raw
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return None


class CachedClient:
    """A ModelClient answering from a ResponseCache when it can, else from `inner` (and then
    storing the reply). Every other attribute is the inner client's (model, stats, n_ctx, ...).

    `hits`, `misses`, `skipped` count this wrapper's calls: skipped ones were not cacheable
    (sampled without a seed, or options JSON cannot hold)."""

    def __init__(self, inner: ModelClient, store: ResponseCache, *,
                 nondeterministic: bool = False):
        self.inner = inner = declared(inner)
        self.store = store
        self.nondeterministic = nondeterministic
        self.name = inner.name
        self.hits = self.misses = self.skipped = 0
        self._identity = client_identity(inner)
        # the client's own default options (temperature, seed) count as the request's
        self._defaults = dict(self._identity.get("defaults") or {})
        self._warned = False

    def __getattr__(self, attr: str) -> Any:      # only called for what is not set above
        if attr == "inner":                       # not set yet (copy, unpickling)
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def __repr__(self) -> str:
        return f"CachedClient({self.inner!r}, {self.store!r})"

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def key(self, messages: list[Message], options: dict[str, Any]) -> str | None:
        """The cache key of a request, or None when it is not to be cached."""
        if not self.nondeterministic and not deterministic({**self._defaults, **options}):
            if not self._warned:
                self._warned = True
                log.warning("%s: calls without temperature=0 or a seed are not cached (each "
                            "reply is a fresh sample); pass cache_nondeterministic=True to "
                            "cache them anyway", self.name)
            return None
        try:
            return request_key(self._identity, messages, options)
        except (TypeError, ValueError) as e:
            log.debug("%s: request not cached: %s", self.name, e)
            return None

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        return await self._call(messages, None, options)

    async def astream(self, messages: list[Message], on_delta: OnDelta,
                      **options: Any) -> Completion:
        """A hit replays the stored reply as one delta; a miss streams from the inner client
        (or calls its `complete` when it cannot stream) and stores the reply as `complete`
        would."""
        return await self._call(messages, on_delta, options)

    async def _call(self, messages: list[Message], on_delta: OnDelta | None,
                    options: dict[str, Any]) -> Completion:
        t0 = time.perf_counter()
        key = self.key(messages, options)
        if key is None:
            self.skipped += 1
            return await complete_streaming(self.inner, messages, on_delta, **options)
        hit = self.store.get(key)
        if hit is not None:
            self.hits += 1
            if on_delta is not None:
                on_delta(hit["text"], 0)
            return Completion(text=hit["text"], usage=Usage(**hit.get("usage") or {}),
                              cost_usd=0.0, model=hit.get("model") or self.name,
                              latency_s=time.perf_counter() - t0, cached=True,
                              raw=hit.get("raw"), first_logprobs=hit.get("first_logprobs"))
        self.misses += 1
        comp = await complete_streaming(self.inner, messages, on_delta, **options)
        value = {"text": comp.text, "usage": comp.usage.model_dump(), "model": comp.model,
                 "cost_usd": comp.cost_usd, "latency_s": round(comp.latency_s, 4),
                 "raw": _raw_json(comp.raw), "first_logprobs": comp.first_logprobs}
        try:   # in a thread: a write may wait on another process's (busy timeout)
            await asyncio.to_thread(self.store.put, key, value, model=self.name)
        except CacheError as e:   # the reply is good: a failed write must not lose it
            log.warning("%s", e)
        return comp

    async def aclose(self) -> None:
        await self.inner.aclose()


def cached(client: ModelClient, cache: Any, *, nondeterministic: bool = False) -> ModelClient:
    """`client` behind the cache `cache` names (see open_cache); unchanged when `cache` is off
    or the client is already cached."""
    store = open_cache(cache)
    if store is None or isinstance(client, CachedClient):
        return client
    return CachedClient(client, store, nondeterministic=nondeterministic)


def main(argv: list[str] | None = None) -> int:
    """`python -m recursa.models.cache info|clear [PATH]`: what the cache holds, or empty it."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m recursa.models.cache",
                                 description="recursa's response cache")
    ap.add_argument("action", choices=("info", "clear"))
    ap.add_argument("path", nargs="?", help=f"cache file (default: {default_cache_path()})")
    a = ap.parse_args(argv)
    try:
        if a.action == "clear":
            n = clear_cache(a.path)
            print(f"removed {n} cached responses from {a.path or default_cache_path()}")
            return 0
        path = Path(a.path).expanduser() if a.path else default_cache_path()
        if not path.exists():
            print(f"{path}: no cache yet")
            return 0
        store = ResponseCache(path)
        try:
            print(json.dumps(store.stats(), indent=2))
        finally:
            store.close()
    except CacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
