"""The first reply token's log-probabilities from an OpenAI-format chat response.

llama.cpp's server and OpenAI answer `logprobs=True, top_logprobs=k` in the same shape:
`choices[0].logprobs.content[0].top_logprobs = [{"token": ..., "logprob": ...}, ...]`.
A combinator that ranks items by how sure the sub-model is of one word (`llm_rank`) reads it.
"""

from __future__ import annotations

from typing import Any


def first_logprobs(resp: Any) -> dict[str, float] | None:
    """token -> log-probability of the first reply token's alternatives, or None when the
    response carries none (not asked, or a server that does not give them)."""
    try:
        content = resp["choices"][0]["logprobs"]["content"]
        top = content[0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        return None
    out: dict[str, float] = {}
    for t in top if isinstance(top, list) else ():
        if isinstance(t, dict) and isinstance(t.get("token"), str) \
                and isinstance(t.get("logprob"), int | float):
            out.setdefault(t["token"], float(t["logprob"]))
    return out or None
