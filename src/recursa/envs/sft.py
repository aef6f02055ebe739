"""SFT export: traces of scored runs -> chat-format fine-tuning examples (JSONL).

Each kept run gives one example holding the root conversation exactly as the root model saw it
(system prompt, first user message, then its replies and the REPL feedback, rebuilt from the
trace's turn and cell events with the loop's own templates; reminders and nudges are traced
verbatim, and so is each compaction of the history), ending with the root's last reply. A run
whose history was compacted gives one more example per compaction: the conversation as it stood
just before it.
With `subcalls=True` every sub-model call becomes an example of its own (prompt -> response).
Lines are `{"messages": [...]}` — the format TRL's SFTTrainer, axolotl's chat_template and the
OpenAI fine-tuning API read — plus `meta` when asked. Identical examples are written once.

Rejection fine-tuning keeps runs whose reward (recorded in the trace by the rollout runner, see
`recursa.envs.rollout`) is at least `min_reward`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recursa.base.privatefiles import write_private_text
from recursa.core import prompts
from recursa.core.loop import KEEP
from recursa.envs.base import strip_tips
from recursa.obs.trace import Run, TraceNode, load_runs

Messages = list[dict[str, str]]


@dataclass
class ExportStats:
    runs: int = 0
    kept_runs: int = 0
    examples: int = 0
    root_examples: int = 0
    sub_examples: int = 0
    duplicates: int = 0
    low_reward: int = 0
    unscored: int = 0
    unusable: int = 0        # runs whose conversation cannot be rebuilt (see root_messages)


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob("*.jsonl")))
        elif p.is_file():
            out.append(p)
        else:
            raise OSError(f"no such trace file or directory: {p}")
    return out


def run_reward(run: Run) -> dict[str, Any] | None:
    """The last reward record of a run (a `run` point event with `reward`), or None."""
    root = run.root
    if root is None:
        return None
    recs = [p.data for p in root.points if p.kind == "run" and "reward" in p.data]
    return dict(recs[-1]) if recs else None


def _first_messages(root: TraceNode) -> tuple[str, str] | None:
    for p in root.points:
        if "system" in p.data and "first_user" in p.data:
            return str(p.data["system"]), str(p.data["first_user"])
    return None


def root_calls(run: Run) -> list[tuple[Messages, str]] | None:
    """Every call of the top-level root model: the exact messages it was sent and its reply,
    replayed from the trace with the loop's own rules and templates, compactions included.

    None when the trace cannot give them exactly: no traced first messages, a plain-LLM turn
    whose tool calls were not traced. A turn that failed before the model replied is skipped;
    an old trace's last turn that kept a draft (KEEP) stops the replay before that turn, since
    the draft shown to the model was not traced then.
    """
    calls = _replay(run)
    return None if calls is None else [(m, r) for m, r, _ in calls]


def _replay(run: Run) -> list[tuple[Messages, str, bool]] | None:
    """root_calls, each with whether the history was compacted just before it."""
    root = run.root
    if root is None:
        return None
    first = _first_messages(root)
    if first is None:
        return None
    msgs: Messages = [{"role": "system", "content": first[0]},
                      {"role": "user", "content": first[1]}]
    query = str(run.query or "")
    turns = [run.nodes[c] for c in root.children if run.nodes[c].kind == "turn"]
    regular = [t for t in turns if not t.data.get("last") and _replied(t)]
    out: list[tuple[Messages, str, bool]] = []
    compacted = False
    for turn in turns:
        for p in turn.points:   # the loop compacted the history before this call (even if the
            c = p.data.get("compaction")           # call was then refused by the budget)
            if isinstance(c, dict):
                msgs[int(c["start"]):int(c["end"])] = [
                    {"role": str(m["role"]), "content": str(m["content"])}
                    for m in c["messages"]]
                compacted = True
        if not _replied(turn):
            continue
        if turn.data.get("tool_calls"):
            return None
        text = str(turn.data["text"])
        if turn.data.get("last"):
            prompt = turn.data.get("prompt")
            if not isinstance(prompt, str):      # a trace from before the prompt was traced
                if text.strip("`'\". ").upper() == KEEP:
                    break
                prompt = prompts.LAST_TURN.format(limit=run.limit or "error", query=query[:500])
            if turn.data.get("merged") and msgs[-1]["role"] == "user":
                call = [*msgs[:-1], {"role": "user",
                                     "content": msgs[-1]["content"] + "\n\n" + prompt}]
            else:
                call = [*msgs, {"role": "user", "content": prompt}]
            out.append((call, text, compacted))
            break
        out.append((list(msgs), text, compacted))
        compacted = False
        msgs.append({"role": "assistant", "content": text})
        if _ended(turn, run, turn is regular[-1]):
            continue
        feedback = turn.data.get("feedback")
        if not isinstance(feedback, str):
            cells = [run.nodes[c] for c in turn.children if run.nodes[c].kind == "cell"]
            if not cells:
                body = prompts.NO_CODE
            elif len(cells) == 1:
                body = str(cells[0].data.get("output", ""))
            else:
                body = "\n\n".join(f"[block {j + 1}]\n{c.data.get('output', '')}"
                                    for j, c in enumerate(cells))
            feedback = body + "\n\n" + prompts.CONTINUE.format(query=query[:500])
        msgs.append({"role": "user", "content": feedback})
    return out


def _replied(turn: TraceNode) -> bool:
    text = turn.data.get("text")
    return isinstance(text, str) and bool(text)


def _ended(turn: TraceNode, run: Run, last_regular: bool) -> bool:
    """Whether the run stopped after this turn, so no feedback followed it."""
    if "ended" in turn.data:
        return bool(turn.data["ended"])
    # traces from before `ended` was written: a cell committed, or too many failing turns
    cells = [run.nodes[c] for c in turn.children if run.nodes[c].kind == "cell"]
    if any(c.data.get("ready") for c in cells):
        return True
    return last_regular and run.limit == "max_consecutive_errors"


def root_conversations(run: Run) -> list[Messages] | None:
    """The root's conversations as training examples: the last one as the model saw it at its
    last turn, and, when the loop compacted the history, also each conversation as it stood
    just before a compaction (so replies that a compaction later removed are kept too)."""
    calls = _replay(run)
    if not calls:
        return None
    return [[*msgs, {"role": "assistant", "content": reply}]
            for i, (msgs, reply, _) in enumerate(calls)
            if i + 1 == len(calls) or calls[i + 1][2]]


def root_messages(run: Run) -> Messages | None:
    """The root model's conversation as it saw it at its last turn, ending with its last reply;
    None when the trace cannot give it exactly (see root_calls)."""
    convs = root_conversations(run)
    return convs[-1] if convs else None


def sub_messages(run: Run) -> list[Messages]:
    """One example per successful sub-call whose prompt was traced in full and that used no
    tools (a tool loop's inner conversation is not in the trace)."""
    out = []
    for n in run.walk():
        if n.kind != "subcall" or n.data.get("error") or n.data.get("tool_calls"):
            continue
        prompt, resp = n.data.get("prompt"), n.data.get("response")
        if not isinstance(prompt, str) or not isinstance(resp, str) or not resp:
            continue
        if int(n.data.get("prompt_chars") or len(prompt)) != len(prompt):
            continue   # truncated in the trace
        out.append([{"role": "user", "content": prompt}, {"role": "assistant", "content": resp}])
    return out


def _strip(msgs: Messages) -> Messages:
    return [{**m, "content": strip_tips(m["content"])} for m in msgs]


def export_sft(paths: Iterable[str | Path], out: str | Path, *, min_reward: float = 1.0,
               strip: bool = True, subcalls: bool = False, include_unscored: bool = False,
               meta: bool = False) -> ExportStats:
    stats = ExportStats()
    seen: set[str] = set()
    lines: list[str] = []

    def add(msgs: Messages, info: dict[str, Any], kind: str) -> None:
        if strip:
            msgs = _strip(msgs)
        key = hashlib.sha256(json.dumps(msgs, sort_keys=True).encode()).hexdigest()
        if key in seen:
            stats.duplicates += 1
            return
        seen.add(key)
        row: dict[str, Any] = {"messages": msgs}
        if meta:
            row["meta"] = {**info, "kind": kind}
        lines.append(json.dumps(row, ensure_ascii=False))
        stats.examples += 1
        if kind == "root":
            stats.root_examples += 1
        else:
            stats.sub_examples += 1

    for path in trace_files(paths):
        try:
            runs = load_runs(path)
        except ValueError:
            continue   # not a recursa trace
        for run in runs:
            stats.runs += 1
            rec = run_reward(run)
            if rec is None and not include_unscored:
                stats.unscored += 1
                continue
            if rec is not None and float(rec["reward"]) < min_reward:
                stats.low_reward += 1
                continue
            info = {"run_id": run.run_id, "reward": rec.get("reward") if rec else None,
                    "env": rec.get("env") if rec else None,
                    "variant": rec.get("variant") if rec else None, "trace": str(path)}
            convs = root_conversations(run) or []
            subs = sub_messages(run) if subcalls else []
            if not convs and not subs:
                stats.unusable += 1
                continue
            stats.kept_runs += 1
            for msgs in convs:
                add(msgs, info, "root")
            for s in subs:
                add(s, info, "sub")
    # the conversations of the traces: owner-only, as the traces are
    write_private_text(out, "".join(line + "\n" for line in lines))
    return stats
