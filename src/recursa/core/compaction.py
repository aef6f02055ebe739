"""The root's history kept inside its window (design note 11).

Before every root call the loop estimates the messages' tokens; over the bound (`history_budget`)
the oldest turns are replaced by one user message (the first user message plus a deterministic
summary of what those turns did), and the whole conversation is put in the REPL for the model to
read. Every compaction is traced exactly, so the SFT export can replay it (design note 12).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from recursa.base.types import Message, context_window
from recursa.core import prompts
from recursa.core.dispatch import text_tokens
from recursa.core.state import RunState

WINDOW_FILL = 0.85            # compact the root's history beyond this share of its window
COMPACT_TO = 0.7              # ... down to this share of the budget when it can
DEFAULT_TURN_TOKENS = 1024    # the root's output cap when neither its options nor client say

_DIGIT = re.compile(r"\d")


def _tokens(text: str) -> int:
    """text_tokens, plus digits at one token each (tokenizers such as Qwen's split numbers
    into single digits, which chars/4 undercounts four-fold)."""
    return text_tokens(text) + (3 * len(_DIGIT.findall(text))) // 4


def msg_tokens(messages: list[Message]) -> int:
    """The estimated tokens of `messages`, 5 a message for the chat template."""
    return sum(_tokens(str(m.get("content", ""))) + 5 for m in messages)


class Bounds(Protocol):
    """What bounds the root's history (a run's RunEnv has these)."""

    root_client: Any
    root_options: dict[str, Any]
    max_history_tokens: int | None


@dataclass
class Compaction:
    """Messages [start:end] replaced by `new`, and the trace note that says so exactly."""

    start: int
    end: int
    new: list[Message]
    note: dict[str, Any]


def history_budget(env: Bounds) -> int | None:
    """The most tokens of messages the root may be sent, or None when nothing bounds it."""
    client = env.root_client
    window = context_window(client)
    bounds = []
    if window:
        out = env.root_options.get("max_tokens") or \
            client.capabilities.max_output_tokens or DEFAULT_TURN_TOKENS
        bounds.append(int(int(window) * WINDOW_FILL) - min(int(out), int(window) // 4))
    if env.max_history_tokens:
        bounds.append(int(env.max_history_tokens))
    return min(bounds) if bounds else None


def abridge(text: str, limit: int) -> str:
    """`text` stripped and cut to `limit` characters (for the one-line log of a turn)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f" ... [{len(text) - limit:,} more characters]"


def history_code(st: RunState) -> tuple[str, str]:
    """The variable the whole conversation so far goes in, and the harness code that puts it
    in the REPL as a list of messages (the loop runs it; `st.history_var` once it ran)."""
    name = st.history_var or ("history" if "history" not in st.variables else "full_history")
    data = json.dumps(st.full, ensure_ascii=False)
    return name, f"{name} = __import__('json').loads({data!r})"


def over(budget: int | None, messages: list[Message], extra_tokens: int = 0) -> bool:
    """Whether `messages` (plus `extra_tokens` still to come) exceed the budget and can be
    compacted (there is more than the system and query messages)."""
    return budget is not None and len(messages) > 2 and \
        msg_tokens(messages) + extra_tokens > budget


def compact(st: RunState, messages: list[Message], budget: int, extra_tokens: int,
            var: str | None) -> Compaction:
    """The replacement that brings `messages` (plus `extra_tokens`) inside `budget`; `var`:
    the REPL variable holding the whole conversation (None: it could not be put there)."""
    before = msg_tokens(messages) + extra_tokens
    start, end, new = _compact(st, messages, budget - extra_tokens, var)
    after = msg_tokens([*messages[:start], *new, *messages[end:]]) + extra_tokens
    return Compaction(start, end, new, {
        "start": start, "end": end, "messages": new, "tokens_before": before,
        "tokens_after": after, "budget": budget, "history_var": var})


def _compact(st: RunState, messages: list[Message], budget: int,
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
        rest = msg_tokens([*head, {"content": st.first_user}, *tail])
        # the summary never crowds out the live turns, but lists a turn or two if it can
        room = min(budget // 4, max(min(aim, target) - rest, (budget - rest) // 2))
        first = _summary_message(st, st.turns - kept, var, room)
        if msg_tokens([*head, first, *tail]) <= target:
            return 1, cut, [first]
    first = _summary_message(st, st.turns - kept, var, 0)
    room = max(0, budget - msg_tokens([*head, first]))
    cut_tail = []
    for j, m in enumerate(tail):
        short = _shrink(str(m["content"]), room // max(1, len(tail) - j) - 5)
        room -= msg_tokens([{"content": short}])
        cut_tail.append({"role": m["role"], "content": short})
    return 1, len(messages), [first, *cut_tail]


def _summary_message(st: RunState, removed: int, var: str | None, room: int) -> Message:
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
        if msg_tokens([trial]) - msg_tokens([{"content": st.first_user}]) > room:
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
