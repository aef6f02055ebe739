"""The RLM loop: one root model, one sandboxed REPL, turn after turn until the answer is ready.

`run_loop` serves the top-level run and every child RLM; `RunEnv` is what they share (budget
ledger, dispatcher, tracer, clients, settings) and `_Run` one run's own state. What small models
get wrong is handled by `recursa.guards`; `recursa.compaction` keeps the root's history inside
its window; `recursa.recorder` writes the trace.

Time: every model call and cell is cut at the run's `max_seconds` (`dispatch.wall_limit`); the
top-level run then gets one last-answer turn under its own short timeout.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recursa import context as ctx
from recursa import planner, prompts, sources
from recursa.budget import Budget, Ledger
from recursa.compaction import abridge, fit, msg_tokens, push_history
from recursa.dispatch import Dispatcher, Node, wall_limit
from recursa.guards import (
    hold_invalid,
    hold_ungrounded,
    hold_unsourced,
    plain_digits,
    prose,
    repeated,
)
from recursa.output import OutputInvalid, OutputSpec
from recursa.parse import (
    answer_text,
    code_blocks,
    cut_imagined,
    final_line,
    final_literal,
    format_cell,
    normalize_code,
)
from recursa.recorder import RunRecorder, TurnSpan, result_from, tree_totals
from recursa.search_host import available as search_available
from recursa.search_host import with_search
from recursa.streaming import turn_deltas
from recursa.tempdirs import owned_tempdir
from recursa.trace import Tracer
from recursa.types import (
    BudgetExceeded,
    Cell,
    Completion,
    ContextError,
    Message,
    ModelClient,
    ModelError,
    Result,
    Sandbox,
    Source,
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
    # the top-level run's last-answer turn at a limit: its own timeout (None: see
    # last_turn_seconds), so a time limit is overshot by that turn at most
    last_turn_seconds: float | None = None
    output: OutputSpec | None = None     # the top-level answer's type (recursa.output)
    preface: str | None = None    # under the top-level query in its first message (sessions)
    example: bool = True          # the worked example in the system prompt
    strategy: str = "code"        # code | plan | auto (recursa.planner)
    sources: bool = False         # teach the root to attach sources (recursa.sources)


def last_turn_seconds(env: RunEnv) -> float | None:
    """The last-answer turn's timeout: as set, else a quarter of max_seconds within 5-60 s;
    no time limit, no timeout of its own (the client's applies)."""
    if env.last_turn_seconds is not None:
        return env.last_turn_seconds
    limit = env.budget.max_seconds
    return None if limit is None else max(5.0, min(60.0, limit / 4))


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
    extracted: bool = False       # answer["content"] came from the last-answer turn's reply
    sources_asked: bool = False   # a commit without sources was held once (RLM(sources=True))


async def run_loop(env: RunEnv, query: str, context: Any, *, depth: int = 0,
                   parent: str | None = None) -> Result:
    """One RLM run (the top-level one, or a child at `depth` under the cell `parent`)."""
    return await _Run(env, query, depth, parent).run(context)


async def run_child(env: RunEnv, node: Node, prompt: str, context: Any) -> str:
    """A child RLM for `rlm_query` (a Dispatcher's child runner): its answer, or an error
    string."""
    query = prompt
    if context is None:   # as in the reference library: the prompt is the context
        context = prompt
        query = (prompt if len(prompt) <= 1500 else prompt[:1500] + " ...") + \
            "\n(The full request is the REPL variable `context`.)"
    res = await run_loop(env, query, context, depth=node.depth + 1, parent=node.parent)
    if res.status == "error" and not res.answer:
        return f"Error: child RLM failed: {res.error}"
    return res.answer


class _Run:
    """One run: its state, sandbox, messages and trace span."""

    def __init__(self, env: RunEnv, query: str, depth: int, parent: str | None):
        self.env, self.query, self.depth = env, query, depth
        self.role = "root" if depth == 0 else "child"
        self.output = env.output if depth == 0 else None
        self.rec = RunRecorder(env.tracer, depth=depth, parent=parent)
        self.st = _State()
        self.t0 = time.monotonic()
        self.messages: list[Message] = []
        self.workdir: Path | None = None
        self.description = ""
        self.sandbox: Sandbox | None = None
        self.starting: asyncio.Task[None] | None = None
        self.announced = False
        self.node = Node(depth=depth, parent="", role="sub")
        self.calls: set[asyncio.Task[Any]] = set()   # the REPL's calls being served
        self.context: Any = None
        self.sources: list[Source] = []       # the answer's, checked (top level only)

    async def run(self, context: Any) -> Result:
        st = self.st
        self.context = context
        self.rec.start(query=self.query, model=self.env.root_client.name,
                       budget=self.env.budget.model_dump())
        try:
            await self._open(context)
            if self.depth == 0 and planner.choose(self.env) == "plan":
                await planner.run_plan(self, self.description)   # a typed plan runs first
            await self._turns()
            await self._stop_calls()
            if st.final is None and not isinstance(st.error, ModelError):
                await self._last_turn()
        except ContextError as e:
            st.error = e
            if self.depth == 0:
                raise
        except BudgetExceeded as e:
            st.limit = e.limit
        except asyncio.CancelledError:   # the cell that opened this child was cut
            st.limit = st.limit or self.env.ledger.limit_reached(subcalls=False)
            if not st.limit:
                st.error = st.error or "cancelled"
            raise
        except Exception as e:   # an unexpected failure still yields a Result with the spend
            st.error = e
        finally:
            res = await self._close()
        return res

    async def _turns(self) -> None:
        """Model writes code, sandbox runs it, output goes back; until final or a limit."""
        st = self.st
        while not self._at_limit():
            turn = self.rec.turn(turn=st.turns + 1)
            comp = await self._call_root(turn)
            if comp is None:
                return
            st.turns += 1
            turn.replied(comp)
            extra: dict[str, Any] = {}    # the end event's repeat_of, prose_answer, held, ...
            text = comp.text
            cut = cut_imagined(text)      # only the code before a made-up "Output:" runs
            if cut is not None:
                extra["imagined_output"] = len(text) - len(cut)
                text = cut
            self._append({"role": "assistant", "content": text})
            try:
                blocks, nudge, failed = await self._act(text, turn, extra)
            except BaseException as e:      # the span ends whatever cut the turn short
                turn.end(comp, error="cancelled" if isinstance(e, asyncio.CancelledError)
                         else f"{type(e).__name__}: {e}", **extra)
                raise
            feedback = self._feedback(blocks, nudge, failed, extra)
            turn.end(comp, blocks=len(blocks), ended=feedback is None, **extra)
            if st.final is not None:
                return
            if feedback is None:
                st.limit = "max_consecutive_errors"
                return
            self._append({"role": "user", "content": feedback})

    # ------------------------------------------------------------ one turn
    def _at_limit(self) -> bool:
        st = self.st
        st.limit = self.env.ledger.limit_reached(subcalls=False) or (
            "max_iterations" if st.turns >= self.env.budget.max_iterations else None)
        return st.limit is not None

    async def _call_root(self, turn: TurnSpan) -> Completion | None:
        """The turn's model call (after compacting the history if it must); None when a limit
        or a model error ends the turns."""
        env = self.env
        deltas = turn_deltas(env.tracer, turn.id, turn.run.id, self.depth)
        try:
            await fit(env, self.st, self.messages, 0, turn, self._push_history)
            try:
                return await env.dispatcher.call_model(env.root_client, self.messages,
                                                       role=self.role, subcall=False,
                                                       options=env.root_options,
                                                       on_delta=deltas)
            finally:   # what is pending goes out before the turn's update or end
                if deltas is not None:
                    deltas.flush()
        except BudgetExceeded as e:
            self.st.limit = e.limit
            turn.fail(str(e))
        except ModelError as e:
            self.st.error = e
            turn.fail(str(e))
        except asyncio.CancelledError:   # a child whose parent's cell was cut
            turn.fail("cancelled")
            raise
        return None

    async def _act(self, text: str, turn: TurnSpan,
                   extra: dict[str, Any]) -> tuple[list[str], str | None, bool]:
        """Run the reply's code (unless it is the last code that ran, sent again) or read its
        prose; hold a commit of something never shown, or one that does not match the output
        schema. Returns the code blocks, the nudge to send instead of the outputs or NO_CODE
        (None if none), and whether the turn failed."""
        st = self.st
        blocks = code_blocks(text)
        bare = None
        if not blocks:     # a `FINAL(...)` line outside any fence runs as code
            bare = final_line(text)
            blocks = [bare] if bare else []
        code = normalize_code(blocks)
        nudge: str | None = None
        failed = True
        if blocks and code == st.last_code and not st.last_called:
            nudge = repeated(st, extra)      # the same code as the last turn that ran
        elif blocks:
            failed = await self._run_blocks(blocks, bare, code, turn, extra)
        else:
            nudge = await prose(st, text, extra, self._run_hidden)
        source = "\n".join(blocks) if blocks else text
        held = await hold_ungrounded(st, source, bool(blocks), extra, self._run_hidden)
        if held is None and self.output is not None:
            held = await hold_invalid(st, self.output, bool(blocks), extra, self._run_hidden,
                                      self._structure)
        if held is None and self.env.sources and self.depth == 0:
            held = await hold_unsourced(st, bool(blocks), extra, self._run_hidden)
        return blocks, held or nudge, failed

    async def _structure(self, text: str) -> str | None:
        """The output schema filled from a plain-text answer by one sub-call (see
        `OutputSpec.structuring_request`); None if that fails or does not validate."""
        assert self.output is not None
        client = self.env.dispatcher.sub_client
        messages, options = self.output.structuring_request(text, client.name)
        try:
            comp = await self.env.dispatcher.call_model(client, messages, role="sub",
                                                        subcall=True, options=options)
            self.output.parse(comp.text)
        except (ModelError, BudgetExceeded, OutputInvalid):
            return None
        return comp.text.strip()

    def _feedback(self, blocks: list[str], nudge: str | None, failed_turn: bool,
                  extra: dict[str, Any]) -> str | None:
        """The next user message, or None when the turns end: the answer is final, or too many
        turns in a row failed."""
        st = self.st
        if st.final is not None:
            return None
        st.consecutive_errors = st.consecutive_errors + 1 if failed_turn else 0
        if st.consecutive_errors >= self.env.budget.max_consecutive_errors:
            return None
        body = nudge if nudge is not None else (st.last_shown if blocks else prompts.NO_CODE)
        feedback = body + "\n\n" + prompts.CONTINUE.format(query=self.query[:500])
        if nudge is not None:      # not rebuilt from the cells: traced as it was sent
            extra["feedback"] = feedback
        return feedback

    async def _run_blocks(self, blocks: list[str], bare: str | None, code: str,
                          turn: TurnSpan, extra: dict[str, Any]) -> bool:
        """Run a turn's blocks in order until one commits; True when every block failed."""
        st = self.st
        outputs: list[str] = []
        failed = 0
        calls0 = st.model_calls
        for i, block in enumerate(blocks):
            cell_id = turn.cell(i, block)
            self.node.parent = cell_id    # sub-calls and children hang under the cell
            try:
                cell = await self._run_cell(block)
            except asyncio.CancelledError:
                turn.cell_end(cell_id, Cell(error="cancelled"), "")
                raise
            shown = format_cell(cell, self.env.max_output_chars // len(blocks))
            failed += cell.error is not None
            st.answer = cell.answer
            st.variables = list(cell.variables)
            st.cells_run += 1
            turn.cell_end(cell_id, cell, shown)
            outputs.append(shown if len(blocks) == 1 else f"[block {i + 1}]\n{shown}")
            st.seen.append(plain_digits(shown))
            if cell.final is not None:
                st.final = cell.final
                break
            if st.limit == "max_seconds":
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

    async def _run_cell(self, code: str) -> Cell:
        """One cell, cut at the run's time limit (its REPL state is then lost: the worker is
        stopped and restarts if another cell runs)."""
        env = self.env
        remaining = env.ledger.remaining_seconds()
        timeout = env.budget.cell_timeout if remaining is None else \
            max(1.0, min(env.budget.cell_timeout, remaining))
        try:
            async with wall_limit(env.ledger, "a cell"):
                await self._ready()
                assert self.sandbox is not None
                return await self.sandbox.run(code, timeout=timeout,
                                              max_output_chars=env.max_output_chars)
        except BudgetExceeded as e:
            self.st.limit = e.limit
            return Cell(error=f"{e}: the cell was stopped", timed_out=True,
                        answer=self.st.answer, variables=self.st.variables)

    # ------------------------------------------------------------ the answer at a limit
    async def _last_turn(self) -> None:
        """At a limit: one no-code turn asks for the answer; the top-level run's is admitted
        past the budget, under its own short timeout."""
        env, st = self.env, self.st
        draft = str(st.answer.get("content") or "")
        msg = prompts.LAST_TURN.format(limit=st.limit or "error", query=self.query[:500])
        if draft:
            msg += (f'\n\nYour answer["content"] so far ({len(draft):,} chars) begins: '
                    f"{draft[:500]!r}\nReply with exactly {KEEP} to keep it as the final answer.")
        if self.output is not None:
            msg += prompts.LAST_TURN_OUTPUT
        # the request joins the last feedback message, so user and assistant turns alternate
        merged = self.messages[-1]["role"] == "user"
        turn = self.rec.turn(last=True, prompt=msg, merged=merged)
        await fit(env, st, self.messages, msg_tokens([{"role": "user", "content": msg}]), turn,
                  None)
        if merged:
            call = [*self.messages[:-1], {"role": "user", "content":
                                          self.messages[-1]["content"] + "\n\n" + msg}]
        else:
            call = [*self.messages, {"role": "user", "content": msg}]
        force = self.depth == 0            # only the top run may pass a limit
        seconds = last_turn_seconds(env) if force else None
        options = dict(env.root_options)
        if seconds is not None:
            options["timeout"] = min(seconds, options.get("timeout") or seconds)
        deltas = turn_deltas(env.tracer, turn.id, turn.run.id, self.depth)
        try:
            async with asyncio.timeout(seconds):
                comp = await env.dispatcher.call_model(env.root_client, call, role=self.role,
                                                       subcall=False, options=options,
                                                       force=force, on_delta=deltas)
        except (ModelError, BudgetExceeded, TimeoutError) as e:
            if deltas is not None:
                deltas.flush()
            why = str(e) if not isinstance(e, TimeoutError) else \
                f"no reply within the last-answer turn's {seconds:g} s"
            turn.fail(why)
            if st.error is None and st.limit is None:
                st.error = e if not isinstance(e, TimeoutError) else why
            return
        if deltas is not None:
            deltas.flush()
        turn.end(comp, last=True)
        if draft and comp.text.strip("`'\". ").upper() == KEEP:
            return
        text = answer_text(comp.text)
        if text:
            st.answer, st.extracted = {"content": text, "ready": False}, True

    # ------------------------------------------------------------ setup, REPL, result
    async def _open(self, context: Any) -> None:
        """Load the context, start the sandbox (in the background), write the first messages."""
        env, st = self.env, self.st
        self.workdir = Path(owned_tempdir("recursa-ctx-"))
        prep = ctx.prepare(context, self.workdir)
        self.description = prep.description
        self.rec.note(context_sha256=prep.payload.sha256, context_bytes=prep.payload.size_bytes,
                      context_chars=prep.chars, description=prep.description)
        self.sandbox = env.make_sandbox()
        self.node.parent = self.rec.id
        base_handler = with_search(env.dispatcher.handler(self.node), prep.payload)

        async def handler(kind: str, args: dict[str, Any]) -> Any:
            st.model_calls += 1
            task = asyncio.current_task()
            if task is not None:
                self.calls.add(task)
            try:
                return await base_handler(kind, args)
            finally:
                self.calls.discard(task)   # type: ignore[arg-type]
        # The worker starts while the root model writes its first reply: with a real model the
        # sandbox's start-up (a process, bubblewrap, the context load) costs no wall time.
        self.starting = asyncio.create_task(self.sandbox.start(prep.payload, handler))
        # Let the start get its process going before this task's first model call, whose first
        # use of the HTTP stack imports it (~0.1 s): a local sandbox then boots on another core
        # meanwhile instead of after the request (benchmarks/bench_startup.py).
        await asyncio.sleep(0)
        self.messages = _first_messages(env, self.query, prep.description, self.output,
                                        env.preface if self.depth == 0 else None)
        st.first_user = self.messages[1]["content"]
        st.seen.append(plain_digits(st.first_user))
        st.full = list(self.messages)
        self.rec.note(system=self.messages[0]["content"], first_user=st.first_user)

    async def _ready(self) -> None:
        assert self.starting is not None and self.sandbox is not None
        await self.starting         # a failed start raises here, at the first cell
        if not self.announced:
            self.announced = True
            self.rec.note(sandbox=self.sandbox.isolation)

    async def _run_hidden(self, code: str) -> bool:
        """Run harness code in the REPL (not a model turn, not traced as a cell); best effort,
        and never past the time limit."""
        try:
            async with wall_limit(self.env.ledger, "harness code"):
                await self._ready()
                assert self.sandbox is not None
                cell = await self.sandbox.run(code, timeout=30.0, max_output_chars=1000)
        except Exception:
            return False
        return cell.error is None

    async def _push_history(self) -> str | None:
        return await push_history(self.st, self._run_hidden)

    def _append(self, msg: Message) -> None:
        self.messages.append(msg)
        self.st.full.append(msg)

    async def _stop_calls(self) -> None:
        """Cancel the REPL's calls still running (the sub-calls and children of a cell cut at
        the time limit) and let them end, so that their spans close before this run's."""
        pending = [t for t in self.calls if not t.done() and t is not asyncio.current_task()]
        for t in pending:
            if not t.cancelling():     # a second cancel would cut a child's own clean-up
                t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)

    async def _close(self) -> Result:
        try:
            if self.starting is not None:   # never leave the start running or its error
                self.starting.cancel()      # unretrieved
                await asyncio.gather(self.starting, return_exceptions=True)
            if self.sandbox is not None:
                await self.sandbox.close()
            await self._stop_calls()
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
            if self.depth == 0:
                self.sources = await sources.acheck(self.st.answer, self.st.final, self.context)
        finally:   # even when cancelled again: the trace gets this run's final and end
            res = self._result()
            # tree totals only on the top-level run: a child's own are its subtree's sums
            self.rec.finish(res, totals=tree_totals(self.env.ledger, res) if self.depth == 0
                            else None)
        return res

    def _result(self) -> Result:
        st = self.st
        if st.final is not None:
            status, answer, source = "final", st.final, "final"
        else:
            answer = str(st.answer.get("content") or "")
            source = "extraction_turn" if st.extracted and answer else \
                "answer_variable" if answer else "none"
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
            error = f"stopped after {self.env.budget.max_consecutive_errors} consecutive " \
                    f"failed turns"
        parsed, output_error = None, None
        if self.output is not None:
            try:
                parsed = self.output.parse(answer) if answer else None
                output_error = None if answer else "no answer to validate"
            except OutputInvalid as e:
                output_error = f"the answer does not match the output schema: {e}"
        return result_from(self.env.ledger, self.env.tracer, answer=answer, status=status,
                           ready=status == "final", answer_source=source, turns=st.turns,
                           elapsed_s=round(time.monotonic() - self.t0, 4), error=error,
                           limit=st.limit, parsed=parsed, output_error=output_error,
                           sources=self.sources, sources_verified=sources.verdict(self.sources))


def _first_messages(env: RunEnv, query: str, description: str,
                    output: OutputSpec | None, preface: str | None = None) -> list[Message]:
    first_line = description.splitlines()[0] if description else ""
    ctype = first_line.removeprefix("source: ") if first_line.startswith("source:") else first_line
    system = prompts.system_prompt(context_type=ctype.removeprefix("type: "),
                                   max_output_chars=env.max_output_chars,
                                   sub_chars=env.sub_context_chars, tips=env.tips,
                                   tool_names=env.tool_names, template=env.system_template,
                                   example=env.example, search=search_available(),
                                   sources=env.sources)
    first = prompts.FIRST_USER.format(query=query, description=description)
    if preface:
        first += "\n\n" + preface
    if output is not None:
        first += "\n\n" + output.prompt()
    return [{"role": "system", "content": system}, {"role": "user", "content": first}]
