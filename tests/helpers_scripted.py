"""Scripted models for tests: replies chosen by code, so a test knows what the loop was sent.

`repl(code)` is a root reply holding one code block; `root_script(...)` answers root turns in
order and echoes sub-calls; `SYSTEM_MARK` is a phrase of the root's system prompt, which tells a
root call from a sub-call. `sniah_model` plays every bench method's part on S-NIAH (and
`depth_model` a nested one), `copy_script` a root that copies its context;
`tool_responder` and `lookup` are a sub-model with one native tool, over HTTP."""

from __future__ import annotations

import json
import re
from typing import Any

from recursa.models.replay import ReplayClient

SYSTEM_MARK = "persistent Python REPL"


def repl(code: str) -> str:
    return f"```repl\n{code}\n```"


def is_root(messages: list[dict[str, Any]]) -> bool:
    return messages[0]["role"] == "system" and SYSTEM_MARK in messages[0]["content"]


def root_script(*replies: str, sub: str | None = None):
    """A responder: root turns get `replies` in order (the last one repeats); sub-calls get
    `sub`, or else an echo of their prompt."""
    state = {"i": 0}

    def respond(messages):
        if is_root(messages):
            r = replies[min(state["i"], len(replies) - 1)]
            state["i"] += 1
            return r
        return sub if sub is not None else "sub:" + messages[-1]["content"][:40]
    return respond


def root_calls(client: ReplayClient) -> list:
    return [c for c in client.calls if is_root(c)]


# ------------------------------------------------------------------ bench methods on S-NIAH
NUM = re.compile(r"is: (\d{7})")


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


def sniah_model(messages: list[dict[str, Any]]) -> str:
    """A scripted model that plays every method's part on S-NIAH, the way a capable model would:
    it finds the needle in what it is shown, or writes code that does."""
    system = str(messages[0].get("content", "")) if messages else ""
    last = str(messages[-1].get("content", ""))
    if "you can only search it" in system:              # codeact-bm25 root
        key = re.search(r"number for (\S+) mentioned", _text(messages))
        return ("```repl\nimport re\nhits = search(" + repr(key.group(1) if key else "magic")
                + ", k=3)\nprint(len(hits))\n"
                "m = re.search(r'is: (\\d{7})', ' '.join(h['text'] for h in hits))\n"
                "FINAL(m.group(1) if m else 'not found')\n```")
    if "no language-model calls" in system:             # rlm-d0 root: pure code
        return ("```repl\nimport re\nm = re.search(r'is: (\\d{7})', context)\n"
                "FINAL(m.group(1))\n```")
    if "REPL" in system:                                # rlm root: chunk, batch, combine
        return ("```repl\nimport re\nn = 4\nstep = len(context) // n + 1\n"
                "parts = [context[i:i + step] for i in range(0, len(context), step)]\n"
                "outs = llm_batch(['Give the 7-digit magic number in this text, or none: ' + p"
                " for p in parts])\n"
                "nums = [o for o in outs if re.fullmatch(r'\\d{7}', o.strip())]\n"
                "FINAL(nums[0] if nums else 'none')\n```")
    if "Write the updated notes" in last:               # compaction: summarise one window
        part = last.split("<<<", 1)[1]
        m = NUM.search(part)
        old = last.split("Your notes so far:\n", 1)[1].split("\n\nPart ", 1)[0]
        return f"magic number is: {m.group(1)}" if m else old
    m = NUM.search(last)                                # direct / compaction answer / sub-call
    return m.group(1) if m else "none"


def depth_model(messages: list[dict[str, Any]]) -> str:
    """Root -> child RLM (query SUBTASK) -> grandchild RLM (query LEAF), which finds the number."""
    first_user = str(messages[1].get("content", "")) if len(messages) > 1 else ""
    if "REPL" not in str(messages[0].get("content", "")):
        return "none"                                   # a plain sub-call
    if "LEAF" in first_user:
        return "```repl\nimport re\nFINAL(re.search(r'is: (\\d{7})', context).group(1))\n```"
    if "SUBTASK" in first_user:
        return "```repl\nFINAL(rlm_query('LEAF: the magic number', context=context))\n```"
    return "```repl\nFINAL(rlm_query('SUBTASK: the magic number', context=context))\n```"


# ------------------------------------------------------------------ verbatim copy
COPY = "```repl\nanswer['content'] = context\nanswer['ready'] = True\n```"


def copy_script(messages: list[dict[str, Any]]) -> str:
    """The RLM root copies its context (reward 1); the plain LLM answers with that code text
    (reward 0)."""
    return COPY


# ------------------------------------------------------------------ a sub-model with a tool
LOOKUPS: list[dict] = []      # what `lookup` was called with


def lookup(city: str) -> str:
    """Population of a city.

    Args:
        city: the city's name.
    """
    LOOKUPS.append({"city": city})
    return f"{city}: 2,1 million people (RAW TOOL OUTPUT MARKER)"


def tool_responder(req: dict):
    """An OpenAI-protocol sub-model: asks for `lookup("Paris")`, then answers from its output."""
    msgs = req["messages"]
    if req.get("tools") and not any(m.get("role") == "tool" for m in msgs):
        assert req["tools"][0]["function"]["name"] == "lookup"
        return {"content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"city": "Paris"})}}]}
    tool_msgs = [m for m in msgs if m.get("role") == "tool"]
    return "about two million" if tool_msgs and "MARKER" in tool_msgs[0]["content"] else "no"
