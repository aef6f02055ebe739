"""One set of model, endpoint, limit and sandbox options for every front end.

`recursa run`, `bench run`, `ablate`, `serve` and `mcp` all take these options with the same
names, defaults and help, from one table:

    RLMOptions.add_to(parser)            # the flags
    opts = RLMOptions.from_args(ns)      # back from argparse
    cfg = opts.config()                  # the RLM's typed settings (recursa.core.config)
    rlm = opts.build(trace_path=...)     # RLM(config=cfg, trace_path=...)

Bounds are checked while parsing, so `--max-iterations 0` is an argparse error in plain words.
This module imports only the standard library (and recursa.sandbox.kinds, which does too):
building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from recursa.sandbox.kinds import BUILTIN as SANDBOX_KINDS
from recursa.sandbox.kinds import BUILTIN_NAMES as SANDBOXES  # recursa's own kinds

if TYPE_CHECKING:
    from recursa.core.config import RLMConfig

# RLM's own limits (recursa.core.budget.Budget fields) among the options
LIMITS = ("max_iterations", "max_depth", "max_subcalls", "max_tokens", "max_cost_usd",
          "max_seconds", "cell_timeout")


class OptionError(ValueError):
    """An option that cannot be used as given (a key variable that is not set, ...)."""


# ---------------------------------------------------------------- value parsers
def _number(kind: type, low: float, *, above: bool = False) -> Callable[[str], Any]:
    """An argparse type: an int or float of at least `low` (more than `low` when `above`)."""
    word = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {word}, got {text!r}") from None
        if value < low or (above and value == low):
            bound = f"more than {low:g}" if above else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_price(text: str) -> tuple[str | None, float, float]:
    """'[MODEL=]IN/OUT' (USD per 1M input / output tokens) -> (model or None, in, out)."""
    model, sep, pair = text.rpartition("=")
    if not sep:
        model, pair = "", text
    a, slash, b = pair.partition("/")
    try:
        pin, pout = float(a), float(b)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected IN/OUT in USD per 1M tokens, e.g. 0.5/1.5 (optionally MODEL=0.5/1.5), "
            f"got {text!r}") from None
    if not slash or pin < 0 or pout < 0:
        raise argparse.ArgumentTypeError(f"expected two prices >= 0 as IN/OUT, got {text!r}")
    return (model.strip() or None), pin, pout


# ---------------------------------------------------------------- the table
@dataclass(frozen=True)
class Opt:
    dest: str
    flags: tuple[str, ...]
    help: str
    kw: dict[str, Any] = field(default_factory=dict)      # type, choices, metavar, nargs...
    aliases: tuple[str, ...] = ()                          # old spellings, hidden from --help


def _sandbox_kind(text: str) -> str:
    """An argparse type: a sandbox kind recursa or an installed package provides (other
    packages' kinds are looked up only for a name that is not recursa's own)."""
    if text in SANDBOXES:
        return text
    from recursa.sandbox.kinds import kind_names, sandbox_kind
    if sandbox_kind(text) is None:
        raise argparse.ArgumentTypeError(f"unknown sandbox kind {text!r} (choose from "
                                         f"{', '.join(kind_names())})")
    return text


_int1, _int0 = _number(int, 1), _number(int, 0)
_pos = _number(float, 0, above=True)


def _sandbox_help(default: str) -> str:
    """--sandbox's help: recursa's own kinds as their registry entries describe them (other
    packages' kinds are not read while building a parser)."""
    kinds = ", ".join(f"{k.name} ({'default: ' if k.name == default else ''}{k.description})"
                      for k in SANDBOX_KINDS)
    return f"where model-written code runs: {kinds}, or a kind an installed package adds"


OPTIONS: tuple[Opt, ...] = (
    Opt("model", ("--model",), "root model spec, e.g. openai:gpt-5-mini, anthropic:claude-"
        "sonnet-4-5, ollama:llama3.2, local:qwen2.5-coder-1.5b, or an alias (default: "
        "RECURSA_MODEL, else `recursa models default`, else from the API keys set, else "
        "local)", {"metavar": "SPEC"}),
    Opt("sub_model", ("--sub-model",), "model for sub-calls (default: the root model)",
        {"metavar": "SPEC"}),
    Opt("base_url", ("--base-url",), "endpoint of the model, e.g. http://127.0.0.1:8000/v1 for "
        "an OpenAI-compatible server (default: the provider's)", {"metavar": "URL"}),
    Opt("sub_base_url", ("--sub-base-url",), "endpoint of the sub-model (default: --base-url "
        "when both models use one provider)", {"metavar": "URL"}),
    Opt("api_key_env", ("--api-key-env",), "environment variable holding the model's API key "
        "(keys never go on the command line, where `ps` shows them)", {"metavar": "NAME"}),
    Opt("sub_api_key_env", ("--sub-api-key-env",), "environment variable holding the "
        "sub-model's key (default: as --api-key-env for one provider)", {"metavar": "NAME"}),
    Opt("sandbox", ("--sandbox",), _sandbox_help("local"),
        {"type": _sandbox_kind, "default": "local", "metavar": "KIND"}),
    Opt("max_iterations", ("--max-iterations",), "root turns per RLM (default 30)",
        {"type": _int1, "metavar": "N"}),
    Opt("max_depth", ("--max-depth",), "depth of rlm_query; at the limit it is a plain model "
        "call (default 1)", {"type": _int0, "metavar": "N"}),
    Opt("max_subcalls", ("--max-subcalls",), "sub-model calls across the whole run (default: "
        "no limit)", {"type": _int0, "metavar": "N"}),
    Opt("max_tokens", ("--max-tokens",), "input + output tokens across the whole run "
        "(default: no limit)", {"type": _int1, "metavar": "N"}),
    Opt("max_cost_usd", ("--max-cost",), "USD across the whole run; needs a price for every "
        "model (see --price) (default: no limit)",
        {"type": _number(float, 0), "metavar": "USD"}, aliases=("--max-cost-usd",)),
    Opt("max_seconds", ("--max-seconds",), "wall time of the run (default: no limit)",
        {"type": _pos, "metavar": "S"}),
    Opt("cell_timeout", ("--cell-timeout",), "seconds of code time per REPL cell (default 120)",
        {"type": _pos, "metavar": "S"}),
    Opt("subcall_concurrency", ("--subcall-concurrency",), "sub-calls in flight at once within "
        "one run (default 32)", {"type": _int1, "default": 32, "metavar": "N"},
        aliases=("--concurrency",)),
    Opt("max_output_chars", ("--max-output-chars",), "REPL output shown to the model per turn "
        "(default 8192)", {"type": _number(int, 256), "default": 8192, "metavar": "N"}),
    Opt("max_answer_tokens", ("--max-answer-tokens",), "output cap of every model reply "
        "(default: the client's)", {"type": _int1, "metavar": "N"}),
    Opt("temperature", ("--temperature",), "sampling temperature of every model call "
        "(default: the provider's)", {"type": _number(float, 0), "metavar": "T"}),
    Opt("n_ctx", ("--n-ctx",), "local: models only: context window to load, in tokens "
        "(default: the model's)", {"type": _number(int, 256), "metavar": "N"}),
    Opt("prices", ("--price",), "price of a model without a built-in one, USD per 1M input/"
        "output tokens: IN/OUT for --model (and --sub-model if not given), MODEL=IN/OUT for "
        "another; repeatable", {"type": parse_price, "action": "append",
                                "metavar": "[MODEL=]IN/OUT"}),
    Opt("strategy", ("--strategy",), "how the root works: auto (the default: plan for small "
        "root models such as a local one, code for large ones), code (free-form code) or plan "
        "(it fills a typed plan the runtime runs with a known bound first)",
        {"choices": ("auto", "code", "plan"), "default": "auto", "metavar": "MODE"}),
    Opt("route", ("--route",), "which inputs run the REPL loop: rlm (the default: all), direct "
        "(none: one plain model call with the context in the prompt) or auto (direct when the "
        "prompt plus the reply fits --route-threshold, else the loop)",
        {"choices": ("rlm", "direct", "auto"), "default": "rlm", "metavar": "MODE"}),
    Opt("route_threshold", ("--route-threshold",), "--route auto: the most tokens (prompt + "
        "reply reserve) that go direct (default: half the root model's window when it declares "
        "one, as local: models do, else 8192)", {"type": _int1, "metavar": "TOKENS"}),
    Opt("cache", ("--cache",), "cache model replies, in the default cache file or (written "
        "--cache=PATH) in PATH; off unless given",
        {"nargs": "?", "const": True, "metavar": "PATH"}),
    Opt("cache_nondeterministic", ("--cache-nondeterministic",), "with --cache: cache sampled "
        "replies too (by default only calls at --temperature 0 or with a seed are cached, as "
        "a sampled reply is one draw of many)", {"action": "store_true", "default": None}),
)
_BY_DEST = {o.dest: o for o in OPTIONS}


# ---------------------------------------------------------------- the options
@dataclass
class RLMOptions:
    """The values of the shared options; `None` means "the library's default"."""

    model: str | None = None
    sub_model: str | None = None
    base_url: str | None = None
    sub_base_url: str | None = None
    api_key_env: str | None = None
    sub_api_key_env: str | None = None
    sandbox: str = "local"
    max_iterations: int | None = None
    max_depth: int | None = None
    max_subcalls: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None
    cell_timeout: float | None = None
    subcall_concurrency: int = 32
    max_output_chars: int = 8192
    max_answer_tokens: int | None = None
    temperature: float | None = None
    n_ctx: int | None = None
    prices: list[tuple[str | None, float, float]] | None = None
    cache: bool | str | None = None
    cache_nondeterministic: bool | None = None
    strategy: str = "auto"
    route: str = "rlm"
    route_threshold: int | None = None

    # ------------------------------------------------------------ argparse
    @staticmethod
    def add_to(parser: argparse.ArgumentParser, *, exclude: Sequence[str] = (),
               defaults: Mapping[str, Any] | None = None,
               skip_aliases: Sequence[str] = ()) -> None:
        """Add the shared options (minus `exclude`, by dest) to `parser`, in two groups.
        `defaults` overrides a default (front ends should rarely need it); `skip_aliases`
        leaves out an old spelling the front end uses for something of its own."""
        groups = {"model": parser.add_argument_group("model and endpoint"),
                  "limits": parser.add_argument_group("limits (across the whole run)"),
                  "run": parser.add_argument_group("run")}
        for o in OPTIONS:
            if o.dest in exclude:
                continue
            kw = dict(o.kw)
            if defaults and o.dest in defaults:
                kw["default"] = defaults[o.dest]
            group = groups["limits" if o.dest in LIMITS else
                           "model" if o.dest in _MODEL_DESTS else "run"]
            group.add_argument(*o.flags, dest=o.dest, help=o.help, **kw)
            hidden = [a for a in o.aliases if a not in skip_aliases]
            if hidden:
                kw.pop("default", None)
                group.add_argument(*hidden, dest=o.dest, help=argparse.SUPPRESS,
                                   default=argparse.SUPPRESS, **kw)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RLMOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLMOptions:
        d = dict(data)
        if d.get("prices"):
            d["prices"] = [tuple(p) for p in d["prices"]]
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (no secrets: keys are named by variable, read in `rlm_kwargs`)."""
        return asdict(self)

    @staticmethod
    def help_of(dest: str) -> str:
        return _BY_DEST[dest].help

    # ------------------------------------------------------------ what RLM takes
    def limits(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in LIMITS if getattr(self, k) is not None}

    def with_default_model(self, say: Callable[[str], Any] | None = None) -> RLMOptions:
        """A copy with `model` filled in as `recursa run` picks it, saying why via `say`, and
        aliases (`recursa aliases`) replaced by their specs."""
        from recursa.models import resolve_model
        spec, reason = resolve_model(self.model)
        if reason and say:
            say(f"no --model given: using {spec} ({reason})")
        sub = resolve_model(self.sub_model)[0] if self.sub_model else None
        return RLMOptions(**{**asdict(self), "model": spec, "sub_model": sub})

    def model_specs(self) -> list[str]:
        return [s for s in dict.fromkeys((self.model, self.sub_model)) if s]

    def price_table(self) -> dict[str, tuple[float, float]]:
        """{model spec: (in, out)}; a bare IN/OUT prices --model, and --sub-model when it
        is not given (one model does both)."""
        out: dict[str, tuple[float, float]] = {}
        for model, pin, pout in self.prices or []:
            if model is None:
                if not self.model:
                    raise OptionError("--price IN/OUT prices --model; give --model too, or "
                                      "name the model: --price MODEL=IN/OUT")
                out[self.model] = (pin, pout)
            else:
                out[model] = (pin, pout)
        return out

    def api_keys(self) -> tuple[str | None, str | None]:
        """The keys --api-key-env / --sub-api-key-env name, read from the environment."""
        keys: list[str | None] = []
        for flag, name in (("--api-key-env", self.api_key_env),
                           ("--sub-api-key-env", self.sub_api_key_env)):
            if not name:
                keys.append(None)
                continue
            value = os.environ.get(name)
            if not value:
                raise OptionError(f"{flag} {name}: that environment variable is not set")
            keys.append(value)
        return keys[0], keys[1]

    def model_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if self.max_answer_tokens is not None:
            opts["max_tokens"] = self.max_answer_tokens
        if self.temperature is not None:
            opts["temperature"] = self.temperature
        return opts

    def client_options(self) -> dict[str, Any]:
        if self.n_ctx is None:
            return {}
        others = [s for s in self.model_specs() if not s.startswith(("local:", "replay"))]
        if others:
            raise OptionError(f"--n-ctx sets a local: model's window; {others[0]} is not one")
        return {"n_ctx": self.n_ctx}

    def config(self) -> RLMConfig:
        """These options as the RLM's typed settings (recursa.core.config), validated there;
        a value left at None is left to the library's default (unset in the config)."""
        from recursa.core.config import RLMConfig
        if self.cache_nondeterministic and not self.cache:
            raise OptionError("--cache-nondeterministic says what --cache keeps: give --cache too")
        key, sub_key = self.api_keys()
        reply = self.model_options()
        return RLMConfig.build(     # RLM's keywords; None: not given
            model=self.model, sub_model=self.sub_model, base_url=self.base_url,
            sub_base_url=self.sub_base_url, api_key=key, sub_api_key=sub_key,
            model_options=reply or None, sub_model_options=reply or None,
            client_options=self.client_options() or None, prices=self.price_table() or None,
            cache=self.cache, cache_nondeterministic=self.cache_nondeterministic,
            concurrency=self.subcall_concurrency, sandbox=self.sandbox,
            max_output_chars=self.max_output_chars, strategy=self.strategy,
            route=None if self.route == "rlm" else self.route,
            route_threshold=self.route_threshold, **self.limits())

    def rlm_kwargs(self) -> dict[str, Any]:
        """`config()` as keyword arguments for `RLM(...)`."""
        return self.config().kwargs()

    def build(self, **extra: Any) -> Any:
        """An RLM from these options; `extra` (trace_path, sinks, on_event...) may set what
        the options leave unset (a value the options set is a ConfigError: change them)."""
        from recursa.core.rlm import RLM
        return RLM(config=self.config(), **extra)


_MODEL_DESTS = {"model", "sub_model", "base_url", "sub_base_url", "api_key_env",
                "sub_api_key_env", "prices"}


def query_and_cache(query: str | None, cache: bool | str | None
                    ) -> tuple[str | None, bool | str | None]:
    """The question and `--cache` as meant. `--cache` takes an optional PATH, so in `recursa run
    --cache "What is X?" --context f` it takes the question as its file. When the question is
    missing and `--cache` holds one (words with a space, or ending in "?", and no file of that
    name), it is the question and the cache is on in its default file; any other value there is
    an error that names both readings. `--cache=PATH` after the question is never ambiguous."""
    if query is not None or not isinstance(cache, str):
        return query, cache
    text = cache.strip()
    if text and (len(text.split()) > 1 or text.endswith("?")) and not os.path.exists(cache):
        return cache, True
    raise OptionError(f"no QUERY given: --cache took {cache!r} as its cache file. Put the "
                      "question first (recursa run QUESTION --cache=PATH ...); if "
                      f"{cache!r} is the question, put --cache after it")


def plain_error(e: BaseException) -> str:
    """An exception as one line for a user: pydantic's errors without their URLs."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', ()))}: {d.get('msg')}"
                             .lstrip(": ") for d in errors())
        except Exception:
            pass
    return str(e)


def options_table() -> str:
    """The Markdown table of the shared options (docs/cli.md is checked against it)."""
    rows = ["| option | meaning |", "|---|---|"]
    for o in OPTIONS:
        meta = o.kw.get("metavar")
        if meta:
            meta = f"[{meta}]" if o.kw.get("nargs") == "?" else meta
        flag = o.flags[0] + (f" {meta}" if meta else "")
        rows.append(f"| `{flag}` | {o.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
