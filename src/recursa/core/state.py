"""A run's state, in a type of its own: what the loop (recursa.core.loop), its guards
(recursa.core.guards) and its compaction (recursa.core.compaction) read and decide on.

Whatever happens to a run, its Result is built from this state. Guards and compaction are
functions of it: they change the state and say what the loop must do (a `Nudge`: the message to
send, the harness code to run in the REPL); they never call back into the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recursa.base.types import Message, Source


@dataclass
class RunState:
    """What a run has so far."""

    answer: dict[str, Any] = field(default_factory=lambda: {"content": "", "ready": False})
    final: str | None = None
    turns: int = 0
    limit: str | None = None
    partial: str | None = None    # the answer rests on part of the work ("26 of 48 ...")
    error: Exception | str | None = None
    consecutive_errors: int = 0
    first_user: str = ""
    messages: list[Message] = field(default_factory=list)  # what the root is sent (compacted)
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
                                  # (False once a rerun printed the same)
    prose_draft: str | None = None
    history_var: str | None = None
    seen: list[str] = field(default_factory=list)   # what the model was shown (query, outputs)
    held: bool = False            # a commit with a number never shown was held once
    extracted: bool = False       # answer["content"] came from the last-answer turn's reply
    sources_asked: bool = False   # a commit without sources was held once (RLM(sources=True))
    sources: list[Source] = field(default_factory=list)  # the answer's, checked (recursa.core.sources)
    # the root's real input tokens over their estimate on its last reply (at least 1): text
    # full of digits and punctuation is more tokens than chars / 4 says, and a history fitted
    # by the estimate alone overflowed a 2,048-token window (a pairs query over records of ids
    # and counts)
    token_scale: float = 1.0

    def append(self, msg: Message) -> None:
        """A message of the conversation: sent from now on, and kept in full."""
        self.messages.append(msg)
        self.full.append(msg)


@dataclass
class Nudge:
    """A guard's decision: `text` goes to the model instead of the plain feedback (None: the
    plain feedback); `repl` is harness code the loop runs in the REPL first (best effort)."""

    text: str | None = None
    repl: str | None = None
