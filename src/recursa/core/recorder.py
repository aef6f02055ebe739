"""The run / turn / cell / final part of the trace contract (docs/trace-format.md), in one place.

The RLM loop, the bench's direct and compaction methods and the plain-LLM rollout all record a
run the same way:

    rec = RunRecorder(tracer)                      # kind "run" at depth 0; "child" below
    rec.start(query=q, model=client.name, budget=budget.model_dump())
    rec.note(system=..., first_user=...)           # a point event on the run
    turn = rec.turn(turn=1)                        # a turn span under the run
    turn.replied(comp)                             # usage as soon as the model answered
    turn.end(comp, blocks=1)                       # or turn.fail("why")
    rec.finish(result, totals=True)                # the final point, then the run's end

`result_from(ledger, tracer, ...)` builds the `Result` those runs return from what the shared
Ledger counted, so the answer, usage and cost a caller gets match the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recursa.base.types import Cell, Completion, Result
from recursa.core.dispatch import cache_mark

if TYPE_CHECKING:
    from recursa.core.budget import Ledger
    from recursa.obs.trace import Tracer


def completion_fields(comp: Completion) -> dict[str, Any]:
    """What a turn's end event says about its model call."""
    return dict(text=comp.text, usage=comp.usage.model_dump(), cost_usd=comp.cost_usd,
                model=comp.model, latency_s=round(comp.latency_s, 4), **cache_mark(comp))


class TurnSpan:
    """One model turn of a run: a `turn` span and what hangs under it."""

    def __init__(self, run: RunRecorder, id: str):
        self.run = run
        self.id = id

    def _emit(self, kind: str, **data: Any) -> str:
        return self.run.tracer.emit(kind, depth=self.run.depth, **data)

    def note(self, **data: Any) -> None:
        """A point event under this turn (e.g. a compaction before its model call)."""
        self._emit("turn", parent=self.id, **data)

    def replied(self, comp: Completion) -> None:
        """The spend, written the moment the model answered: a host killed while the turn's
        cells run still leaves it in the trace."""
        self._emit("turn", id=self.id, phase="update", parent=self.run.id,
                   usage=comp.usage.model_dump(), cost_usd=comp.cost_usd, model=comp.model,
                   **cache_mark(comp))

    def end(self, comp: Completion | None = None, **data: Any) -> None:
        """End the turn: its model call's text, usage, cost, model and latency, plus `data`.
        Without `comp` (the reply came from elsewhere, e.g. a trainer's policy), pass
        `text=` and whatever else is known in `data`."""
        fields = completion_fields(comp) if comp is not None else {}
        self._emit("turn", id=self.id, phase="end", parent=self.run.id, **fields, **data)

    def fail(self, error: str, **data: Any) -> None:
        self._emit("turn", id=self.id, phase="end", parent=self.run.id, error=error, **data)

    def cell(self, index: int, code: str) -> str:
        """Start a `cell` span under this turn; returns its id for `cell_end`."""
        return self._emit("cell", phase="start", parent=self.id, index=index, code=code)

    def cell_end(self, cell_id: str, cell: Cell, shown: str) -> None:
        self._emit("cell", id=cell_id, phase="end", parent=self.id, output=shown,
                   error=last_line(cell.error), elapsed_s=round(cell.elapsed_s, 4),
                   timed_out=cell.timed_out, restarted=cell.restarted,
                   ready=cell.final is not None)


class RunRecorder:
    """One run's span: `run` at depth 0, `child` below (a child RLM's span hangs under the cell
    whose code opened it)."""

    def __init__(self, tracer: Tracer, *, depth: int = 0, parent: str | None = None):
        self.tracer = tracer
        self.depth = depth
        self.parent = parent
        self.kind = "run" if depth == 0 else "child"
        self.id = ""

    def start(self, *, query: str, model: str, **data: Any) -> str:
        self.id = self.tracer.emit(self.kind, phase="start", parent=self.parent,
                                   depth=self.depth, query=query, model=model, **data)
        return self.id

    def note(self, **data: Any) -> None:
        """A point event on the run: the context's description, the first messages, the
        sandbox's isolation."""
        self.tracer.emit("run", parent=self.id, depth=self.depth, **data)

    def turn(self, **data: Any) -> TurnSpan:
        """Start a turn span: `turn=N` for a model turn, `last=True, prompt=...` for the
        answer-at-a-limit turn, any method-specific keys (`step=...`)."""
        return TurnSpan(self, self.tracer.emit("turn", phase="start", parent=self.id,
                                               depth=self.depth, **data))

    def finish(self, res: Result, *, totals: dict[str, Any] | None = None) -> None:
        """The `final` point, then the run's end. `totals` (tree-wide cost, tokens, sub-calls)
        go on the end event; only the top-level run should give them."""
        data: dict[str, Any] = dict(answer=res.answer, status=res.status, ready=res.ready,
                                    limit=res.limit, error=res.error,
                                    answer_source=res.answer_source)
        if res.output_error is not None:
            data["output_error"] = res.output_error
        if res.partial is not None:
            data["partial"] = res.partial
        if res.sources:      # checked against the context (recursa.core.sources); the viewer shows them
            data["sources"] = [src.model_dump(exclude_none=True) for src in res.sources]
            data["sources_verified"] = res.sources_verified
        self.tracer.emit("final", parent=self.id, depth=self.depth, **data)
        self.tracer.emit(self.kind, id=self.id, phase="end", parent=self.parent,
                         depth=self.depth, status=res.status, turns=res.turns,
                         elapsed_s=res.elapsed_s, **(totals or {}))


def result_from(ledger: Ledger, tracer: Tracer, **fields: Any) -> Result:
    """A Result with the usage, cost and sub-calls the ledger counted (for the whole tree)."""
    return Result(usage={k: v.model_copy(deep=True) for k, v in ledger.by_role.items()},
                  usage_by_model={k: v.model_copy(deep=True)
                                  for k, v in ledger.by_model.items()},
                  cost_usd=ledger.cost_usd, subcalls=ledger.subcalls,
                  cache_hits=ledger.cache_hits, run_id=tracer.run_id, **fields)


def tree_totals(ledger: Ledger, res: Result) -> dict[str, Any]:
    """The figures a top-level run's end event carries."""
    return dict(cost_usd=res.cost_usd, tokens=ledger.tokens, subcalls=ledger.subcalls)


def last_line(error: str | None) -> str | None:
    """An error's last non-blank line (what a cell's end event keeps of a traceback)."""
    if not error:
        return None
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "error"
