"""Events, sinks and redaction.

Trace format `recursa-trace/1`: JSONL, one Event per line, appended and flushed as it happens, so a
killed run leaves a valid trace up to its last event. Every message and output is written exactly
once (a turn event carries only that turn's new model text and cell outputs, never the history),
and the context is referenced by its SHA-256 and size, so a trace grows neither with the context
nor quadratically with turns.

The first line of every run written by `JsonlSink` is a header
`{"kind": "header", "format": "recursa-trace/1", "run_id": ..., "t": ...}`; the full format is
documented in docs/trace-format.md. `load(path) -> Run` rebuilds the recursion tree with totals and
per-model / per-role usage, tolerating a torn last line and a run that never ended.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import open_private
from recursa.base.types import Event, RoleUsage, TraceSink, Usage

TRACE_FORMAT = "recursa-trace/1"

# Environment variables whose values are secrets: *_KEY, *_TOKEN, *_SECRET_*, *PASSWORD*, ...
# Matched as whole name parts so SSH_AUTH_SOCK or KEYBOARD_LAYOUT do not count.
_SECRET_NAME = r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|PAT)(_|$)"
_SECRET_PATTERNS = (
    r"sk-[A-Za-z0-9_\-]{16,}",          # OpenAI / Anthropic style keys
    r"(?i)bearer\s+[A-Za-z0-9._\-]{16,}",
    r"\bAKIA[0-9A-Z]{16}\b",              # AWS access key ids
    r"\b(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",   # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{30,}",
    r"\bhf_[A-Za-z0-9]{30,}",             # Hugging Face tokens
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",   # Slack tokens
)


@functools.cache
def _secret_res() -> tuple[re.Pattern[str], tuple[re.Pattern[str], ...]]:
    """The patterns above, compiled when the first Redactor is made: only a trace file is
    redacted, and compiling them costs ~0.7 ms of every run's start-up."""
    return (re.compile(_SECRET_NAME, re.I),
            tuple(re.compile(p) for p in _SECRET_PATTERNS))


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class Redactor:
    """Replaces secret values (from the environment, or given) and key-shaped strings."""

    def __init__(self, extra: Iterable[str] = ()):
        name, self._patterns = _secret_res()
        values = {v for k, v in os.environ.items() if name.search(k) and len(v) >= 8}
        values.update(s for s in extra if s and len(s) >= 8)
        # Sinks redact the serialised JSON line, where a secret with quotes, backslashes or
        # non-ASCII characters appears escaped: look for that spelling too.
        values.update([json.dumps(v)[1:-1] for v in values])
        self._values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for v in self._values:
            if v in text:
                text = text.replace(v, "[REDACTED]")
        for pat in self._patterns:
            text = pat.sub("[REDACTED]", text)
        return text


class JsonlSink:
    """Appends events to a JSONL file, flushed per line. Thread-safe.

    Before the first event of each run it writes a header line naming the format, so a file
    that several runs appended to stays readable run by run.
    """

    def __init__(self, path: str | Path, redact: Callable[[str], str] | None = None):
        self.path = Path(path)
        # prompts, contexts and answers: 0600 in 0700 directories (privatefiles.py)
        self._f = open_private(self.path, "a")
        self._lock = threading.Lock()
        self._redact = redact or Redactor()
        self._headed: set[str] = set()

    def emit(self, event: Event) -> None:
        if event.phase == "delta":   # live views only: the turn's end event has the whole text
            return
        line = self._redact(event.model_dump_json(exclude_defaults=False))
        with self._lock:
            if self._f.closed:
                return
            if event.run_id not in self._headed:
                self._headed.add(event.run_id)
                self._f.write(json.dumps(header(event.run_id, event.t)) + "\n")
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


class CallbackSink:
    """Hands every event to a user callback; a failing callback never fails the run. It gets
    `delta` events too (the root's reply as it is written)."""

    wants_deltas = True

    def __init__(self, fn: Callable[[Event], Any]):
        self.fn = fn
        self.errors = 0

    def emit(self, event: Event) -> None:
        try:
            self.fn(event)
        except Exception:
            self.errors += 1

    def close(self) -> None:
        pass


class Tracer:
    """Emits events of one top-level run (children included) to its sinks."""

    def __init__(self, sinks: list[TraceSink], run_id: str | None = None):
        self.sinks = sinks
        self.run_id = run_id or new_id()
        self._lock = threading.Lock()

    def emit(self, kind: str, *, id: str | None = None, parent: str | None = None,
             phase: str = "point", depth: int = 0, **data: Any) -> str:
        ev = Event(kind=kind, id=id or new_id(), parent=parent, run_id=self.run_id,
                   phase=phase, t=time.time(), depth=depth, data=data)
        for s in self.sinks:
            s.emit(ev)
        return ev.id

    @property
    def wants_deltas(self) -> bool:
        """Some sink shows replies as they are written (then root turns stream)."""
        return any(getattr(s, "wants_deltas", False) for s in self.sinks)

    def emit_delta(self, kind: str, *, id: str, parent: str | None = None, depth: int = 0,
                   **data: Any) -> None:
        """A `delta` event, to the sinks that want one only."""
        ev = Event(kind=kind, id=id, parent=parent, run_id=self.run_id, phase="delta",
                   t=time.time(), depth=depth, data=data)
        for s in self.sinks:
            if getattr(s, "wants_deltas", False):
                s.emit(ev)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:
                pass


@functools.cache
def _library_version() -> str:
    try:
        from importlib.metadata import version
        return version("recursa")
    except Exception:
        return "unknown"


def header(run_id: str, t: float | None = None) -> dict[str, Any]:
    """The first line of a run in a trace file."""
    return {"kind": "header", "format": TRACE_FORMAT, "run_id": run_id,
            "t": time.time() if t is None else t, "recursa": _library_version()}


def load_events(path: str | Path) -> list[Event]:
    """Read a trace; a torn last line (killed writer) is skipped, not an error."""
    return read_trace(path).events


# ==================================================================== reader
@dataclass
class RawTrace:
    """The lines of a trace file, parsed but not yet assembled."""

    events: list[Event]
    headers: list[dict[str, Any]]
    bad_lines: int = 0          # lines that were not a valid event or header
    torn: bool = False          # the last line was cut short (the writer was killed mid-line)


def _check_format(fmt: Any) -> None:
    if not isinstance(fmt, str) or not fmt.startswith("recursa-trace/"):
        raise ValueError(f"not a recursa trace (format {fmt!r})")
    try:
        major = int(fmt.split("/", 1)[1].split(".")[0])
    except ValueError as e:
        raise ValueError(f"unknown trace format {fmt!r}") from e
    if major > int(TRACE_FORMAT.split("/")[1]):
        raise ValueError(f"trace format {fmt} is newer than this reader ({TRACE_FORMAT}); "
                         "upgrade recursa")


def parse_lines(lines: Iterable[str]) -> RawTrace:
    """Parse JSONL trace lines. Tolerates blank, foreign and torn lines; rejects newer formats."""
    raw = RawTrace(events=[], headers=[])
    last_bad = False
    for line in lines:
        text = line.strip()
        if not text:
            continue
        last_bad = False
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            raw.bad_lines += 1
            last_bad = True
            continue
        if isinstance(obj, dict) and obj.get("kind") == "header":
            _check_format(obj.get("format"))
            raw.headers.append(obj)
            continue
        try:
            raw.events.append(Event.model_validate(obj))
        except ValueError:
            raw.bad_lines += 1
    raw.torn = last_bad
    return raw


def read_trace(path: str | Path) -> RawTrace:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_lines(f)


@dataclass
class TraceNode:
    """One span of a run (run, child, turn, cell, subcall, ...): its start and end paired by id.

    `data` merges the start event's data with the end event's (the end wins on a clash, e.g. a
    sub-call's requested vs. actual model). Point events whose parent is this node are kept in
    `points` (the context description, the sandbox, the final answer). `open` means the start was
    seen but not the end: the run was killed, or is still going.
    """

    id: str
    kind: str
    parent: str | None = None
    depth: int = 0
    start: float | None = None
    end: float | None = None
    data: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    points: list[Event] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return self.end is None

    @property
    def duration(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, self.end - self.start)

    @property
    def usage(self) -> Usage:
        """This node's own model usage (turns and sub-calls; zero for other kinds)."""
        u = self.data.get("usage") or {}
        return Usage(input_tokens=int(u.get("input_tokens") or 0),
                     output_tokens=int(u.get("output_tokens") or 0),
                     cached_tokens=int(u.get("cached_tokens") or 0))

    @property
    def is_call(self) -> bool:
        """A model call that returned (it has usage)."""
        return self.kind in ("turn", "subcall") and bool(self.data.get("usage"))

    @property
    def error(self) -> str | None:
        e = self.data.get("error")
        if e is True:
            return "error"
        return str(e) if e else None


@dataclass
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = 0.0     # None once any call had no known price
    calls: int = 0                   # model calls that returned (root/child turns + sub-calls)
    turns: int = 0                   # turns of every RLM in the tree
    cells: int = 0
    subcalls: int = 0                # started sub-calls, failed ones included
    failed_subcalls: int = 0
    children: int = 0
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add_call(self, usage: Usage, cost: float | None) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cached_tokens += usage.cached_tokens
        self.calls += 1
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost


def _add_role(table: dict[str, RoleUsage], key: str, usage: Usage, cost: float | None) -> None:
    ru = table.setdefault(key, RoleUsage())
    ru.calls += 1
    ru.usage = ru.usage + usage
    ru.cost_usd = None if cost is None or ru.cost_usd is None else ru.cost_usd + cost


@dataclass
class Run:
    """A recursa run rebuilt from its trace: the tree of nodes, totals, usage, the answer."""

    run_id: str
    nodes: dict[str, TraceNode]
    roots: list[str]                 # nodes without a (known) parent: normally one `run` node
    totals: Totals
    by_model: dict[str, RoleUsage]
    by_role: dict[str, RoleUsage]    # root (top-level turns), child (child RLM turns), sub
    events: int
    format: str = TRACE_FORMAT
    path: str | None = None
    answer: str | None = None
    status: str | None = None        # final / extracted / limit / error; None if never ended
    answer_source: str | None = None  # final / answer_variable / extraction_turn / none
    ready: bool = False
    error: str | None = None
    limit: str | None = None
    finished: bool = False           # the top-level run's end event was written
    torn: bool = False               # the file ended in a cut line
    bad_lines: int = 0
    start: float | None = None
    end: float | None = None         # end event time, or the last event's time if unfinished
    query: str | None = None
    model: str | None = None
    context: dict[str, Any] = field(default_factory=dict)   # sha256, bytes, chars, description

    @property
    def root(self) -> TraceNode | None:
        for rid in self.roots:
            if self.nodes[rid].kind == "run":
                return self.nodes[rid]
        return self.nodes[self.roots[0]] if self.roots else None

    @property
    def open_nodes(self) -> list[TraceNode]:
        return [n for n in self.nodes.values() if n.open]

    def walk(self, node_id: str | None = None) -> Iterator[TraceNode]:
        """Depth-first, children in start order."""
        stack = [node_id] if node_id else list(reversed(self.roots))
        while stack:
            n = self.nodes[stack.pop()]
            yield n
            stack.extend(reversed(n.children))

    def subtree_totals(self, node_id: str) -> Totals:
        """Tokens, cost and calls of a node and everything under it."""
        t = Totals()
        for n in self.walk(node_id):
            if n.is_call:
                t.add_call(n.usage, n.data.get("cost_usd"))
            t.turns += n.kind == "turn"
            t.cells += n.kind == "cell"
            t.subcalls += n.kind == "subcall"
            t.children += n.kind == "child"
        node = self.nodes[node_id]
        t.wall_s = node.duration or 0.0
        return t

    def _repr_html_(self) -> str:     # Jupyter: the run's summary and its viewer inline
        from recursa.obs.notebook import run_html
        return run_html(self)

    def search(self, text: str) -> list[TraceNode]:
        """Nodes whose text fields (query, model text, code, output, prompt, answer, ...) contain
        `text`, case-insensitively."""
        needle = text.lower()
        return [n for n in self.walk() if needle in _node_text(n).lower()]


_TEXT_FIELDS = ("query", "text", "code", "output", "prompt", "response", "answer", "error",
                "description")


def _node_text(n: TraceNode) -> str:
    parts = [str(n.data[k]) for k in _TEXT_FIELDS if n.data.get(k)]
    parts += [str(p.data[k]) for p in n.points for k in _TEXT_FIELDS if p.data.get(k)]
    return "\n".join(parts)


def build_run(events: Iterable[Event], *, run_id: str | None = None) -> Run:
    """Assemble events of one run into a Run (events of other runs are ignored)."""
    evs = list(events)
    if run_id is None:
        run_id = evs[0].run_id if evs else ""
    nodes: dict[str, TraceNode] = {}
    points: list[Event] = []
    count = 0
    last_t: float | None = None
    for ev in evs:
        if ev.run_id != run_id:
            continue
        count += 1
        last_t = ev.t if last_t is None else max(last_t, ev.t)
        if ev.phase == "point":
            points.append(ev)
            continue
        node = nodes.get(ev.id)
        if node is None:
            node = nodes[ev.id] = TraceNode(id=ev.id, kind=ev.kind, parent=ev.parent,
                                            depth=ev.depth)
        if ev.phase == "start":
            node.start = ev.t
            node.data = {**ev.data, **node.data}
        elif ev.phase == "update":        # data for a span still open; its times stay
            node.data.update(ev.data)
        else:
            node.end = ev.t
            node.data.update(ev.data)
            if node.start is None:        # an end without its start: the span's time is unknown
                node.start = ev.t
        if node.parent is None and ev.parent is not None:
            node.parent = ev.parent
    # children in start order: events are written in time order, so dict order already is
    roots: list[str] = []
    for node in nodes.values():
        parent = nodes.get(node.parent) if node.parent else None
        if parent is None:
            roots.append(node.id)
        else:
            parent.children.append(node.id)
    orphans: list[Event] = []
    for ev in points:
        parent = nodes.get(ev.parent or "")
        if parent is None:
            orphans.append(ev)
        else:
            parent.points.append(ev)

    run = Run(run_id=run_id, nodes=nodes, roots=roots, totals=Totals(), by_model={},
              by_role={}, events=count)
    root = run.root
    if root is not None:
        root.points.extend(orphans)   # points with no known parent belong to the run itself
    _fill(run, root, last_t)
    return run


def _fill(run: Run, root: TraceNode | None, last_t: float | None) -> None:
    """Totals, usage tables, the answer and the context, from the assembled nodes."""
    t = run.totals
    run_models: dict[str, str] = {}     # run/child node id -> its root model
    for n in run.walk():
        if n.kind in ("run", "child"):
            run_models[n.id] = str(n.data.get("model") or "")
        t.turns += n.kind == "turn"
        t.cells += n.kind == "cell"
        t.children += n.kind == "child"
        if n.kind == "subcall":
            t.subcalls += 1
            t.failed_subcalls += bool(n.data.get("error"))
        if not n.is_call:
            continue
        cost = n.data.get("cost_usd")
        t.add_call(n.usage, cost)
        if n.kind == "subcall":
            role, model = "sub", n.data.get("model")
        else:
            role = "root" if n.depth == 0 else "child"
            # the last-answer turn does not carry its model: use its RLM's
            model = n.data.get("model") or run_models.get(n.parent or "")
        _add_role(run.by_role, role, n.usage, cost)
        _add_role(run.by_model, str(model or "unknown"), n.usage, cost)
    if root is None:
        return
    run.start = root.start
    run.finished = root.end is not None
    run.end = root.end if root.end is not None else last_t
    t.wall_s = max(0.0, (run.end or 0.0) - (run.start or 0.0))
    run.query = root.data.get("query")
    run.model = root.data.get("model")
    for p in root.points:
        d = p.data
        if p.kind == "final":
            run.answer = d.get("answer")
            run.status = d.get("status")
            run.answer_source = d.get("answer_source")
            run.ready = bool(d.get("ready"))
            run.error = d.get("error")
            run.limit = d.get("limit")
        elif "context_sha256" in d:
            run.context = {"sha256": d.get("context_sha256"), "bytes": d.get("context_bytes"),
                           "chars": d.get("context_chars"), "description": d.get("description")}
    if run.status is None and root.end is not None:
        run.status = root.data.get("status")


def load_runs(path: str | Path) -> list[Run]:
    """Every run in a trace file (a file several runs appended to), in the order they started."""
    raw = read_trace(path)
    ids = list(dict.fromkeys(ev.run_id for ev in raw.events))
    runs = [build_run(raw.events, run_id=i) for i in ids]
    for r in runs:
        r.path, r.torn, r.bad_lines = str(path), raw.torn, raw.bad_lines
        r.format = next((h["format"] for h in raw.headers if h.get("run_id") == r.run_id),
                        TRACE_FORMAT)
    return runs


def load(path: str | Path, run_id: str | None = None) -> Run:
    """The run in a trace file (the last one if several were appended, or `run_id`'s).

    A torn last line is skipped; nodes of a run that never ended are kept and marked open.
    """
    runs = load_runs(path)
    if not runs:
        raise ValueError(f"{path}: no recursa events in this file")
    if run_id is None:
        return runs[-1]
    for r in runs:
        if r.run_id == run_id:
            return r
    raise ValueError(f"{path}: no run {run_id!r} (runs: {', '.join(r.run_id for r in runs)})")
