"""Map / filter / rank / reduce over items for the REPL's `llm_map`, `llm_filter`, `llm_rank` and
`llm_reduce`.

The sandbox sends the items and what it wants (an instruction, a label list or a simple output
type); the host builds every prompt and every constraint itself, so sandboxed code never passes
raw client options (see `dispatch._safe_opts`). Each leaf is one sub-call through the dispatcher
(one budget and ledger, retries, parallel slots, the response cache) and must fit the
sub-model's window. `dry_run=True` returns the bound on calls and tokens without calling a model;
a real run checks the same bound against what the budget has left before its first call, so a
map never stops half done for lack of budget.

Typed leaves: `labels=[...]` (one of a fixed set), `output="number" | "int" | "bool" | "text"`,
or `output={"field": "str" | "int" | "number" | "bool" | [labels]}`. On llama.cpp the reply is
constrained by the value's JSON schema (its `json_schema` option), so a small model cannot answer
out of the set; on OpenAI-compatible servers by `response_format`; elsewhere the reply is
parsed leniently and a reply that does not parse becomes None.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recursa.base.types import context_window

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from recursa.base.types import Completion, ModelClient
    from recursa.core.dispatch import Dispatcher, Node, Partial

KINDS = ("llm_map", "llm_filter", "llm_rank", "llm_reduce", "leaf_size")
DEFAULT_WINDOW = 32_768      # tokens, for a sub-model that does not say its window
PROMPT_OVERHEAD = 200        # chat template and instruction lines around a leaf's text
MAX_ITEMS = 100_000
MAX_LABELS = 50
TEXT_OUTPUT_TOKENS = 512     # a free-text leaf's reply cap (and its reservation)
_FIELD_KINDS: dict[str, dict[str, Any]] = {
    "str": {"type": "string", "maxLength": 500}, "int": {"type": "integer"},
                "number": {"type": "number"}, "bool": {"type": "boolean"}}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class CombinatorError(ValueError):
    """Bad arguments from the REPL; the message is written for the model."""


# ------------------------------------------------------------------ sizes
def window_of(client: ModelClient) -> int:
    return context_window(client) or DEFAULT_WINDOW


def leaf_tokens(client: ModelClient) -> int:
    """The most tokens of item text one leaf may hold: half the sub-model's window, so the
    instruction, the chat template and the reply always fit beside it."""
    return max(256, window_of(client) // 2)


def tokens(text: str) -> int:
    from recursa.core.dispatch import text_tokens
    return text_tokens(text)


# ------------------------------------------------------------------ typed leaves
@dataclass
class LeafType:
    """What one leaf must answer: its JSON schema (None: free text), the line that tells the
    model, and its reply cap."""

    kind: str                     # labels | number | int | bool | object | text
    schema: dict[str, Any] | None
    instruction: str
    max_tokens: int
    labels: list[str] | None = None

    @classmethod
    def of(cls, labels: Any = None, output: Any = None,
           max_tokens: int | None = None) -> LeafType:
        if labels is not None:
            if output not in (None, "label", "labels"):
                raise CombinatorError("give either labels=[...] or output=..., not both")
            if not isinstance(labels, list | tuple) or not labels or \
                    not all(isinstance(x, str) and x.strip() for x in labels):
                raise CombinatorError("labels must be a non-empty list of non-empty strings")
            labs = list(dict.fromkeys(x.strip() for x in labels))
            if len(labs) > MAX_LABELS or any(len(x) > 100 for x in labs):
                raise CombinatorError(f"labels: at most {MAX_LABELS} labels of at most 100 "
                                      "characters each")
            longest = max(tokens(x) for x in labs)
            return cls("labels", {"type": "string", "enum": labs},
                       "Answer with exactly one of: " + ", ".join(labs) + ".",
                       max_tokens or longest + 8, labs)
        if output is None or output == "text":
            return cls("text", None, "", max_tokens or TEXT_OUTPUT_TOKENS)
        if output in ("number", "int", "float"):
            kind = "int" if output == "int" else "number"
            return cls(kind, {"type": "integer" if kind == "int" else "number"},
                       "Answer with a number only.", max_tokens or 24)
        if output in ("bool", "yes/no"):
            return cls("bool", {"type": "boolean"}, "Answer true or false only.",
                       max_tokens or 6)
        if isinstance(output, dict) and output:
            props: dict[str, Any] = {}
            for name, kind in output.items():
                if not isinstance(name, str) or not name:
                    raise CombinatorError("output={...}: field names must be strings")
                if isinstance(kind, list | tuple) and kind and all(isinstance(x, str)
                                                                   for x in kind):
                    props[name] = {"type": "string", "enum": list(dict.fromkeys(kind))}
                elif kind in _FIELD_KINDS:
                    props[name] = dict(_FIELD_KINDS[str(kind)])
                else:
                    raise CombinatorError(f"output={{...}}: field {name!r} has kind {kind!r}; "
                                          f"use one of {', '.join(_FIELD_KINDS)} or a list of "
                                          "labels")
            schema = {"type": "object", "properties": props, "required": list(props),
                      "additionalProperties": False}
            return cls("object", schema, "Answer with JSON only, an object with the keys: " +
                       ", ".join(f"{k} ({_kind_word(v)})" for k, v in output.items()) + ".",
                       max_tokens or 64 + 48 * len(props))
        raise CombinatorError(f"output={output!r}: use 'text', 'number', 'int', 'bool', or a "
                              "dict of field kinds; for a fixed set of answers use labels=[...]")

    def first_token(self) -> bool:
        """Labels told apart by their first character: one reply token names the label."""
        return self.kind == "labels" and self.labels is not None and \
            len({x[0] for x in self.labels}) == len(self.labels)

    def options(self, client: ModelClient | str) -> dict[str, Any]:
        """Host-built client options: the reply cap and, where the client can, a constraint."""
        opts: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": 0.0}
        if self.schema is None:
            return opts
        from recursa.models.registry import structured_output
        how = structured_output(client)
        if how == "json_schema" and self.first_token():
            # llama.cpp: a grammar of the bare labels and one reply token, which names the
            # label (their first characters differ): the leaf costs its prompt and not one
            # decoding step more (a JSON string took ~4, as many as the prompt's last ~20
            # tokens on a 1.5B)
            assert self.labels is not None
            opts["grammar"] = "root ::= " + " | ".join(json.dumps(x) for x in self.labels)
            opts["max_tokens"] = 1
        elif how == "json_schema":           # llama.cpp turns the schema into a grammar
            opts["json_schema"] = self.schema
        elif how == "response_format":       # strict mode wants an object at the root
            wrapped = self.schema if self.kind == "object" else {
                "type": "object", "properties": {"value": self.schema}, "required": ["value"],
                "additionalProperties": False}
            opts["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "leaf", "schema": wrapped, "strict": True}}
        return opts

    def parse(self, text: str) -> Any:
        """The leaf's value, or None when the reply does not fit the type."""
        if text.startswith("Error:"):
            return None
        if self.kind == "text":
            return text.strip()
        value = _json(text)
        if isinstance(value, dict) and self.kind != "object" and set(value) == {"value"}:
            value = value["value"]
        if self.kind == "labels":
            assert self.labels is not None
            return _label(value if isinstance(value, str) else text, self.labels)
        if self.kind in ("number", "int"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                m = _NUMBER.search(text)
                if not m:
                    return None
                value = float(m.group().replace(",", ""))
            return int(value) if self.kind == "int" or float(value).is_integer() else value
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            word = text.strip().strip("\"'.").lower().split()
            return {"true": True, "yes": True, "false": False, "no": False}.get(
                word[0] if word else "")
        if self.kind == "object":
            return value if _valid_object(value, self.schema) else None
        return None


def _kind_word(kind: Any) -> str:
    return "one of " + "/".join(kind) if isinstance(kind, list | tuple) else str(kind)


def _json(text: str) -> Any:
    t = text.strip()
    if t.startswith("```"):
        t = t.strip("`").removeprefix("json").strip()
    try:
        return json.loads(t)
    except ValueError:
        return None


def _label(text: str, labels: list[str]) -> str | None:
    """Exactly a label (ignoring case and quotes), else the one label the reply is the start of
    (a one-token reply: `LeafType.first_token`), else the one label named as a whole word."""
    t = text.strip().strip("\"'`.").strip()
    by_lower = {x.lower(): x for x in labels}
    if t.lower() in by_lower:
        return by_lower[t.lower()]
    starts = [x for x in labels if t and x.lower().startswith(t.lower())]
    if len(starts) == 1:
        return starts[0]
    named = [x for x in labels if re.search(rf"(?<!\w){re.escape(x)}(?!\w)", text, re.I)]
    return named[0] if len(named) == 1 else None


def _valid_object(value: Any, schema: dict[str, Any] | None) -> bool:
    if not isinstance(value, dict) or schema is None:
        return False
    import jsonschema
    return jsonschema.Draft202012Validator(schema).is_valid(value)


# ------------------------------------------------------------------ plans of calls
@dataclass
class Estimate:
    calls: int
    input_tokens: int
    output_tokens: int
    leaf_tokens: int
    cost_usd: float | None
    levels: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "tokens": self.input_tokens +
                self.output_tokens, "leaf_tokens": self.leaf_tokens, "cost_usd": self.cost_usd,
                "levels": self.levels}


def _items(items: Any) -> list[str]:
    if isinstance(items, str) or not isinstance(items, list):
        raise CombinatorError("items must be a list (of strings, or values turned into "
                              "strings); to cut one text into pieces use chunk(text) first")
    if len(items) > MAX_ITEMS:
        raise CombinatorError(f"at most {MAX_ITEMS:,} items per call, got {len(items):,}")
    return [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str)
            for x in items]


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CombinatorError(f"{what} must be a non-empty string")
    return value.strip()


LEAF_TEXT = "\n\nText:\n"
LEAF_END = "\n---\n"


def leaf_prompt(item: str, instruction: str, leaf: LeafType) -> str:
    """What to do first, then the text, then what to answer. Every leaf of a map begins with
    the same words, so a server that keeps a prompt cache (llama.cpp: `cache_prompt`) reads
    them once per slot instead of once per leaf; the last line says what to answer, which
    small models follow best."""
    tail = leaf.instruction or instruction
    return f"{instruction}{LEAF_TEXT}{item}{LEAF_END}{tail}"


def leaf_item(prompt: str) -> str:
    """The item a leaf prompt holds (the inverse of `leaf_prompt`, for tests and probes)."""
    head, sep, rest = prompt.partition(LEAF_TEXT)
    return rest.rsplit(LEAF_END, 1)[0] if sep else prompt


def _check_fit(prompts: list[str], limit: int, what: str) -> list[int]:
    sizes = [tokens(p) for p in prompts]
    over = [i for i, n in enumerate(sizes) if n > limit + PROMPT_OVERHEAD]
    if over:
        shown = ", ".join(f"#{i} (~{sizes[i]:,} tokens)" for i in over[:5])
        raise CombinatorError(
            f"{len(over)} {what} too long for one sub-call (at most ~{limit:,} tokens of text "
            f"each): {shown}. Cut them with chunk(text) first.")
    return sizes


def _estimate(dispatcher: Dispatcher, client: ModelClient, in_tokens: int, calls: int,
              out_tokens: int, levels: int = 1) -> Estimate:
    from recursa.core.dispatch import estimate_cost
    in_all = in_tokens + 4 * calls
    return Estimate(calls=calls, input_tokens=in_all, output_tokens=out_tokens,
                    leaf_tokens=leaf_tokens(client),
                    cost_usd=estimate_cost(client, in_all, out_tokens), levels=levels)


def check_budget(dispatcher: Dispatcher, est: Estimate) -> None:
    """Refuse, before any call, a map whose bound the budget cannot cover."""
    ledger = dispatcher.ledger
    b = ledger.budget
    if b.max_subcalls is not None and ledger.subcalls + est.calls > b.max_subcalls:
        raise CombinatorError(
            f"this needs {est.calls:,} sub-calls but only {b.max_subcalls - ledger.subcalls:,} "
            "are left in the budget (max_subcalls); use fewer or larger items (chunk with a "
            "larger size, or filter first)")
    if b.max_tokens is not None and ledger.tokens + est.input_tokens + est.output_tokens \
            > b.max_tokens:
        raise CombinatorError(
            f"this needs up to {est.input_tokens + est.output_tokens:,} tokens but only "
            f"{b.max_tokens - ledger.tokens:,} are left in the budget (max_tokens)")
    if b.max_cost_usd is not None and est.cost_usd is not None and \
            ledger.cost_spent + est.cost_usd > b.max_cost_usd:
        raise CombinatorError(f"this may cost up to ${est.cost_usd:.4f} but only "
                              f"${b.max_cost_usd - ledger.cost_spent:.4f} is left (max_cost_usd)")


# ------------------------------------------------------------------ the REPL's calls
async def handle(dispatcher: Dispatcher, kind: str, args: dict[str, Any], node: Node) -> Any:
    """A combinator call from the REPL: {"values": [...], "note": ...}, {"estimate": {...}}, or
    {"error": message}; never raises for bad input."""
    try:
        if kind == "leaf_size":
            client = dispatcher._client(args.get("model"))
            return {"tokens": leaf_tokens(client), "window": window_of(client)}
        if kind == "llm_reduce":
            return await _reduce(dispatcher, args, node)
        if kind == "llm_rank":
            return await _rank(dispatcher, args, node)
        return await _map(dispatcher, kind, args, node)
    except CombinatorError as e:
        return {"error": str(e)}
    except Exception as e:   # the dispatcher's own errors (an unknown model, ...)
        return {"error": f"{type(e).__name__}: {e}"}


async def _map(dispatcher: Dispatcher, kind: str, args: dict[str, Any], node: Node) -> Any:
    items = _items(args.get("items"))
    client = dispatcher._client(args.get("model"))
    if kind == "llm_filter":
        instruction = _text(args.get("question"), "the question")
        leaf = LeafType.of(labels=["yes", "no"])
        instruction = f"Question about the text: {instruction}"
    else:
        instruction = _text(args.get("instruction"), "the instruction")
        leaf = LeafType.of(args.get("labels"), args.get("output"), _max_tokens(args))
    prompts = [leaf_prompt(x, instruction, leaf) for x in items]
    sizes = _check_fit(prompts, leaf_tokens(client), "items are")
    est = _estimate(dispatcher, client, sum(sizes), len(prompts), leaf.max_tokens * len(prompts))
    if args.get("dry_run"):
        return {"estimate": est.as_dict()}
    check_budget(dispatcher, est)
    values, failed, invalid, partial = await _run_leaves(dispatcher, args.get("model"), prompts,
                                                leaf.options(client),
                                                lambda text, _: leaf.parse(text), node, kind,
                                                est, {"instruction": instruction[:300],
                                                      "type": leaf.kind})
    if kind == "llm_filter":
        kept = [i for i, v in enumerate(values) if v == "yes"]
        return {"values": kept, "note": _note(kind, len(items), failed, invalid, partial)}
    return {"values": values, "note": _note(kind, len(items), failed, invalid, partial)}


# Asked yes / no whether a sentence answers, the 1.5B says yes to most sentences that share a
# thing with the question (a dev probe: no to 45 of 144 look-alikes and filing notes);
# how sure its yes is tells them apart somewhat better: ranked by the yes's log-odds, the answer
# came first among 6 look-alikes and 3 notes on 7 of 16 dev instances, as the leaf below is worded;
# with the text first and a "---" rule, 1 of 8 (benchmarks/probes/rank_yes.py).
RANK_PROMPT = ("Text: {item}\nQuestion: {q}\nThe text may use other words for the same things. "
               "Is it about the very same thing the question asks about, and does it give the "
               "answer? Reply yes or no.")
RANK_TOP = 10        # alternatives of the first token asked for


def yes_score(text: str, logprobs: dict[str, float] | None) -> float:
    """log P(yes) - log P(no) from the first token's alternatives; without logprobs (a client
    that gives none) the reply's own word: +1 yes, -1 no, 0 neither."""
    if logprobs:
        p = {"yes": 0.0, "no": 0.0}
        for token, lp in logprobs.items():
            word = token.strip().lower()
            if word in p:
                p[word] += math.exp(lp)
        if p["yes"] or p["no"]:
            return math.log(p["yes"] + 1e-9) - math.log(p["no"] + 1e-9)
    word = (re.findall(r"[a-z]+", text.lower()) or [""])[0]
    return 1.0 if word == "yes" else -1.0 if word == "no" else 0.0


def _score(text: str, comp: Completion | None) -> float | None:
    return None if comp is None else round(yes_score(text, comp.first_logprobs), 4)


async def _rank(dispatcher: Dispatcher, args: dict[str, Any], node: Node) -> Any:
    """One yes / no sub-call per item: its score is how sure the sub-model is that the item
    answers the question (yes_score); {"values": scores} in the items' order."""
    items = _items(args.get("items"))
    client = dispatcher._client(args.get("model"))
    question = _text(args.get("question"), "the question")
    prompts = [RANK_PROMPT.format(item=x, q=question) for x in items]
    sizes = _check_fit(prompts, leaf_tokens(client), "items are")
    est = _estimate(dispatcher, client, sum(sizes), len(prompts), len(prompts))
    if args.get("dry_run"):
        return {"estimate": est.as_dict()}
    check_budget(dispatcher, est)
    opts = {"max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": RANK_TOP}
    scores, failed, _, partial = await _run_leaves(dispatcher, args.get("model"), prompts, opts, _score,
                                          node, "llm_rank", est,
                                          {"instruction": question[:300], "type": "rank"},
                                          traced_as="scores")
    return {"values": scores, "note": _note("llm_rank", len(items), failed, 0, partial)}


def _max_tokens(args: dict[str, Any]) -> int | None:
    n = args.get("max_tokens")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 8192:
        raise CombinatorError("max_tokens must be an integer from 1 to 8192")
    return n


def _note(kind: str, n: int, failed: int, invalid: int,
          partial: Partial | None = None) -> str | None:
    if not failed and not invalid:
        return None
    parts = ([f"partial: {partial.describe()}, the others None"] if partial else []) + \
        ([f"{failed} failed (None)"] if failed else []) + \
        ([f"{invalid} replies did not fit the type (None)"] if invalid else [])
    return f"{kind}: {n} items; " + "; ".join(parts)


# A map stops this long before the run's time limit, so that its finished leaves reach the REPL
# and the cell's own code (counting, printing) runs before the cell is cut: a cut cell loses
# every value the map had (a demo on a slow machine answered "none" after 26 of 48 leaves).
STOP_MARGIN_S = 3.0
STOP_MARGIN_SHARE = 0.1       # ... but never more than this share of the time left at its start
PROGRESS_EVERY_S = 1.0        # a map's progress update in the trace, at most this often


async def _run_leaves(dispatcher: Dispatcher, model: str | None, prompts: list[str],
                      opts: dict[str, Any], read: Callable[[str, Completion | None], Any],
                      node: Node, kind: str, est: Estimate, info: dict[str, Any],
                      traced_as: str | None = None
                      ) -> tuple[list[Any], int, int, Partial | None]:
    """Every prompt as one sub-call with the host's `opts`, in parallel (the dispatcher's
    slots bound it), under one traced `combinator` span with progress updates (done / total,
    rate, time left); `read` turns a reply (its text, and its Completion, None when the call
    failed) into the leaf's value, None when it does not fit. `traced_as`: the span's end also
    keeps the values, under that name.

    A limit never throws the finished leaves away: near the time limit the map stops, the
    leaves not done are None, and the map is recorded as partial (`dispatcher.partial`)."""
    from recursa.core.dispatch import Node as _Node
    from recursa.core.dispatch import Partial
    ev = dispatcher.tracer.emit("combinator", phase="start", parent=node.parent,
                                depth=node.depth, op=kind, items=len(prompts),
                                estimate=est.as_dict(), **info)
    inner = _Node(depth=node.depth, parent=ev, role=node.role)
    tasks = [asyncio.ensure_future(dispatcher.sub_call(p, model, {}, inner, host_options=opts))
             for p in prompts]
    progress = _Progress(dispatcher, ev, node, kind, len(tasks))
    cut = await _until_done_or_deadline(dispatcher, tasks, progress)
    cut_text = "Error: not run (the map stopped at the time limit)"
    replies: list[tuple[str, Completion | None]] = [
        (cut_text, None) if t.cancelled() or t.exception() is not None else t.result()
        for t in tasks]
    values = [read(text, comp) for text, comp in replies]
    failed = sum(text.startswith("Error:") for text, _ in replies)
    invalid = sum(v is None for v in values) - failed
    answered = sum(not text.startswith("Error:") for text, _ in replies)
    limit = "max_seconds" if cut else         dispatcher.ledger.limit_reached() if failed else None
    partial = Partial(kind, answered, len(tasks), limit) if limit else None
    if partial is not None:
        dispatcher.partial.append(partial)
    progress.update(force=True)
    shown = {traced_as: values[:200]} if traced_as else {}
    more = {"partial": {"done": answered, "total": len(tasks), "limit": limit}} \
        if partial else {}
    dispatcher.tracer.emit("combinator", id=ev, phase="end", parent=node.parent,
                           depth=node.depth, op=kind, failed=failed, invalid=invalid,
                           **more, **shown)
    return values, failed, invalid, partial


async def _until_done_or_deadline(dispatcher: Dispatcher, tasks: Sequence[asyncio.Future[Any]],
                                  progress: _Progress) -> bool:
    """Wait for the leaves, updating progress as they finish; at the map's stop time (a
    margin before the run's time limit) cancel those still running. True when it stopped
    them."""
    loop = asyncio.get_running_loop()
    left = dispatcher.ledger.deadline.left()
    stop = None if left is None else \
        loop.time() + left - min(STOP_MARGIN_S, max(0.0, left) * STOP_MARGIN_SHARE)
    pending: set[asyncio.Future[Any]] = set(tasks)
    try:
        while pending:
            timeout = PROGRESS_EVERY_S if stop is None else \
                max(0.0, min(PROGRESS_EVERY_S, stop - loop.time()))
            finished, pending = await asyncio.wait(pending, timeout=timeout,
                                                   return_when=asyncio.FIRST_COMPLETED)
            progress.done += len(finished)
            progress.update()
            if stop is not None and loop.time() >= stop and pending:
                return True
        return False
    finally:    # stopped, or this cell cancelled: no leaf outlives the map
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


class _Progress:
    """A map's progress as `combinator` update events: done / total, the rate so far and the
    time left at that rate (every view shows them: recursa.obs.progress)."""

    def __init__(self, dispatcher: Dispatcher, ev: str, node: Node, kind: str, total: int):
        self.dispatcher, self.ev, self.node, self.kind, self.total = \
            dispatcher, ev, node, kind, total
        self.done = 0
        self.t0 = time.monotonic()
        self._last = self.t0

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        elapsed = now - self.t0
        rate = self.done / elapsed if elapsed > 0 and self.done else None
        eta = (self.total - self.done) / rate if rate else None
        self.dispatcher.tracer.emit(
            "combinator", id=self.ev, phase="update", parent=self.node.parent,
            depth=self.node.depth, op=self.kind, done=self.done, total=self.total,
            elapsed_s=round(elapsed, 2), rate_per_s=None if rate is None else round(rate, 3),
            eta_s=None if eta is None else round(eta, 1))


async def _reduce(dispatcher: Dispatcher, args: dict[str, Any], node: Node) -> Any:
    """Tree-wise: pack consecutive items into leaves that fit, ask each leaf, repeat on the
    answers until one is left."""
    items = _items(args.get("items"))
    if not items:
        raise CombinatorError("llm_reduce needs at least one item")
    instruction = _text(args.get("instruction"), "the instruction")
    client = dispatcher._client(args.get("model"))
    leaf = LeafType.of(None, None, _max_tokens(args))
    limit = leaf_tokens(client)
    _check_fit([leaf_prompt(x, instruction, leaf) for x in items], limit, "items are")
    est = _reduce_estimate(dispatcher, client, [tokens(x) for x in items], instruction, leaf,
                           limit)
    if args.get("dry_run"):
        return {"estimate": est.as_dict()}
    check_budget(dispatcher, est)
    level, failed = items, 0
    while True:
        groups = _pack([tokens(x) for x in level], limit)
        if level is not items and len(groups) == len(level) > 1:
            # answers longer than estimated: combine two at a time so the tree still shrinks
            groups = [list(range(i, min(i + 2, len(level)))) for i in range(0, len(level), 2)]
        prompts = [leaf_prompt("\n\n---\n\n".join(level[i] for i in g), instruction, leaf)
                   for g in groups]
        outs, f, _, cut = await _run_leaves(dispatcher, args.get("model"), prompts,
                                       leaf.options(client), lambda text, _: leaf.parse(text),
                                       node, "llm_reduce", est,
                                       {"instruction": instruction[:300], "type": "text"})
        failed += f
        level = [o if o is not None else "" for o in outs]
        if cut is not None:       # a limit: no level above this one can run either
            return {"values": "\n\n".join(x for x in level if x),
                    "note": _note("llm_reduce", len(items), failed, 0, cut)}
        if len(level) == 1:
            return {"values": level[0], "note": _note("llm_reduce", len(items), failed, 0)}


def _pack(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive items into groups of at most `limit` tokens (at least one item each)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, n in enumerate(sizes):
        if cur and used + n > limit:
            groups.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n + 4
    if cur:
        groups.append(cur)
    return groups


def _reduce_estimate(dispatcher: Dispatcher, client: ModelClient, sizes: list[int],
                     instruction: str, leaf: LeafType, limit: int) -> Estimate:
    """The worst case: every answer as long as its cap."""
    calls = in_tokens = levels = 0
    extra = tokens(instruction) + 16
    while True:
        groups = _pack(sizes, limit)
        if len(groups) > 1 and len(groups) == len(sizes) and levels > 0:
            raise CombinatorError("llm_reduce cannot combine these answers within the "
                                  "sub-model's window; lower max_tokens")
        levels += 1
        calls += len(groups)
        in_tokens += sum(sizes) + extra * len(groups)
        if len(groups) == 1:
            break
        sizes = [leaf.max_tokens] * len(groups)
    return _estimate(dispatcher, client, in_tokens, calls, calls * leaf.max_tokens, levels)
