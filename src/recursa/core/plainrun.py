"""A run without a REPL (the bench's `direct` and `compaction` methods, a rollout's `llm`
variant): model calls through the same Budget, Ledger, Deadline, Dispatcher and trace format as
an RLM run, assembled here once, so its spend, limits and trace match an RLM run's.
"""

from __future__ import annotations

import time
from typing import Any

from recursa.base.types import AnswerSource, Message, ModelClient, Result, Status
from recursa.core.budget import Budget, Ledger
from recursa.core.dispatch import Dispatcher
from recursa.core.recorder import RunRecorder, TurnSpan, result_from, tree_totals
from recursa.obs.trace import JsonlSink, Tracer, new_id


class PlainRun:
    """One run of plain model calls to `client`, traced to `trace_path` (None: not traced).
    A caller that owns the run's `ledger` and `tracer` (RLM's direct route: its deadline, parent
    ledger and sinks) passes them, and closes them itself."""

    def __init__(self, client: ModelClient, query: str, *, budget: Budget | None = None,
                 trace_path: str | None = None, run_id: str | None = None,
                 options: dict[str, Any] | None = None, ledger: Ledger | None = None,
                 tracer: Tracer | None = None, **start: Any):
        """`start`: more fields of the run's start event (`method=...`, `variant=...`)."""
        self.budget = budget or Budget()
        self.owned = tracer is None
        self.ledger = ledger if ledger is not None else Ledger(self.budget)
        self.tracer = tracer if tracer is not None else \
            Tracer([JsonlSink(trace_path)] if trace_path else [], run_id or new_id())
        self.trace_path = trace_path
        self.client = client
        self.options = dict(options or {})
        self.dispatcher = Dispatcher(ledger=self.ledger, tracer=self.tracer, sub_client=client,
                                     clients={}, concurrency=1, max_depth=0)
        self.t0 = time.monotonic()
        self.turns = 0
        self.rec = RunRecorder(self.tracer)
        self.rec.start(query=query, model=client.name, budget=self.budget.model_dump(), **start)

    def turn(self, **data: Any) -> TurnSpan:
        """The next turn's span (for a caller that makes its own calls, e.g. a tool loop)."""
        return self.rec.turn(turn=self.turns + 1, **data)

    async def ask(self, prompt: str | list[Message], *, step: str,
                  max_tokens: int | None = None, force: bool = False) -> str:
        """One model call as one traced turn; its text. `force`: the answer turn at a limit
        (admitted past the budget, in the deadline's reserve)."""
        opts = dict(self.options)
        if max_tokens:
            opts["max_tokens"] = max_tokens
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        turn = self.turn(step=step)
        try:
            comp = await self.dispatcher.call_model(self.client, messages, role="root",
                                                    subcall=False, options=opts, force=force)
        except Exception as e:
            turn.fail(str(e))
            raise
        self.turns += 1
        turn.end(comp, prompt_chars=sum(len(m["content"]) for m in messages))
        return comp.text

    def finish(self, answer: str, status: Status, *, error: str | None = None,
               limit: str | None = None, source: AnswerSource | None = None,
               totals: dict[str, Any] | None = None, **fields: Any) -> Result:
        """The run's Result (and the end of its trace); `totals` for the end event default to
        the ledger's; `fields`: more of the Result's (`parsed`, `route`, ...)."""
        res = result_from(self.ledger, self.tracer, answer=answer, status=status,
                          ready=status == "final", answer_source=source, turns=self.turns,
                          elapsed_s=round(time.monotonic() - self.t0, 4), error=error,
                          limit=limit, trace_path=self.trace_path, **fields)
        self.rec.finish(res, totals=totals if totals is not None else tree_totals(self.ledger,
                                                                                   res))
        if self.owned:
            self.tracer.close()
            self.ledger.deadline.close()
        return res
