"""recursa's Recursive Language Models as models of the `llm` CLI.

    llm -m recursa-local "Which section names the failing pump?" -f report.txt
    llm -m recursa/openai:gpt-5-mini "What failed first?" -f big.log -o max_cost 0.5
    llm -m recursa "..." -f a.txt -f b.txt -o model anthropic:claude-sonnet-4-5 -o max_iterations 6

The documents given with `-f` (fragments) and `-a` (attachments with a path) are the RLM's
`context`; the prompt is its question. One document is the context as it is; several are a dict
keyed by their source. Without either, a system prompt (`-s`) is the context (with documents it
is extra instructions for the root model); without that either, the whole prompt is the context
(llm joins piped stdin and the prompt into one text: `cat big.log | llm -m recursa "What
failed?"`). Every run is logged by llm as usual,
with its token counts and, in `response_json`, how it ended (status, turns, sub-calls, cost).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import llm
from pydantic import Field

# model ids: `recursa` (the model named by -o model, else recursa's default), `recursa-local`
# (the default local model) and `recursa/<spec>` for each local model and each spec listed one
# a line in <llm user dir>/recursa-models.txt
DEFAULT_LOCAL = "local:qwen2.5-coder-1.5b"
MODELS_FILE = "recursa-models.txt"

WHOLE_PROMPT_QUERY = ("The context is the user's whole message: material followed by a request "
                      "about it (usually its last sentence or paragraph). Do what the request "
                      "asks, using the material.")

# keys stored with `llm keys set NAME`, used for a provider when recursa would read the
# environment variable and it is not set (and no base_url sends the request elsewhere)
_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY",
         "gemini": "GEMINI_API_KEY", "openrouter": "OPENROUTER_API_KEY"}

# what `-a` accepts: the types recursa reads as contexts (text, JSON, images, documents)
ATTACHMENT_TYPES = frozenset({
    "text/plain", "text/markdown", "text/csv", "text/tab-separated-values", "text/html",
    "text/x-python", "application/json", "application/x-ndjson", "application/xml",
    "image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/epub+zip", "application/zip", "application/x-tar", "application/x-sqlite3",
    "application/vnd.sqlite3",
})


@llm.hookimpl
def register_models(register: Any) -> None:
    register(RecursaModel("recursa", None))
    register(RecursaModel("recursa-local", DEFAULT_LOCAL))
    for spec in _listed_specs():
        register(RecursaModel(f"recursa/{spec}", spec))


def _listed_specs() -> list[str]:
    from recursa.models import REGISTRY
    specs = [f"local:{name}" for name in REGISTRY]
    listed = llm.user_dir() / MODELS_FILE
    if listed.is_file():
        for line in listed.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and line not in specs:
                specs.append(line)
    return specs


class RecursaModel(llm.Model):
    can_stream = False            # an RLM answers once, at the end of its run
    attachment_types = ATTACHMENT_TYPES

    class Options(llm.Options):
        model: str | None = Field(None, description="root model spec, e.g. openai:gpt-5-mini "
                                  "(default: the model id's, else recursa's default)")
        sub_model: str | None = Field(None, description="model spec for sub-calls "
                                      "(default: the root model)")
        base_url: str | None = Field(None, description="endpoint of an OpenAI-compatible server")
        sub_base_url: str | None = Field(None, description="endpoint for the sub-model")
        max_iterations: int | None = Field(None, description="root turns (default 30)", ge=1)
        max_depth: int | None = Field(None, description="depth of rlm_query (default 1)", ge=0)
        max_subcalls: int | None = Field(None, description="sub-calls across the run", ge=0)
        max_tokens: int | None = Field(None, description="tokens across the run", ge=1)
        max_cost: float | None = Field(None, description="USD across the run", gt=0)
        max_seconds: float | None = Field(None, description="wall time of the run", gt=0)
        cell_timeout: float | None = Field(None, description="seconds of code time per cell",
                                           gt=0)
        max_answer_tokens: int | None = Field(None, description="output cap of every model "
                                              "reply (default: the client's)", ge=1)
        sandbox: str | None = Field(None, description="local (default), limits, inprocess, "
                                    "docker, ...")
        strategy: str | None = Field(None, description="code (default), plan or auto")
        trace: str | None = Field(None, description="write the run's trace to this file")

    def __init__(self, model_id: str, spec: str | None):
        self.model_id = model_id
        self.spec = spec

    def execute(self, prompt: Any, stream: bool, response: Any,
                conversation: Any = None) -> Any:
        from recursa import RLM, RecursaError

        opts = prompt.options
        from recursa.models import resolve_model  # aliases and the default model
        try:
            spec, _why = resolve_model(opts.model or self.spec)
            sub_spec = resolve_model(opts.sub_model)[0] if opts.sub_model else spec
        except (RecursaError, ValueError) as e:      # a settings file that cannot be read
            raise llm.ModelError(f"recursa: {e}") from e
        context, query = _context_and_query(prompt)
        system = prompt.system or None
        if context is None and system:
            context, system = system, None
        elif context is None:
            # llm joins piped stdin and the prompt into one text (`cat big.log | llm -m
            # recursa "What failed first?"`): that text is the context, its request the query
            if not query.strip():
                raise llm.ModelError("recursa: give a question, and the documents with -f FILE "
                                     "or -a FILE (or pipe them in)")
            context, query = query, WHOLE_PROMPT_QUERY
        limits = {k: v for k, v in dict(
            max_iterations=opts.max_iterations, max_depth=opts.max_depth,
            max_subcalls=opts.max_subcalls, max_tokens=opts.max_tokens,
            max_cost_usd=opts.max_cost, max_seconds=opts.max_seconds,
            cell_timeout=opts.cell_timeout).items() if v is not None}
        extra: dict[str, Any] = {}
        if opts.sandbox:
            extra["sandbox"] = opts.sandbox
        if opts.strategy:
            extra["strategy"] = opts.strategy
        if opts.trace:
            extra["trace_path"] = opts.trace
        if opts.max_answer_tokens:
            cap = {"max_tokens": opts.max_answer_tokens}
            extra.update(model_options=cap, sub_model_options=cap)
        try:
            rlm = RLM(model=spec, sub_model=sub_spec, base_url=opts.base_url,
                      api_key=_stored_key(spec, opts.base_url),
                      sub_base_url=opts.sub_base_url,
                      sub_api_key=_stored_key(sub_spec, opts.sub_base_url or opts.base_url),
                      tips=system, **extra, **limits)
            res = rlm.completion(query, context)
        except (RecursaError, ValueError, TypeError) as e:
            raise llm.ModelError(f"recursa: {e}") from e
        tokens_in = sum(u.usage.input_tokens for u in res.usage.values())
        tokens_out = sum(u.usage.output_tokens for u in res.usage.values())
        response.set_usage(input=tokens_in, output=tokens_out,
                           details={"turns": res.turns, "subcalls": res.subcalls})
        response.response_json = res.model_dump(
            mode="json", include={"status", "answer_source", "ready", "limit", "error", "turns",
                                  "subcalls", "cost_usd", "elapsed_s", "trace_path", "run_id",
                                  "usage_by_model"})
        if res.status == "error" and not res.answer:
            raise llm.ModelError(f"recursa: the run failed: {res.error}")
        if res.status != "final":
            why = res.limit or res.error or "the model did not commit an answer"
            click.echo(f"recursa: the run ended with status {res.status} ({why}); "
                       f"the answer is its best draft", err=True)
        yield res.answer


def _context_and_query(prompt: Any) -> tuple[Any, str]:
    """The documents of a prompt (fragments and attachments) and its question.

    `prompt.prompt` is the fragments and the question joined by newlines (llm's Prompt), so the
    question is what follows the fragments."""
    fragments = [str(f) for f in prompt.fragments or []]
    text = prompt.prompt or ""
    joined = "\n".join(fragments)
    query = text[len(joined) + 1:] if fragments and text.startswith(joined) else text
    if not fragments and not prompt.attachments:
        return None, query
    docs: dict[str, Any] = {}
    for i, frag in enumerate(prompt.fragments or [], 1):
        source = getattr(frag, "source", "") or ""
        docs[_unique(docs, source if source and source != "-" else f"fragment {i}")] = str(frag)
    for i, att in enumerate(prompt.attachments or [], 1):
        if att.path:
            docs[_unique(docs, att.path)] = Path(att.path)
        elif att.content is not None:
            docs[_unique(docs, f"attachment {i}")] = _decode(att.content)
        else:
            raise llm.ModelError(f"recursa: attachment {att.url} is a URL; download it and "
                                 "give the file with -a or -f")
    if not query.strip():
        raise llm.ModelError("recursa: give a question as the prompt, the documents with -f/-a")
    if len(docs) == 1:
        return next(iter(docs.values())), query
    from recursa.core.context import load_path
    return {k: (load_path(v)[0] if isinstance(v, Path) else v) for k, v in docs.items()}, query


def _unique(taken: dict[str, Any], name: str) -> str:
    out, n = name, 2
    while out in taken:
        out, n = f"{name} ({n})", n + 1
    return out


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise llm.ModelError("recursa: an attachment from stdin is not UTF-8 text; give the "
                             "file by path (-a FILE)") from e


def _stored_key(spec: str, base_url: str | None) -> str | None:
    """A key stored with `llm keys set <provider>` when the provider's variable is unset; never
    for a custom endpoint (a provider's key goes only to that provider)."""
    provider = spec.split(":", 1)[0]
    env = _KEYS.get(provider)
    if env is None or base_url or os.environ.get(env):
        return None
    return llm.get_key(key_alias=provider)      # the name older llm releases take too
