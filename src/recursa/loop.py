"""The RLM loop: one root model, one sandboxed REPL, turn after turn until the answer is ready.

`run_loop` serves the top-level run and every child RLM; `RunEnv` is what they share (budget
ledger, dispatcher, tracer, clients, settings). What small models get wrong is handled by
`recursa.guards`; `recursa.compaction` keeps the root's history inside its window.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa import context as ctx
from recursa import prompts
from recursa.budget import Budget, Ledger
from recursa.compaction import abridge, fit, msg_tokens, push_history
from recursa.dispatch import Dispatcher, Node, cache_mark
from recursa.guards import RunHidden, hold_ungrounded, plain_digits, prose, repeated
from recursa.parse import (
    code_blocks,
    final_line,
    final_literal,
    format_cell,
    normalize_code,
    plain_answer,
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
    preface: str | None = None    # under the top-level query in its first message (sessions)


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

        messages = _first_messages(env, query, prep.description,
                                   env.preface if depth == 0 else None)
        st.first_user = messages[1]["content"]
        st.seen.append(plain_digits(st.first_user))
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

    async def run_hidden(code: str) -> bool:
        return await _run_hidden(sandbox, ready, code)

    async def push() -> str | None:
        return await push_history(st, run_hidden)

    while True:
        st.limit = env.ledger.limit_reached(subcalls=False) or (
            "max_iterations" if st.turns >= b.max_iterations else None)
        if st.limit:
            return
        turn_ev = env.tracer.emit("turn", phase="start", parent=run_ev, depth=depth,
                                  turn=st.turns + 1)
        try:
            await fit(env, st, messages, 0, turn_ev, depth, push)
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
                        usage=comp.usage.model_dump(), cost_usd=comp.cost_usd, model=comp.model,
                        **cache_mark(comp))
        _append(st, messages, {"role": "assistant", "content": comp.text})
        extra: dict[str, Any] = {}    # the end event's repeat_of, prose_answer, held, feedback
        blocks, nudge, failed = await _act_on_reply(env, st, sandbox, ready, run_hidden, node,
                                                    comp.text, turn_ev, depth, extra)
        feedback = _feedback(env, st, blocks, nudge, failed, query, extra)
        env.tracer.emit("turn", id=turn_ev, phase="end", parent=run_ev, depth=depth,
                        text=comp.text, usage=comp.usage.model_dump(), cost_usd=comp.cost_usd,
                        model=comp.model, latency_s=round(comp.latency_s, 4), blocks=len(blocks),
                        ended=feedback is None, **extra, **cache_mark(comp))
        if st.final is not None:
            return
        if feedback is None:
            st.limit = "max_consecutive_errors"
            return
        _append(st, messages, {"role": "user", "content": feedback})


async def _act_on_reply(env: RunEnv, st: _State, sandbox: Sandbox,
                        ready: Callable[[], Awaitable[None]], run_hidden: RunHidden, node: Node,
                        text: str, turn_ev: str, depth: int,
                        extra: dict[str, Any]) -> tuple[list[str], str | None, bool]:
    """Run the reply's code (unless it is the last code that ran, sent again) or read its prose;
    hold a commit of something never shown. Returns the code blocks, the nudge to send instead
    of the outputs or NO_CODE (None if none), and whether the turn failed."""
    blocks = code_blocks(text)
    bare = None
    if not blocks:     # a `FINAL(...)` line outside any fence runs as code
        bare = final_line(text)
        blocks = [bare] if bare else []
    code = normalize_code(blocks)
    nudge: str | None = None
    failed_turn = True
    if blocks and code == st.last_code and not st.last_called:
        nudge = repeated(st, extra)      # the same code as the last turn that ran
    elif blocks:
        await ready()
        failed_turn = await _run_blocks(env, st, sandbox, node, blocks, bare, code, turn_ev,
                                        depth, extra)
    else:
        nudge = await prose(st, text, extra, run_hidden)
    held = await hold_ungrounded(st, "\n".join(blocks) if blocks else text, bool(blocks), extra,
                                 run_hidden)
    return blocks, held or nudge, failed_turn


def _feedback(env: RunEnv, st: _State, blocks: list[str], nudge: str | None, failed_turn: bool,
              query: str, extra: dict[str, Any]) -> str | None:
    """The next user message, or None when the turns end: the answer is final, or too many
    turns in a row failed."""
    if st.final is not None:
        return None
    st.consecutive_errors = st.consecutive_errors + 1 if failed_turn else 0
    if st.consecutive_errors >= env.budget.max_consecutive_errors:
        return None
    body = nudge if nudge is not None else (st.last_shown if blocks else prompts.NO_CODE)
    feedback = body + "\n\n" + prompts.CONTINUE.format(query=query[:500])
    if nudge is not None:      # not rebuilt from the cells: traced as it was sent
        extra["feedback"] = feedback
    return feedback


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
        st.seen.append(plain_digits(shown))
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
    st.log.append(f"Turn {st.turns} ran:\n{abridge(chr(10).join(blocks), 240)}\n"
                  f"Output: {abridge(st.last_shown, 160)}")
    return st.last_failed


async def _run_hidden(sandbox: Sandbox, ready: Callable[[], Awaitable[None]],
                      code: str) -> bool:
    """Run harness code in the REPL (not a model turn, not traced as a cell); best effort."""
    try:
        await ready()
        cell = await sandbox.run(code, timeout=30.0, max_output_chars=1000)
    except Exception:
        return False
    return cell.error is None


def _append(st: _State, messages: list[Message], msg: Message) -> None:
    messages.append(msg)
    st.full.append(msg)


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
    await fit(env, st, messages, msg_tokens([{"role": "user", "content": msg}]), turn_ev,
              depth, None)
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
                    model=comp.model, latency_s=round(comp.latency_s, 4), **cache_mark(comp))
    text = plain_answer(comp.text)
    st.answer = {"content": draft if (draft and text.strip("`'\". ").upper() == KEEP) else text,
                 "ready": False}


def _last_line(error: str | None) -> str | None:
    if not error:
        return None
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "error"


def _first_messages(env: RunEnv, query: str, description: str,
                    preface: str | None = None) -> list[Message]:
    first_line = description.splitlines()[0] if description else ""
    ctype = first_line.removeprefix("source: ") if first_line.startswith("source:") else first_line
    system = prompts.system_prompt(context_type=ctype.removeprefix("type: "),
                                   max_output_chars=env.max_output_chars,
                                   sub_chars=env.sub_context_chars, tips=env.tips,
                                   tool_names=env.tool_names, template=env.system_template)
    first = prompts.FIRST_USER.format(query=query, description=description)
    if preface:
        first += "\n\n" + preface
    return [{"role": "system", "content": system}, {"role": "user", "content": first}]


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
                  run_id=env.tracer.run_id, cache_hits=env.ledger.cache_hits)
