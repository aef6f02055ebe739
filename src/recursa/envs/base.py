"""Environments in three variants (`llm`, `rlm`, `rlm_tips`), each with its reward function.

An environment turns a seed into an instance (reusing a task family of the registry in
`recursa.frontend.tasks`: the bench's families, or a plugin's), tells each variant what to show
the model, which tools the sub-models hold, and scores an answer with the same scorer the
evaluation suite uses. Tips are environment-specific guidance that the RLM's
system prompt wraps in <tips>...</tips>, so they can be stripped from training data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recursa.frontend.tasks import TaskInstance as Instance
from recursa.frontend.tasks import get_task

VARIANTS = ("llm", "rlm", "rlm_tips")
TIPS_RE = re.compile(r"\n?<tips>.*?</tips>\n?", re.S)

LLM_SYSTEM = ("You are a careful assistant. Answer the question using the context given. "
              "Reply with the answer only, unless told otherwise.")
LLM_SYSTEM_TOOLS = ("You are a careful research assistant. The documents are not in this "
                    "conversation: find the facts with your tools, one hop at a time, then "
                    "reply with the answer only.")


def strip_tips(text: str) -> str:
    """The text without its <tips>...</tips> section (training data must not depend on tips)."""
    return TIPS_RE.sub("\n", text)


@dataclass(frozen=True)
class Env:
    """One environment. `task` names the task family it reuses (recursa.frontend.tasks)."""

    name: str
    task: str
    description: str
    tips: str
    default_length: int
    uses_tools: bool = False
    # the llm variant is sent the question alone: the problem is in it (its context repeats it)
    question_only: bool = False
    gen_options: tuple[tuple[str, Any], ...] = ()

    def instance(self, seed: int, length_tokens: int | None = None) -> Instance:
        return get_task(self.task).generate(seed=seed,
                                            length_tokens=length_tokens or self.default_length,
                                            **dict(self.gen_options))

    def reward(self, answer: str, inst: Instance) -> float:
        """The evaluation scorer's score in [0, 1]."""
        return float(get_task(self.task).score(answer or "", inst).score)

    def tools(self, inst: Instance) -> list[Callable[..., Any]]:
        """Tools for this instance (the sub-models' in rlm variants, the model's in llm)."""
        if not self.uses_tools:
            return []
        from recursa.envs.research import make_corpus_tools
        assert isinstance(inst.context, dict)
        return make_corpus_tools(inst.context)

    # ---------------------------------------------------------------- what the model sees
    def rlm_query(self, inst: Instance) -> str:
        return inst.query

    def rlm_context(self, inst: Instance) -> Any:
        if self.uses_tools:   # the corpus is reachable only through the sub-models' tools
            return {"question": inst.query,
                    "corpus": f"{len(inst.context)} documents, not loaded here: only your "
                              "sub-models can read them, with their search / open_page tools"}
        return inst.context

    def llm_messages(self, inst: Instance) -> list[dict[str, str]]:
        if self.uses_tools:
            return [{"role": "system", "content": LLM_SYSTEM_TOOLS},
                    {"role": "user", "content": inst.query}]
        ctx = inst.context
        if isinstance(ctx, list):
            body = "\n".join(f"[fragment {i + 1}]\n{c}" for i, c in enumerate(ctx))
        elif isinstance(ctx, dict):
            body = "\n\n".join(f"[{k}]\n{v}" for k, v in ctx.items())
        else:
            body = str(ctx)
        if self.question_only:
            return [{"role": "system", "content": LLM_SYSTEM},
                    {"role": "user", "content": inst.query}]
        return [{"role": "system", "content": LLM_SYSTEM},
                {"role": "user", "content": f"Context:\n{body}\n\nQuestion: {inst.query}"}]

    def tips_for(self, variant: str) -> str | None:
        check_variant(variant)
        return self.tips if variant == "rlm_tips" else None


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; variants: {', '.join(VARIANTS)}")
    return variant


ENVS: dict[str, Env] = {e.name: e for e in (
    Env(name="research", task="browsecomp", uses_tools=True, default_length=20_000,
        description="DeepDive-style multi-hop research; sub-models hold BM25 search / open_page "
                    "over a local corpus",
        tips="Sub-models hold the search and open_page tools; you do not, and the documents are "
             "not in `context`. Decompose the question into hops. For each hop, call "
             "llm_query with a precise instruction, e.g. llm_query('Use search and open_page to "
             "find who made X. Reply with the full name only.'); use llm_batch for independent "
             "look-ups. Put what one hop found into the next hop's prompt. Beware of "
             "near-identical names: ask sub-models to check every detail of the question. "
             "Then set answer['content'] to the short answer and answer['ready'] = True."),
    Env(name="math_python", task="math_python", default_length=0, question_only=True,
        description="seeded arithmetic / algebra / combinatorics problems",
        tips="Compute the answer exactly with Python in the REPL (fractions.Fraction, "
             "math.comb, pow(a, e, m), sympy if present); no sub-calls are needed. Print the "
             "result, check it, then set answer['content'] = '\\\\boxed{' + str(result) + '}' "
             "and answer['ready'] = True."),
    Env(name="oolong", task="oolong", default_length=2_000,
        description="OOLONG-style aggregation over records whose labels must be inferred",
        tips="`context` holds one record per line. Split it with context.splitlines(), group "
             "the records into chunks of about 30 lines, and label every record of every chunk "
             "with one llm_batch call (ask for one label per line, from the label set given in "
             "the question or data). Count in Python, print the counts, then answer with only "
             "the value asked for (a number, a label, a user id or a month)."),
    Env(name="verbatim_copy", task="verbatim_copy", default_length=300,
        description="reproduce a text exactly",
        tips="The text to copy is already in `context`: do not retype it and do not ask a "
             "model for it. Set answer['content'] = context (or ''.join(context) when it is a "
             "list of fragments), print len(answer['content']) and a short check against the "
             "source, then set answer['ready'] = True."),
)}


def get_env(name: str) -> Env:
    try:
        return ENVS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; environments: {', '.join(ENVS)}") from None
