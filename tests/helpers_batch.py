"""Scripted models (`replay:` responders) and files for the batch tests, importable by Ray
workers (tests/ is on their PYTHONPATH through ray_local.local_runtime_env)."""

from __future__ import annotations

from typing import Any

from recursa.base.types import ModelError


def _last(messages: list[dict[str, Any]]) -> str:
    return str(messages[-1].get("content", "")) if messages else ""


def first_word(messages: list[dict[str, Any]]) -> str:
    """Answers with the context's first word (code in the REPL reads it); fails a run whose
    context preview shows BOOM, as a provider error would."""
    if "BOOM" in _last(messages):
        raise ModelError("scripted failure: BOOM in the context")
    return "```repl\nFINAL(str(context).split()[0])\n```"


def slow_first_word(messages: list[dict[str, Any]]) -> str:
    """first_word after 0.3 s of 'model latency' (a sleep in the sandbox's code cell), so a
    batch lasts long enough to kill a worker in the middle."""
    if "BOOM" in _last(messages):
        raise ModelError("scripted failure: BOOM in the context")
    return "```repl\nimport time\ntime.sleep(0.3)\nFINAL(str(context).split()[0])\n```"


def extract(messages: list[dict[str, Any]]) -> str:
    """A typed extraction: {"name": first word, "words": word count}."""
    return ("```repl\nimport json\nw = str(context).split()\n"
            "FINAL(json.dumps({'name': w[0], 'words': len(w)}))\n```")
