"""The RLM loop: one root model, one sandboxed REPL, turn after turn until the answer is ready.

`run_loop` serves the top-level run and every child RLM; `RunEnv` is what they share (budget
ledger, dispatcher, tracer, clients, settings).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa import context as ctx
from recursa import prompts
from recursa.budget import Budget, Ledger
from recursa.dispatch import Dispatcher, Node, text_tokens
from recursa.parse import (
    cap,
    code_blocks,
    final_line,
    final_literal,
    format_cell,
    normalize_code,
    prose_answer,
)
from recursa.tempdirs import owned_tempdir
from recursa.trace import Tracer
from recursa.types import (
    BudgetExceeded,
    ContextError,
    Message,
    ModelClient,
    ModelError,
    Result,
    Sandbox,
)

KEEP = "KEEP"
WINDOW_FILL = 0.85            # compact the root's history beyond this share of its window
COMPACT_TO = 0.7              # ... down to this share of the budget when it can
DEFAULT_TURN_TOKENS = 1024    # the root's output cap when neither its options nor client say


@dataclass
class RunEnv:
    budget: Budget
    ledger: Ledger
    tracer: Tracer
    dispatcher: Dispatcher
    root_client: ModelClient
    make_sandbox: Callable[[], Sandbox]
    max_output_chars: int = 8192
    root_options: dict[str, Any] = field(default_factory=dict)
    tips: str | None = None
    tool_names: list[str] | None = None
    system_template: str | None = None
    sub_context_chars: int = 100_000
    # the most tokens of history sent to the root model; the root client's `context_window`
    # (or `n_ctx`) bounds it too. None and no window known: the history is never compacted.
    max_history_tokens: int | None = None


@dataclass
class _State:
    """What a run has so far; whatever happens, a Result is built from it."""

    answer: dict[str, Any] = field(default_factory=lambda: {"content": "", "ready": False})
    final: str | None = None
    turns: int = 0
    limit: str | None = None
    error: Exception | str | None = None
    consecutive_errors: int = 0
    first_user: str = ""
    full: list[Message] = field(default_factory=list)   # every message, never compacted
    log: list[str] = field(default_factory=list)         # one line per turn, for compaction
    cells_run: int = 0
    model_calls: int = 0          # llm_query / rlm_query / ... calls from this run's REPL
    variables: list[str] = field(default_factory=list)
    last_code: str | None = None  # the last turn whose code ran: normalised code, turn, output
    last_turn: int = 0
    last_shown: str = ""
    last_failed: bool = False
    last_called: bool = False     # it called a model, so a rerun may print something else
    prose_draft: str | None = None
    history_var: str | None = None
    seen: list[str] = field(default_factory=list)   # what the model was shown (query, outputs)
    held: bool = False            # a commit with a number never shown was held once


async def run_loop(env: RunEnv, query: str, context: Any, *, depth: int = 0,
                   parent: str | None = None) -> Result:
    t0 = time.monotonic()
    kind = "run" if depth == 0 else "child"
    run_ev = env.tracer.emit(kind, phase="start", parent=parent, depth=depth, query=query,
                             model=env.root_client.name, budget=env.budget.model_dump())
    st = _State()
    workdir = Path(owned_tempdir("recursa-ctx-"))
    sandbox: Sandbox | None = None
    starting: asyncio.Task[None] | None = None
    try:
        prep = ctx.prepare(context, workdir)
        env.tracer.emit("run", parent=run_ev, depth=depth, context_sha256=prep.payload.sha256,
                        context_bytes=prep.payload.size_bytes, context_chars=prep.chars,
                        description=prep.description)
        sandbox = env.make_sandbox()
        node = Node(depth=depth, parent=run_ev, role="sub")
        # The worker starts while the root model writes its first reply: with a real model the
        # sandbox's start-up (a process, bubblewrap, the context load) costs no wall time.
        base_handler = env.dispatcher.handler(node)

        async def handler(kind: str, args: dict[str, Any]) -> Any:
            st.model_calls += 1
            return await base_handler(kind, args)
        starting = asyncio.create_task(sandbox.start(prep.payload, handler))

        announced: list[bool] = []

        async def ready() -> None:
            await starting         # a failed start raises here, at the first cell
            if not announced:
                announced.append(True)
                env.tracer.emit("run", parent=run_ev, depth=depth, sandbox=sandbox.isolation)

        messages = _first_messages(env, query, prep.description)
        st.first_user = messages[1]["content"]
        st.seen.append(_digits(st.first_user))
        st.full = list(messages)
        env.tracer.emit("run", parent=run_ev, depth=depth, system=messages[0]["content"],
                        first_user=messages[1]["content"])
        await _turns(env, st, sandbox, ready, node, messages, query, depth, run_ev)
        if st.final is None and not isinstance(st.error, ModelError):
            await _last_turn(env, st, messages, query, depth, run_ev)
    except ContextError as e:
        st.error = e
        if depth == 0:
            raise
    except BudgetExceeded as e:
        st.limit = e.limit
    except Exception as e:   # an unexpected failure still yields a Result with the spend
        st.error = e
    finally:
        if starting is not None:   # never leave the start running or its error unretrieved
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        if sandbox is not None:
            await sandbox.close()
        shutil.rmtree(workdir, ignore_errors=True)
        res = _result(env, st, t0, depth)
        env.tracer.emit("final", parent=run_ev, depth=depth, answer=res.answer,
                        status=res.status, ready=res.ready, limit=res.limit, error=res.error)
        # tree totals only on the top-level run: a child's own figures are its subtree's sums
        totals = dict(cost_usd=res.cost_usd, tokens=env.ledger.tokens,
                      subcalls=env.ledger.subcalls) if depth == 0 else {}
        env.tracer.emit(kind, id=run_ev, phase="end", parent=parent, depth=depth,
                        status=res.status, turns=res.turns, elapsed_s=res.elapsed_s, **totals)
    return res


async def _turns(env: RunEnv, st: _State, sandbox: Sandbox,
                 ready: Callable[[], Awaitable[None]], node: Node,
                 messages: list[Message], query: str, depth: int, run_ev: str) -> None:
    """Model writes code, sandbox runs it, output goes back; until final or a limit."""
    b = env.budget
    role = "root" if depth == 0 else "child"

    async def push_history() -> str | None:
        return await _push_history(st, sandbox, ready)

    while True:
        st.limit = env.ledger.limit_reached(subcalls=False) or (
            "max_iterations" if st.turns >= b.max_iterations else None)
        if st.limit:
            return
        turn_ev = env.tracer.emit("turn", phase="start", parent=run_ev, depth=depth,
                                  turn=st.turns + 1)
        try:
            await _fit(env, st, messages, 0, turn_ev, depth, push_history)
            comp = await env.dispatcher.call_model(env.root_client, messages, role=role,
                                                   subcall=False, options=env.root_options)
        except BudgetExceeded as e:
            st.limit = e.limit
            env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth,
                            error=str(e))
            return
        except ModelError as e:
            st.error = e
            env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth,
                            error=str(e))
            return
        st.turns += 1
        # the spend is in the trace before any cell runs: a host killed mid-cell still shows it
        env.tracer.emit("turn", id=turn_ev, phase="update", parent=run_ev, depth=depth,
                        usage=comp.usage.model_dump(), cost_usd=comp.cost_usd, model=comp.model)
        _append(st, messages, {"role": "assistant", "content": comp.text})
        blocks = code_blocks(comp.text)
        bare = None
        if not blocks:     # a `FINAL(...)` line outside any fence runs as code
            bare = final_line(comp.text)
            blocks = [bare] if bare else []
        code = normalize_code(blocks)
        extra: dict[str, Any] = {}
        nudge: str | None = None      # a message other than the outputs or NO_CODE
        failed_turn = True
        if blocks and code == st.last_code and not st.last_called:
            nudge = _repeated(st, extra)      # the same code as the last turn that ran
        elif blocks:
            await ready()
            failed_turn = await _run_blocks(env, st, sandbox, node, blocks, bare, code, turn_ev,
                                            depth, extra)
        else:
            nudge = await _prose(env, st, sandbox, ready, comp.text, extra)
        if st.final is not None and not st.held:
            number = _ungrounded(st, st.final, "\n".join(blocks) if blocks else comp.text)
            if number:      # a number written into the answer but never seen: ask once
                st.held = True
                extra["held"] = {"answer": st.final, "number": number}
                st.answer = {"content": st.final, "ready": False}
                st.final = None
                st.last_code = None     # sending the same commit again confirms it
                await _run_hidden(sandbox, ready, f"answer = {st.answer!r}")
                held = prompts.UNGROUNDED.format(number=number)
                nudge = f"{st.last_shown}\n\n{held}" if blocks else held
        ended = st.final is not None
        if not ended:
            st.consecutive_errors = st.consecutive_errors + 1 if failed_turn else 0
            ended = st.consecutive_errors >= b.max_consecutive_errors
        feedback = None
        if not ended:
            body = nudge if nudge is not None else (
                st.last_shown if blocks else prompts.NO_CODE)
            feedback = body + "\n\n" + prompts.CONTINUE.format(query=query[:500])
            if nudge is not None:      # not rebuilt from the cells: traced as it was sent
                extra["feedback"] = feedback
        env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth,
                        text=comp.text, usage=comp.usage.model_dump(), cost_usd=comp.cost_usd,
                        model=comp.model, latency_s=round(comp.latency_s, 4), blocks=len(blocks),
                        ended=ended, **extra)
        if st.final is not None:
            return
        if ended:
            st.limit = "max_consecutive_errors"
            return
        assert feedback is not None
        _append(st, messages, {"role": "user", "content": feedback})


def _repeated(st: _State, extra: dict[str, Any]) -> str:
    """The reminder for a turn whose code is the last code that ran: it is not run again."""
    extra["repeat_of"] = st.last_turn
    st.log.append(f"Turn {st.turns}: sent turn {st.last_turn}'s code again (not run).")
    what = prompts.REPEATED_FAILED if st.last_failed else prompts.REPEATED_OK
    return prompts.REPEATED.format(turn=st.last_turn, what=what.format(
        output=cap(st.last_shown, 600)),
        todo=prompts.TODO_FAILED if st.last_failed else prompts.TODO_OK)


async def _run_blocks(env: RunEnv, st: _State, sandbox: Sandbox, node: Node, blocks: list[str],
                      bare: str | None, code: str, turn_ev: str, depth: int,
                      extra: dict[str, Any]) -> bool:
    """Run a turn's blocks in order until one commits; True when every block failed."""
    b = env.budget
    outputs: list[str] = []
    failed = 0
    calls0 = st.model_calls
    for i, block in enumerate(blocks):
        cell_ev = env.tracer.emit("cell", phase="start", parent=turn_ev, depth=depth,
                                  index=i, code=block)
        node.parent = cell_ev
        remaining = env.ledger.remaining_seconds()
        timeout = b.cell_timeout if remaining is None else max(1.0, min(b.cell_timeout,
                                                                         remaining))
        cell = await sandbox.run(block, timeout=timeout, max_output_chars=env.max_output_chars)
        shown = format_cell(cell, env.max_output_chars // len(blocks))
        failed += cell.error is not None
        st.answer = cell.answer
        st.variables = list(cell.variables)
        st.cells_run += 1
        env.tracer.emit("cell", id=cell_ev, phase="end", parent=turn_ev, depth=depth,
                        output=shown, error=_last_line(cell.error),
                        elapsed_s=round(cell.elapsed_s, 4), timed_out=cell.timed_out,
                        restarted=cell.restarted, ready=cell.final is not None)
        outputs.append(shown if len(blocks) == 1 else f"[block {i + 1}]\n{shown}")
        st.seen.append(_digits(shown))
        if cell.final is not None:
            st.final = cell.final
            break
        if bare and cell.error and "SyntaxError" in cell.error:
            # `FINAL(March 2023)` outside a fence: not Python, but plainly the answer
            st.final = final_literal(bare)
            extra["prose_answer"] = {"kind": "final", "content": st.final}
    st.last_code, st.last_turn = code, st.turns
    st.last_shown = "\n\n".join(outputs)
    st.last_failed = failed == len(blocks)
    st.last_called = st.model_calls > calls0
    st.log.append(f"Turn {st.turns} ran:\n{_abridge(chr(10).join(blocks), 240)}\n"
                  f"Output: {_abridge(st.last_shown, 160)}")
    return st.last_failed


async def _prose(env: RunEnv, st: _State, sandbox: Sandbox,
                 ready: Callable[[], Awaitable[None]], text: str,
                 extra: dict[str, Any]) -> str | None:
    """A reply without code that states an answer, once some code has run (design note 10):
    "Final answer: X" commits X; a short reply, or "Answer: X", becomes the draft
    answer["content"] (unless code already built a different draft), and the same draft stated
    again commits it. Returns the nudge to send, or None for the plain NO_CODE message.
    """
    st.log.append(f"Turn {st.turns} replied without code: {_abridge(text.strip(), 200)}")
    found = prose_answer(text) if st.cells_run else None   # before any output: a guess
    if found is None:
        return None
    explicit, answer = found
    if explicit or answer == st.prose_draft:
        st.final = answer
        extra["prose_answer"] = {"kind": "final", "content": answer}
        return None
    current = str(st.answer.get("content") or "")
    if current and current != st.prose_draft:
        return None        # code built a draft: a sentence does not replace it
    st.prose_draft = answer
    st.answer = {"content": answer, "ready": False}
    await _run_hidden(sandbox, ready, f"answer[{'content'!r}] = {answer!r}")
    extra["prose_answer"] = {"kind": "draft", "content": answer}
    return prompts.DRAFT.format(draft=answer)


async def _run_hidden(sandbox: Sandbox, ready: Callable[[], Awaitable[None]],
                      code: str) -> bool:
    """Run harness code in the REPL (not a model turn, not traced as a cell); best effort."""
    try:
        await ready()
        cell = await sandbox.run(code, timeout=30.0, max_output_chars=1000)
    except Exception:
        return False
    return cell.error is None


async def _push_history(st: _State, sandbox: Sandbox,
                        ready: Callable[[], Awaitable[None]]) -> str | None:
    """Put the whole conversation so far in the REPL as a list of messages; its name."""
    name = st.history_var or ("history" if "history" not in st.variables else "full_history")
    data = json.dumps(st.full, ensure_ascii=False)
    ok = await _run_hidden(sandbox, ready, f"{name} = __import__('json').loads({data!r})")
    if ok:
        st.history_var = name
    return name if ok else None


_NUMBER = re.compile(r"(?<![\d.])\d[\d,]*\d(?![\d])")


def _digits(text: str) -> str:
    """`text` with thousands separators inside numbers dropped (42,733 -> 42733)."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def _ungrounded(st: _State, answer: str, source: str) -> str | None:
    """What the model wrote into its answer by hand (it is in the code or text that committed
    it) but no output ever showed: a number of three or more digits that neither an output nor
    the query holds, or, for an answer typed whole as a literal, content words of which not one
    appears in any output (the query's own words do not count as evidence)."""
    seen = "\n".join(st.seen)
    for m in _NUMBER.finditer(answer):
        number = _digits(m.group())
        if len(number) < 3 or m.group() not in source:
            continue
        if not re.search(rf"(?<!\d){re.escape(number)}(?!\d)", seen):
            return m.group()
    if answer.strip() not in source:     # computed by code, not typed: not a guess
        return None
    outputs = "\n".join(st.seen[1:]).lower()          # st.seen[0] is the first user message
    asked = set(_WORD.findall(st.first_user.lower()))
    words = [w for w in dict.fromkeys(_WORD.findall(answer.lower()))
             if w not in _STOP and w not in asked]
    if len(words) >= 2 and not any(re.search(rf"\b{w}\b", outputs) for w in words):
        return ", ".join(repr(w) for w in words[:3])
    return None


_WORD = re.compile(r"[a-z][a-z'-]{3,}")
_STOP = frozenset("""that this with from were have been which their there they them then than
what when where will would could should about into over also only some such more most very
your yours answer final none unknown found because after before other these those while""".split())


def _append(st: _State, messages: list[Message], msg: Message) -> None:
    messages.append(msg)
    st.full.append(msg)


def _abridge(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f" ... [{len(text) - limit:,} more characters]"


# ------------------------------------------------------------------ compaction
_DIGIT = re.compile(r"\d")


def _tokens(text: str) -> int:
    """text_tokens, plus digits at one token each (tokenizers such as Qwen's split numbers
    into single digits, which chars/4 undercounts four-fold)."""
    return text_tokens(text) + (3 * len(_DIGIT.findall(text))) // 4


def _msg_tokens(messages: list[Message]) -> int:
    return sum(_tokens(str(m.get("content", ""))) + 5 for m in messages)


def history_budget(env: RunEnv) -> int | None:
    """The most tokens of messages the root may be sent, or None when nothing bounds it."""
    client = env.root_client
    window = getattr(client, "context_window", None) or getattr(client, "n_ctx", None)
    bounds = []
    if window:
        out = env.root_options.get("max_tokens") or \
            (getattr(client, "default_options", None) or {}).get("max_tokens") or \
            DEFAULT_TURN_TOKENS
        bounds.append(int(int(window) * WINDOW_FILL) - min(int(out), int(window) // 4))
    if env.max_history_tokens:
        bounds.append(int(env.max_history_tokens))
    return min(bounds) if bounds else None


async def _fit(env: RunEnv, st: _State, messages: list[Message], extra_tokens: int,
               turn_ev: str, depth: int,
               push: Callable[[], Awaitable[str | None]] | None) -> None:
    """Compact `messages` in place when they (plus `extra_tokens` still to come) would not fit
    the root's window; trace the exact replacement (design note 11)."""
    budget = history_budget(env)
    if budget is None:
        return
    before = _msg_tokens(messages) + extra_tokens
    if before <= budget or len(messages) <= 2:   # nothing but the system and query messages
        return
    var = await push() if push is not None else st.history_var
    start, end, new = _compact(st, messages, budget - extra_tokens, var)
    messages[start:end] = new
    env.tracer.emit("turn", parent=turn_ev, depth=depth, compaction={
        "start": start, "end": end, "messages": new, "tokens_before": before,
        "tokens_after": _msg_tokens(messages) + extra_tokens, "budget": budget,
        "history_var": var})


def _compact(st: _State, messages: list[Message], budget: int,
             var: str | None) -> tuple[int, int, list[Message]]:
    """Replace messages[1:end] by the first user message with a summary of the turns removed,
    keeping the last two exchanges, or one. It aims at COMPACT_TO of the budget, so that the
    next turns do not compact again at once; if even one exchange does not fit the budget (a
    long output), its messages are cut down."""
    head = messages[:1]
    starts = [i for i, m in enumerate(messages) if i >= 2 and m["role"] == "assistant"]
    aim = int(budget * COMPACT_TO)
    for target, keep in ((aim, 2), (aim, 1), (budget, 1)):
        cut = starts[-min(keep, len(starts))] if starts else len(messages)
        tail = messages[cut:]
        kept = sum(m["role"] == "assistant" for m in tail)
        rest = _msg_tokens([*head, {"content": st.first_user}, *tail])
        # the summary never crowds out the live turns, but lists a turn or two if it can
        room = min(budget // 4, max(min(aim, target) - rest, (budget - rest) // 2))
        first = _summary_message(st, st.turns - kept, var, room)
        if _msg_tokens([*head, first, *tail]) <= target:
            return 1, cut, [first]
    first = _summary_message(st, st.turns - kept, var, 0)
    room = max(0, budget - _msg_tokens([*head, first]))
    cut_tail = []
    for j, m in enumerate(tail):
        short = _shrink(str(m["content"]), room // max(1, len(tail) - j) - 5)
        room -= _msg_tokens([{"content": short}])
        cut_tail.append({"role": m["role"], "content": short})
    return 1, len(messages), [first, *cut_tail]


def _summary_message(st: _State, removed: int, var: str | None, room: int) -> Message:
    """The first user message plus what turns 1..removed did, within `room` tokens (at least
    the frame with the variables)."""
    if removed <= 0:
        return {"role": "user", "content": st.first_user}
    history = prompts.COMPACTED_HISTORY.format(name=var) if var else ""
    variables = ", ".join(st.variables) or "(none)"
    entries = st.log[:max(0, removed)]

    def build(items: list[str]) -> Message:
        skipped = len(entries) - len(items)
        lines = ([f"(turns 1-{skipped} not listed)"] if skipped else []) + items
        text = prompts.COMPACTED.format(first=1, last=max(1, removed),
                                        items="\n".join(lines) or "(nothing)",
                                        variables=variables, history=history)
        return {"role": "user", "content": st.first_user + "\n\n" + text}

    items: list[str] = []
    msg = build(items)
    for entry in reversed(entries):     # the most recent turns first, while they fit
        trial = build([entry, *items])
        if _msg_tokens([trial]) - _msg_tokens([{"content": st.first_user}]) > room:
            break
        items.insert(0, entry)
        msg = trial
    return msg


def _shrink(text: str, tokens: int) -> str:
    """`text` cut in the middle to about `tokens` tokens, saying how much was cut."""
    if _tokens(text) <= tokens:
        return text
    keep = max(0, len(text) * tokens // max(1, _tokens(text)) - 80)
    while True:
        head = text[:keep * 2 // 3]
        tail = text[len(text) - keep // 3:] if keep // 3 else ""
        out = (f"{head}\n... [{len(text) - len(head) - len(tail):,} characters cut to fit the "
               f"context window] ...\n{tail}")
        if _tokens(out) <= tokens or keep == 0:
            return out
        keep = keep * 3 // 4


async def _last_turn(env: RunEnv, st: _State, messages: list[Message], query: str, depth: int,
                     run_ev: str) -> None:
    """At a limit: one no-code turn asks for the answer (admitted past the budget)."""
    draft = str(st.answer.get("content") or "")
    msg = prompts.LAST_TURN.format(limit=st.limit or "error", query=query[:500])
    if draft:
        msg += (f'\n\nYour answer["content"] so far ({len(draft):,} chars) begins: {draft[:500]!r}'
                f"\nReply with exactly {KEEP} to keep it as the final answer.")
    # the request joins the last feedback message, so user and assistant turns alternate
    merged = messages[-1]["role"] == "user"
    turn_ev = env.tracer.emit("turn", phase="start", parent=run_ev, depth=depth, last=True,
                              prompt=msg, merged=merged)
    await _fit(env, st, messages, _tokens(msg) + 5, turn_ev, depth, None)
    if merged:
        call = [*messages[:-1], {"role": "user",
                                 "content": messages[-1]["content"] + "\n\n" + msg}]
    else:
        call = [*messages, {"role": "user", "content": msg}]
    try:
        comp = await env.dispatcher.call_model(
            env.root_client, call,
            role="root" if depth == 0 else "child", subcall=False,
            options=env.root_options, force=depth == 0)   # only the top run may pass a limit
    except (ModelError, BudgetExceeded) as e:
        env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth, error=str(e))
        if st.error is None and st.limit is None:
            st.error = e
        return
    env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth, text=comp.text,
                    usage=comp.usage.model_dump(), cost_usd=comp.cost_usd, last=True,
                    model=comp.model, latency_s=round(comp.latency_s, 4))
    text = comp.text.strip()
    st.answer = {"content": draft if (draft and text.strip("`'\". ").upper() == KEEP) else text,
                 "ready": False}


def _last_line(error: str | None) -> str | None:
    if not error:
        return None
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "error"


def _first_messages(env: RunEnv, query: str, description: str) -> list[Message]:
    first_line = description.splitlines()[0] if description else ""
    ctype = first_line.removeprefix("source: ") if first_line.startswith("source:") else first_line
    system = prompts.system_prompt(context_type=ctype.removeprefix("type: "),
                                   max_output_chars=env.max_output_chars,
                                   sub_chars=env.sub_context_chars, tips=env.tips,
                                   tool_names=env.tool_names, template=env.system_template)
    return [{"role": "system", "content": system},
            {"role": "user", "content": prompts.FIRST_USER.format(query=query,
                                                                  description=description)}]


def _result(env: RunEnv, st: _State, t0: float, depth: int) -> Result:
    if st.final is not None:
        status, answer, ready = "final", st.final, True
    else:
        answer, ready = str(st.answer.get("content") or ""), False
        if st.error is not None and st.limit is None:
            status = "error"
        elif st.limit in (None, "max_iterations"):
            status = "extracted"
        elif st.limit == "max_consecutive_errors":
            status = "error"
        else:
            status = "limit"
    err = st.error
    error = f"{type(err).__name__}: {err}" if isinstance(err, Exception) else err
    if status == "error" and error is None and st.limit:
        error = f"stopped after {env.budget.max_consecutive_errors} consecutive failed turns"
    return Result(answer=answer, status=status, ready=ready,
                  usage={k: v.model_copy(deep=True) for k, v in env.ledger.by_role.items()},
                  usage_by_model={k: v.model_copy(deep=True)
                                  for k, v in env.ledger.by_model.items()},
                  cost_usd=env.ledger.cost_usd, turns=st.turns, subcalls=env.ledger.subcalls,
                  elapsed_s=round(time.monotonic() - t0, 4), error=error, limit=st.limit,
                  run_id=env.tracer.run_id)
