"""The RLM loop as a step machine: one root model, one sandboxed REPL, turn after turn until
the answer is ready.

A `Run` is one run's state and rules. `start(context)` and `step(reply)` return what the model
sees next (an `Ask`: the messages of the next root turn, with the cells of the last reply run,
the guards applied and the history compacted) or the run's `Result`. Whoever owns the model
calls drives it: `run_loop` (the library, sessions, the server, bench methods, child RLMs) asks
the model through the run's dispatcher; a verifiers environment gives the policy's replies.
There is no other loop. What small models get wrong is handled by `recursa.core.guards`,
`recursa.core.compaction` keeps the root's history inside its window (both functions of the
run's state, `recursa.core.state`), `recursa.core.recorder` writes the trace.

Time is owned by the ledger's Deadline (recursa.core.deadline): every model call and cell is cut at
the end of the work; the top-level run's last-answer turn runs in the time reserved for it
inside `max_seconds`.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recursa.base.tempdirs import owned_tempdir
from recursa.base.types import (
    BudgetExceeded,
    Cell,
    Completion,
    ContextError,
    Message,
    ModelClient,
    ModelError,
    Result,
    Sandbox,
)
from recursa.core import context as ctx
from recursa.core import prompts, sources
from recursa.core.budget import Budget, Ledger
from recursa.core.compaction import abridge, compact, history_budget, history_code, msg_tokens, over
from recursa.core.dispatch import Dispatcher, Node, wall_limit
from recursa.core.guards import (
    hold_invalid,
    hold_ungrounded,
    hold_unsourced,
    plain_digits,
    prose,
    repeated,
    structured,
    to_structure,
)
from recursa.core.output import OutputInvalid, OutputSpec
from recursa.core.parse import (
    IMAGINED_STOPS,
    answer_text,
    close_fence,
    code_blocks,
    cut_imagined,
    final_line,
    final_literal,
    format_cell,
    normalize_code,
)
from recursa.core.recorder import RunRecorder, TurnSpan, result_from, tree_totals
from recursa.core.search_host import available as search_available
from recursa.core.search_host import with_search
from recursa.core.state import Nudge, RunState
from recursa.core.strategies import strategy_for
from recursa.core.strategy import choose
from recursa.obs.streaming import turn_deltas
from recursa.obs.trace import Tracer

if TYPE_CHECKING:
    from recursa.core.mcp_tools import McpHub
    from recursa.core.tools import ToolSet

KEEP = "KEEP"


MAX_TOKEN_SCALE = 4.0   # the most the root's real tokens may scale the estimate's budget


def priced(client: ModelClient) -> bool:
    """Whether the root model's calls will have a cost (a known or given price, a provider
    that reports it, or free): a live view shows dollars from the start, else "cost ?"."""
    from recursa.models.pricing import status
    return status(client.capabilities.pricing) is not None


@dataclass
class RunEnv:
    """What a top-level run and every child RLM under it share: limits, ledger, tracer,
    clients, settings, and the dispatcher (built here, with this env's `run_child` as its
    child runner)."""

    budget: Budget
    ledger: Ledger
    tracer: Tracer
    root_client: ModelClient
    make_sandbox: Callable[[], Sandbox]
    sub_client: ModelClient | None = None    # None: the root's
    clients: dict[str, ModelClient] = field(default_factory=dict)   # what code may name
    concurrency: int = 32
    sub_options: dict[str, Any] = field(default_factory=dict)
    tools: ToolSet | None = None
    root_sandbox: Sandbox | None = None   # the top-level run's (a session's kept one)
    trace_path: str | None = None         # where the trace goes: the Result says so
    max_output_chars: int = 8192
    root_options: dict[str, Any] = field(default_factory=dict)
    tips: str | None = None
    tool_names: list[str] | None = None
    system_template: str | None = None
    sub_context_chars: int = 100_000
    # the most tokens of history sent to the root model; the root client's `context_window`
    # (or `n_ctx`) bounds it too. None and no window known: the history is never compacted.
    max_history_tokens: int | None = None
    # the top-level run's last-answer turn: its own timeout, besides the deadline's reserve
    last_turn_seconds: float | None = None
    output: OutputSpec | None = None     # the top-level answer's type (recursa.core.output)
    preface: str | None = None    # under the top-level query in its first message (sessions)
    example: bool = True          # the worked example in the system prompt
    strategy: str = "auto"        # code | plan | auto (recursa.core.strategy)
    sources: bool = False         # the root is taught to attach sources (recursa.core.sources)
    route: dict[str, Any] | None = None   # why the top-level run runs the loop (core/route.py)
    mcp: McpHub | None = None     # the run's MCP servers: their tools are REPL functions
    dispatcher: Dispatcher = field(init=False)

    def __post_init__(self) -> None:
        self.dispatcher = Dispatcher(
            ledger=self.ledger, tracer=self.tracer, sub_client=self.sub_client or
            self.root_client, clients=self.clients, concurrency=self.concurrency,
            max_depth=self.budget.max_depth, sub_options=self.sub_options, tools=self.tools,
            child_runner=self.run_child)

    async def run_child(self, node: Node, prompt: str, context: Any) -> str:
        """A child RLM for `rlm_query` (the dispatcher's child runner): its answer, or an
        error string."""
        query = prompt
        if context is None:   # as in the reference library: the prompt is the context
            context = prompt
            query = (prompt if len(prompt) <= 1500 else prompt[:1500] + " ...") + \
                "\n(The full request is the REPL variable `context`.)"
        res = await run_loop(self, query, context, depth=node.depth + 1, parent=node.parent)
        if res.status == "error" and not res.answer:
            return f"Error: child RLM failed: {res.error}"
        return res.answer


@dataclass
class Ask:
    """What the model sees next: the request of one root turn."""

    messages: list[Message]
    turn: TurnSpan
    feedback: str | None = None    # the newest user message (None: the first turn's)
    last: bool = False             # the last-answer turn: no code runs on its reply
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None   # the last-answer turn's own timeout


Step = Ask | Result


async def run_loop(env: RunEnv, query: str, context: Any, *, depth: int = 0,
                   parent: str | None = None) -> Result:
    """One RLM run (the top-level one, or a child at `depth` under the cell `parent`): ask
    the model, give the run its reply, until the run has its Result."""
    run = Run(env, query, depth, parent)
    step = await run.start(context)
    while isinstance(step, Ask):
        step = await run.step(await run.call(step))
    return step


class Run:
    """One run as a step machine: its state, sandbox, messages and trace span."""

    def __init__(self, env: RunEnv, query: str, depth: int = 0, parent: str | None = None):
        self.env, self.query, self.depth = env, query, depth
        self.role = "root" if depth == 0 else "child"
        self.output = env.output if depth == 0 else None
        self.rec = RunRecorder(env.tracer, depth=depth, parent=parent)
        self.st = RunState()
        self.t0 = time.monotonic()
        self.workdir: Path | None = None
        self.description = ""
        self.sandbox: Sandbox | None = None
        self.starting: asyncio.Task[None] | None = None
        self.announced = False
        self.node = Node(depth=depth, parent="", role="sub")
        self.calls: set[asyncio.Task[Any]] = set()   # the REPL's calls being served
        self.asked: Ask | None = None                # the Ask the next step answers
        self.result: Result | None = None
        self.context: Any = None     # what the run was given: its answer's sources are checked

    @property
    def messages(self) -> list[Message]:
        """What the root is sent (the state's; compacted in place)."""
        return self.st.messages

    # ------------------------------------------------------------ the steps
    async def start(self, context: Any) -> Step:
        """Load the context, start the sandbox, write the first messages (and, in plan mode,
        run the plan): the first Ask."""
        self.context = context
        routed = {"route": self.env.route} if self.depth == 0 and self.env.route else {}
        self.rec.start(query=self.query, model=self.env.root_client.name,
                       budget=self.env.budget.model_dump(),
                       priced=priced(self.env.root_client), **routed)
        return await self._guarded(self._begin(context))

    async def step(self, reply: Completion | BaseException) -> Step:
        """The model's reply to the last Ask (or the error its call ended with) in; what the
        model sees next out, or the Result."""
        ask, self.asked = self.asked, None
        if ask is None:
            raise RuntimeError("step() answers the Ask that start() or step() returned")
        if ask.last:
            self._take_last(ask, reply)
            return await self.close()
        return await self._guarded(self._turn(ask, reply))

    async def call(self, ask: Ask) -> Completion | BaseException:
        """Ask the root model through the run's dispatcher (streamed to the trace when it is
        watched); a limit or a model error comes back as the reply."""
        env = self.env
        deltas = turn_deltas(env.tracer, ask.turn.id, ask.turn.run.id, self.depth)
        try:
            try:
                async with asyncio.timeout(ask.timeout):
                    return await env.dispatcher.call_model(
                        env.root_client, ask.messages, role=self.role, subcall=False,
                        options=ask.options, force=ask.last and self.depth == 0,
                        on_delta=deltas)
            finally:   # what is pending goes out before the turn's update or end
                if deltas is not None:
                    deltas.flush()
        except (BudgetExceeded, ModelError, TimeoutError) as e:
            return e
        except asyncio.CancelledError:   # a child whose parent's cell was cut
            ask.turn.fail("cancelled")
            await self._cancelled()
            raise

    async def close(self) -> Result:
        """Stop the sandbox and the REPL's calls, end the trace span: the Result (once)."""
        if self.result is not None:
            return self.result
        try:
            if self.starting is not None:   # never leave the start running or its error
                self.starting.cancel()      # unretrieved
                await asyncio.gather(self.starting, return_exceptions=True)
            if self.sandbox is not None:
                await self.sandbox.close()
            await self._stop_calls()
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
            if self.depth == 0:     # the answer's sources, looked up in the context
                self.st.sources = await sources.acheck(self.st.answer, self.st.final,
                                                       self.context)
        finally:   # even when cancelled again: the trace gets this run's final and end
            res = self.result = self._result()
            # tree totals only on the top-level run: a child's own are its subtree's sums
            self.rec.finish(res, totals=tree_totals(self.env.ledger, res) if self.depth == 0
                            else None)
        return res

    # ------------------------------------------------------------ inside a step
    async def _guarded(self, phase: Coroutine[Any, Any, Step]) -> Step:
        """Run a step's work; whatever ends the run there still yields its Result (a bad
        context of the top-level run is raised, after the run closed)."""
        st = self.st
        try:
            return await phase
        except ContextError as e:
            st.error = e
            if self.depth == 0:
                await self.close()
                raise
        except BudgetExceeded as e:
            st.limit = e.limit
        except asyncio.CancelledError:   # the cell that opened this child was cut
            await self._cancelled()
            raise
        except Exception as e:   # an unexpected failure still yields a Result with the spend
            st.error = e
        return await self.close()

    async def _cancelled(self) -> None:
        st = self.st
        st.limit = st.limit or self.env.ledger.limit_reached(subcalls=False)
        if not st.limit:
            st.error = st.error or "cancelled"
        await self.close()

    async def _begin(self, context: Any) -> Step:
        await self._open(context)
        if self.depth == 0:
            mode, why = choose(self.env.strategy, self.env.root_client.name,
                               code_tools=bool(self.env.mcp is not None and self.env.mcp.tools))
            self.rec.note(strategy=mode, strategy_reason=why)
            # a plan runs first in plan mode; when the root answers from its results, that is all
            if await strategy_for(mode).begin(self):
                return await self.close()
        return await self._next(None)

    async def _next(self, feedback: str | None) -> Step:
        """The next turn's Ask (the history compacted to fit first), or the wrap-up at a
        limit."""
        if self._at_limit():
            return await self._wrap_up()
        turn = self.rec.turn(turn=self.st.turns + 1)
        try:
            await self._fit(0, turn, push=True)
        except asyncio.CancelledError:
            turn.fail("cancelled")
            raise
        options = self.env.root_options
        if "stop" not in options and self.env.root_client.capabilities.stop:
            options = {**options, "stop": list(IMAGINED_STOPS)}   # no made-up REPL output
        self.asked = Ask(list(self.st.messages), turn, feedback=feedback, options=options)
        return self.asked

    async def _turn(self, ask: Ask, reply: Completion | BaseException) -> Step:
        """One turn: the reply's code runs (or its prose is read), the guards decide, and the
        feedback becomes the next Ask; the answer or a limit ends the turns."""
        st, turn = self.st, ask.turn
        if isinstance(reply, BaseException):
            self._failed(turn, reply)
            return await self._wrap_up()
        st.turns += 1
        turn.replied(reply)
        sent, real = msg_tokens(ask.messages), reply.usage.input_tokens
        if sent and real:   # capped: a driver whose usage counts more than this run sent
            st.token_scale = min(MAX_TOKEN_SCALE, max(1.0, real / sent))
        extra: dict[str, Any] = {}    # the end event's repeat_of, prose_answer, held, ...
        text = reply.text
        if ask.options.get("stop") == list(IMAGINED_STOPS):
            text = close_fence(text)
        cut = cut_imagined(text)      # only the code before a made-up "Output:" runs
        if cut is not None:
            extra["imagined_output"] = len(text) - len(cut)
            text = cut
        st.append({"role": "assistant", "content": text})
        try:
            blocks, nudge, failed = await self._act(text, turn, extra)
        except BaseException as e:      # the span ends whatever cut the turn short
            turn.end(reply, error="cancelled" if isinstance(e, asyncio.CancelledError)
                     else f"{type(e).__name__}: {e}", **extra)
            raise
        feedback = self._feedback(blocks, nudge, failed, extra)
        turn.end(reply, blocks=len(blocks), ended=feedback is None, **extra)
        if feedback is None:
            if st.final is None:
                st.limit = "max_consecutive_errors"
            return await self._wrap_up()
        st.append({"role": "user", "content": feedback})
        return await self._next(feedback)

    def _failed(self, turn: TurnSpan, e: BaseException) -> None:
        """The turn's model call ended in a limit or a model error."""
        if isinstance(e, BudgetExceeded):
            self.st.limit = e.limit
        else:
            self.st.error = e if isinstance(e, Exception) else str(e)
        turn.fail(str(e))

    async def _wrap_up(self) -> Step:
        """The turns are over: the REPL's calls stop; without a final answer (and unless the
        model itself failed) one last no-code turn asks for it."""
        await self._stop_calls()
        if self.st.final is None and not isinstance(self.st.error, ModelError):
            return await self._last_ask()
        return await self.close()

    def _at_limit(self) -> bool:
        st = self.st
        st.limit = self.env.ledger.limit_reached(subcalls=False) or (
            "max_iterations" if st.turns >= self.env.budget.max_iterations else None)
        return st.limit is not None

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
            nudge = await self._apply(prose(st, text, extra))
        source = "\n".join(blocks) if blocks else text
        held = hold_ungrounded(st, source, bool(blocks), extra)
        if held is None and self.output is not None:
            plain = to_structure(st, self.output)
            filled = await self._structure(plain) if plain is not None else None
            if filled is not None:
                structured(st, filled, extra)
            else:
                held = hold_invalid(st, self.output, bool(blocks), extra)
        if held is None and self.env.sources and self.depth == 0:
            held = hold_unsourced(st, bool(blocks), extra)
        return blocks, (await self._apply(held) if held is not None else None) or nudge, failed

    async def _apply(self, nudge: Nudge) -> str | None:
        """A guard's decision: its code runs in the REPL, its text is the nudge."""
        if nudge.repl is not None:
            await self._run_hidden(nudge.repl)
        return nudge.text

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
                cell = await self.run_cell(block)
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
        shown = "\n\n".join(outputs)
        # a rerun of code that called a model and printed the same again: a third is not run
        same = code == st.last_code and shown == st.last_shown
        st.last_code, st.last_turn = code, st.turns
        st.last_shown = shown
        st.last_failed = failed == len(blocks)
        st.last_called = st.model_calls > calls0 and not same
        st.log.append(f"Turn {st.turns} ran:\n{abridge(chr(10).join(blocks), 240)}\n"
                      f"Output: {abridge(st.last_shown, 160)}")
        return st.last_failed

    async def run_cell(self, code: str) -> Cell:
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
    async def _last_ask(self) -> Step:
        """At a limit: one no-code turn asks for the answer. The top-level run's is admitted
        past the budget, in the time its deadline reserved for it (and within
        `last_turn_seconds` when set)."""
        env, st = self.env, self.st
        draft = str(st.answer.get("content") or "")
        msg = prompts.LAST_TURN.format(limit=st.limit or "error", query=self.query[:500])
        if draft:
            msg += (f'\n\nYour answer["content"] so far ({len(draft):,} chars) begins: '
                    f"{draft[:500]!r}\nReply with exactly {KEEP} to keep it as the final answer.")
        if self.output is not None:
            msg += prompts.LAST_TURN_OUTPUT
        # the request joins the last feedback message, so user and assistant turns alternate
        merged = st.messages[-1]["role"] == "user"
        turn = self.rec.turn(last=True, prompt=msg, merged=merged)
        await self._fit(msg_tokens([{"role": "user", "content": msg}]), turn, push=False)
        if merged:
            call = [*st.messages[:-1], {"role": "user", "content":
                                        st.messages[-1]["content"] + "\n\n" + msg}]
        else:
            call = [*st.messages, {"role": "user", "content": msg}]
        seconds = env.last_turn_seconds if self.depth == 0 else None
        options = dict(env.root_options)
        if seconds is not None:
            options["timeout"] = min(seconds, options.get("timeout") or seconds)
        self.asked = Ask(call, turn, feedback=call[-1]["content"], last=True, options=options,
                         timeout=seconds)
        return self.asked

    def _take_last(self, ask: Ask, reply: Completion | BaseException) -> None:
        """The last-answer turn's reply: its answer becomes the draft (KEEP keeps the one
        there); a failure leaves the draft as it is."""
        st, turn = self.st, ask.turn
        if isinstance(reply, BaseException):
            why = f"no reply within the last-answer turn's {ask.timeout:g} s" if \
                isinstance(reply, TimeoutError) and ask.timeout is not None else str(reply)
            turn.fail(why)
            if st.error is None and st.limit is None:
                st.error = why if isinstance(reply, TimeoutError) or \
                    not isinstance(reply, Exception) else reply
            return
        turn.end(reply, last=True)
        draft = str(st.answer.get("content") or "")
        if draft and reply.text.strip("`'\". ").upper() == KEEP:
            return
        text = answer_text(reply.text)
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
        self.sandbox = env.root_sandbox if self.depth == 0 and env.root_sandbox is not None \
            else env.make_sandbox()
        self.node.parent = self.rec.id
        payload = prep.payload
        base_handler = with_search(env.dispatcher.handler(self.node), payload)
        if env.mcp is not None and env.mcp.tools:     # typed functions the host answers
            payload = payload.model_copy(update={"functions": env.mcp.functions()})
            base_handler = env.mcp.serve(base_handler, self.node)

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
        self.starting = asyncio.create_task(self.sandbox.start(payload, handler))
        # Let the start get its process going before this task's first model call, whose first
        # use of the HTTP stack imports it (~0.1 s): a local sandbox then boots on another core
        # meanwhile instead of after the request (benchmarks/bench_startup.py).
        await asyncio.sleep(0)
        st.messages = first_messages(
            self.query, prep.description, max_output_chars=env.max_output_chars,
            sub_context_chars=env.sub_context_chars, tips=env.tips, tool_names=env.tool_names,
            system_template=env.system_template, example=env.example, output=self.output,
            preface=env.preface if self.depth == 0 else None,
            sources=env.sources and self.depth == 0,
            repl_tools=env.mcp.prompt_lines() if env.mcp is not None else None)
        st.first_user = st.messages[1]["content"]
        st.seen.append(plain_digits(st.first_user))
        st.full = list(st.messages)
        self.rec.note(system=st.messages[0]["content"], first_user=st.first_user)

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

    async def _fit(self, extra_tokens: int, turn: TurnSpan, *, push: bool) -> None:
        """Compact the history when it (plus `extra_tokens` still to come) would not fit the
        root's window: the whole conversation goes in the REPL first (`push`), compaction
        decides the replacement, the turn's trace notes it exactly (design note 11)."""
        st = self.st
        budget = history_budget(self.env)
        if budget is not None:      # in the estimate's units, scaled by the model's real count
            budget = int(budget / st.token_scale)
        if budget is None or not over(budget, st.messages, extra_tokens):
            return
        var = st.history_var
        if push:
            name, code = history_code(st)
            var = name if await self._run_hidden(code) else None
            st.history_var = var or st.history_var
        c = compact(st, st.messages, budget, extra_tokens, var)
        st.messages[c.start:c.end] = c.new
        turn.note(compaction={**c.note, "token_scale": round(st.token_scale, 3)})

    async def _stop_calls(self) -> None:
        """Cancel the REPL's calls still running (the sub-calls and children of a cell cut at
        the time limit) and let them end, so that their spans close before this run's."""
        pending = [t for t in self.calls if not t.done() and t is not asyncio.current_task()]
        for t in pending:
            if not t.cancelling():     # a second cancel would cut a child's own clean-up
                t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)

    def _result(self) -> Result:
        st = self.st
        if st.final is not None:
            # an answer from work a limit cut short is not a confirmed one: status limit
            status = "limit" if st.partial and st.limit else "final"
            answer, source = st.final, "final"
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
                           trace_path=self.env.trace_path, sources=st.sources,
                           partial=st.partial,
                           sources_verified=sources.verdict(st.sources))


def first_messages(query: str, description: str, *, max_output_chars: int = 8192,
                   sub_context_chars: int = 100_000, tips: str | None = None,
                   tool_names: list[str] | None = None, system_template: str | None = None,
                   example: bool = True, output: OutputSpec | None = None,
                   preface: str | None = None, sources: bool = False,
                   repl_tools: list[str] | None = None) -> list[Message]:
    """A run's system and first user message (a verifiers dataset's prompt is built here too,
    so the policy sees what the step machine records). `sources`: the rule and worked example
    that ask for the answer's sources (recursa.core.sources)."""
    first_line = description.splitlines()[0] if description else ""
    ctype = first_line.removeprefix("source: ") if first_line.startswith("source:") else first_line
    system = prompts.system_prompt(context_type=ctype.removeprefix("type: "),
                                   max_output_chars=max_output_chars,
                                   sub_chars=sub_context_chars, tips=tips,
                                   tool_names=tool_names, template=system_template,
                                   example=example, search=search_available(),
                                   sources=sources, repl_tools=repl_tools)
    first = prompts.FIRST_USER.format(query=query, description=description)
    if preface:
        first += "\n\n" + preface
    if output is not None:
        first += "\n\n" + output.prompt()
    return [{"role": "system", "content": system}, {"role": "user", "content": first}]
