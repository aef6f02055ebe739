"""How the root works, beside the engine: the strategies.

The engine (the rest of `recursa.core`: the step machine in `loop`, dispatch, budget, deadline,
recorder, compaction, guards) runs turns; a strategy decides what happens before the first code
turn of a top-level run. Two exist:
- `code` (`recursa.core.strategies.code`): nothing before; the root writes code each turn.
- `plan` (`recursa.core.strategies.plan`): the root fills a typed plan (a kind from the registry
  in `recursa.core.strategies.plans`), the runtime runs it, and the root answers from its
  results; it falls back to the code turns, saying why.

Which one a run uses is chosen by `recursa.core.strategy.choose`. The seam is `Strategy` and
what it may use of a run (`Run`, `RunEnv`): no strategy imports the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from recursa.base.types import Cell, Message, ModelClient
    from recursa.core.budget import Budget, Ledger
    from recursa.core.dispatch import Dispatcher, Node
    from recursa.core.recorder import RunRecorder
    from recursa.core.state import RunState
    from recursa.obs.trace import Tracer


class RunEnv(Protocol):
    """What a strategy reads of a run's shared settings (recursa.core.loop.RunEnv)."""

    budget: Budget
    ledger: Ledger
    tracer: Tracer
    dispatcher: Dispatcher
    root_client: ModelClient
    root_options: dict[str, Any]
    max_output_chars: int
    strategy: str
    output: Any            # the answer's type (recursa.core.output), or None
    sources: bool


class Run(Protocol):
    """What a strategy uses of a run (recursa.core.loop.Run)."""

    st: RunState
    rec: RunRecorder
    query: str
    depth: int
    node: Node
    description: str       # the context's description, as the root's first message has it

    @property
    def env(self) -> RunEnv: ...

    @property
    def messages(self) -> list[Message]: ...

    async def run_cell(self, code: str) -> Cell: ...


class Strategy(Protocol):
    """What a top-level run does before its first code turn."""

    name: str

    async def begin(self, run: Run) -> bool:
        """Work before the code turns; True when the run's answer is final (the run is over)."""
        ...


def strategy_for(mode: str) -> Strategy:
    """The strategy of a chosen mode ("code" or "plan"); each is imported when used (the plan
    models take ~12 ms to import)."""
    if mode == "code":
        from recursa.core.strategies.code import CODE
        return CODE
    if mode == "plan":
        from recursa.core.strategies.plan import PLAN_MODE
        return PLAN_MODE
    raise ValueError(f"no strategy {mode!r}: code or plan")
