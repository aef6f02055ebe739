"""recursa's Recursive Language Models as models of the `llm` CLI.

    llm -m recursa-local "Which section names the failing pump?" -f report.txt
    llm -m recursa/openai:gpt-5-mini "What failed first?" -f big.log -o max_cost 0.5
    llm -m recursa "..." -f a.txt -f b.txt -o model anthropic:claude-sonnet-4-5 -o max_iterations 6
    llm -m recursa "..." -f big.log -o model openai:my-model -o base_url URL -o price 0.15/0.6 \
        -o max_cost 0.5 -o progress true -o sources true
    llm -m recursa "Which customers ordered twice?" -f notes.md -o mcp mcp.json

The documents given with `-f` (fragments) and `-a` (attachments with a path) are the RLM's
`context`; the prompt is its question. One document is the context as it is; several are a dict
keyed by their source. Without either, a system prompt (`-s`) is the context (with documents it
is extra instructions for the root model); without that either, the whole prompt is the context
(llm joins piped stdin and the prompt into one text: `cat big.log | llm -m recursa "What
failed?"`). Every run is logged by llm as usual,
with its token counts and, in `response_json`, how it ended (status, turns, sub-calls, cost).
While a run works, its progress (turns, sub-calls, a map's done/total, spend) goes to stderr
when stderr is a terminal or `-o progress true` asks; stdout has the answer only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal, TextIO

import click
import llm
from pydantic import Field, field_validator

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
        max_cost: float | None = Field(None, description="USD across the run (every model "
                                       "needs a price: see price)", gt=0)
        max_seconds: float | None = Field(None, description="wall time of the run", gt=0)
        cell_timeout: float | None = Field(None, description="seconds of code time per cell",
                                           gt=0)
        max_answer_tokens: int | None = Field(None, description="output cap of every model "
                                              "reply (default: the client's)", ge=1)
        sandbox: str | None = Field(None, description="local (default), limits, inprocess, "
                                    "docker, ...")
        strategy: Literal["auto", "code", "plan"] | None = Field(
            None, description="how the root works: auto (default: plan for small root models, "
            "code for large ones), code or plan")
        route: Literal["rlm", "direct", "auto"] | None = Field(
            None, description="rlm (default: the REPL loop), direct (one plain model call with "
            "the documents in the prompt) or auto (direct when they fit route_threshold)")
        route_threshold: int | None = Field(None, description="route auto: the most tokens "
                                            "that go direct", ge=1)
        price: str | None = Field(None, description="price of a model recursa knows none for, "
                                  "USD per 1M input/output tokens: IN/OUT for the root model "
                                  "(e.g. 0.15/0.6), MODEL=IN/OUT for another; several "
                                  "separated by commas")
        sources: bool | None = Field(None, description="after the answer, the passages it "
                                     "rests on, checked against the documents")
        progress: bool | None = Field(None, description="turns, sub-calls, a map's progress "
                                      "and spend on stderr while the run works (default: when "
                                      "stderr is a terminal)")
        trace: str | None = Field(None, description="write the run's trace to this file")
        mcp: str | None = Field(None, description="a JSON file of MCP servers ({\"mcpServers\": "
                                "...}, with an allow-list each): the allowed tools become "
                                "functions in the REPL, called by recursa (recursa run --mcp)")

        @field_validator("price")
        @classmethod
        def _price_is_valid(cls, value: str | None) -> str | None:
            if value is not None:
                prices(value)
            return value

    def __init__(self, model_id: str, spec: str | None):
        self.model_id = model_id
        self.spec = spec

    def execute(self, prompt: Any, stream: bool, response: Any,
                conversation: Any = None) -> Any:
        from recursa import RLM, RecursaError
        from recursa.core import sources

        opts = prompt.options
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
        view = None
        try:
            spec, why = root_spec(opts.model or self.spec)
            kwargs = rlm_arguments(opts, spec, system)
            check_prices_and_keys(kwargs)
            view = progress_view(opts.progress, sys.stderr, kwargs)
            if view is not None and why:
                click.echo(f"recursa: no -o model given: using {spec} ({why})", err=True)
            rlm = RLM(**kwargs, sinks=[view] if view else None)
            res = rlm.completion(query, context)
        except (RecursaError, ValueError, TypeError) as e:   # ValueError: a bad settings file too
            raise llm.ModelError(f"recursa: {e}") from e
        finally:
            if view is not None:
                view.close()
        if view is not None:
            click.echo(summary(res), err=True)
        tokens_in = sum(u.usage.input_tokens for u in res.usage.values())
        tokens_out = sum(u.usage.output_tokens for u in res.usage.values())
        response.set_usage(input=tokens_in, output=tokens_out,
                           details={"turns": res.turns, "subcalls": res.subcalls})
        response.response_json = res.model_dump(
            mode="json", include={"status", "answer_source", "ready", "limit", "error", "turns",
                                  "subcalls", "cost_usd", "elapsed_s", "trace_path", "run_id",
                                  "usage_by_model", "route", "sources", "sources_verified"})
        if res.status == "error" and not res.answer:
            raise llm.ModelError(f"recursa: the run failed: {res.error}")
        if res.status != "final":
            why = res.limit or res.error or "the model did not commit an answer"
            click.echo(f"recursa: the run ended with status {res.status} ({why}); "
                       f"the answer is its best draft", err=True)
        warning = sources.warning(res.sources)
        if warning:
            click.echo(f"recursa: warning: {warning}", err=True)
        # as `recursa run --sources` prints them: after the answer, on stdout
        yield res.answer + ("\n\n" + sources.render(res.sources) if opts.sources else "")


def root_spec(named: str | None) -> tuple[str, str]:
    """The root model's spec, and why when none was named: recursa's own choice
    (RECURSA_MODEL, its settings file's default_model, a provider key in the environment or
    stored with `recursa keys set`), then a key stored with `llm keys set openai` (or
    `anthropic`) before the free local model. Aliases of recursa's settings file resolve."""
    from recursa.models import DEFAULT_ANTHROPIC, DEFAULT_LOCAL, DEFAULT_OPENAI, resolve_model
    spec, why = resolve_model(named)
    if named or spec != DEFAULT_LOCAL or os.environ.get("RECURSA_MODEL", "").strip():
        return spec, why
    from recursa.models.userconfig import load
    if load().default_model:
        return spec, why
    for provider, default in (("openai", DEFAULT_OPENAI), ("anthropic", DEFAULT_ANTHROPIC)):
        if llm.get_key(key_alias=provider):
            return default, f"a key for {provider} is stored in llm"
    return spec, why


def rlm_arguments(opts: Any, spec: str, system: str | None) -> dict[str, Any]:
    """RLM's keyword arguments for a prompt's options, named as `recursa run` names them
    (recursa.frontend.options): limits, sandbox, strategy, route, sources, prices, trace, reply
    cap, MCP servers."""
    from recursa.models import resolve_model
    sub_spec = resolve_model(opts.sub_model)[0] if opts.sub_model else spec
    kw: dict[str, Any] = dict(
        model=spec, sub_model=sub_spec, base_url=opts.base_url,
        api_key=_stored_key(spec, opts.base_url), sub_base_url=opts.sub_base_url,
        sub_api_key=_stored_key(sub_spec, opts.sub_base_url or opts.base_url), tips=system)
    kw.update({k: v for k, v in dict(
        max_iterations=opts.max_iterations, max_depth=opts.max_depth,
        max_subcalls=opts.max_subcalls, max_tokens=opts.max_tokens,
        max_cost_usd=opts.max_cost, max_seconds=opts.max_seconds,
        cell_timeout=opts.cell_timeout, sandbox=opts.sandbox, strategy=opts.strategy,
        route=opts.route, route_threshold=opts.route_threshold,
        trace_path=opts.trace, mcp_servers=opts.mcp).items() if v is not None})
    if opts.sources:
        kw["sources"] = True
    if opts.price:
        kw["prices"] = {resolve_model(model)[0] if model else spec: (pin, pout)
                        for model, pin, pout in prices(opts.price)}
    if opts.max_answer_tokens:
        cap = {"max_tokens": opts.max_answer_tokens}
        kw.update(model_options=cap, sub_model_options=dict(cap))
    return kw


def prices(text: str) -> list[tuple[str | None, float, float]]:
    """`-o price`: `[MODEL=]IN/OUT` (recursa run's --price), several separated by commas."""
    import argparse

    from recursa.frontend.options import parse_price
    out = []
    for part in text.split(","):
        try:
            out.append(parse_price(part.strip()))
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{e} (several: IN/OUT,MODEL=IN/OUT)") from None
    return out


def check_prices_and_keys(kw: dict[str, Any]) -> None:
    """Before anything is spent: a cost limit needs a price for each model, and a hosted model
    a key; the fixes are worded as llm options (RLM's own preflight words them in Python)."""
    from recursa.core.preflight import target_of_spec
    spec, sub = kw["model"], kw["sub_model"]
    same = sub.partition(":")[0] == spec.partition(":")[0]
    targets = [target_of_spec(spec, base_url=kw["base_url"], api_key=bool(kw["api_key"]),
                              prices=kw.get("prices"))]
    if sub != spec:
        targets.append(target_of_spec(
            sub, base_url=kw["sub_base_url"] or (kw["base_url"] if same else None),
            api_key=bool(kw["sub_api_key"] or (kw["api_key"] if same else None)),
            prices=kw.get("prices")))
    problems = []
    for t in targets:
        if t.missing_key:
            stored = (f"`llm keys set {t.provider}` or " if t.provider in _KEYS else "")
            problems.append(f"{t.name}: no API key (set {t.missing_key}, or store one with "
                            f"{stored}`recursa keys set {t.provider}`)")
        cap = kw.get("max_cost_usd")
        if cap is not None and t.price is None:
            how = "IN/OUT" if t.name == spec else f"{t.name}=IN/OUT"
            problems.append(f"-o max_cost {cap:g} cannot be kept: recursa knows no price for "
                            f"{t.name}. Give one with -o price {how} (USD per 1M input/output "
                            "tokens), or drop -o max_cost")
    if problems:
        raise llm.ModelError("recursa: " + "; ".join(problems))


def wants_progress(asked: bool | None, stream: TextIO) -> bool:
    """`-o progress` when given, else whether `stream` is a terminal."""
    if asked is not None:
        return asked
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_view(asked: bool | None, stream: TextIO, kw: dict[str, Any]) -> Any:
    """recursa run's event view as it is where stderr is not a terminal: a line per root turn,
    plan and map event, and the status line (turn, sub-calls, tokens, spend, time, a map's
    done/total) at least every few seconds while nothing else was printed. Lines, not a live
    region: llm prints the answer to the same terminal when the run ends."""
    if not wants_progress(asked, stream):
        return None
    from rich.console import Console

    from recursa.frontend.options import LIMITS
    from recursa.obs.console import ConsoleView
    console = Console(file=stream, highlight=False, soft_wrap=True)
    return ConsoleView(console, budget={k: kw[k] for k in LIMITS if k in kw}, live=False)


def summary(res: Any) -> str:
    """The line `recursa run` ends with, and the way to price an unpriced model."""
    from recursa.obs.console import money
    tokens = sum(u.usage.total_tokens for u in res.usage.values())
    line = (f"recursa: status {res.status}  turns {res.turns}  sub-calls {res.subcalls}  "
            f"tokens {tokens:,}  {money(res.cost_usd)}  {res.elapsed_s:.1f}s"
            + (f"  trace {res.trace_path}" if res.trace_path else ""))
    if res.cost_usd is None:
        line += ("\nrecursa: cost ?: a model has no known price; give one with -o price IN/OUT "
                 "(USD per 1M tokens)")
    return line


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
