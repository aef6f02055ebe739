"""An RLM's settings as values: five typed groups and the `RLMConfig` that holds them.

    cfg = RLMConfig(models=ModelsConfig(model="openai:gpt-5", sub_model="openai:gpt-5-mini"),
                    budget=Budget(max_cost_usd=1.0), sandbox=SandboxConfig(kind="docker"))
    rlm = RLM(config=cfg)                     # or RLM(budget=Budget(...), sandbox=...)
    rlm = RLM(model="openai:gpt-5", max_cost_usd=1.0)    # flat keywords: the same config

Every keyword `RLM()` takes lands in exactly one group field (`FLAT`); a group validates its
fields once, whoever builds it (RLM, `recursa.frontend.options.RLMOptions`, the server, the bench, the
environments, the rlms compatibility layer), and a bad value is a `ConfigError` naming the
keyword and its field. A flat keyword may fill in a field a group given beside it left unset;
giving the same field two different values is a `ConfigError` (`replace` overrides instead).

| group (`RLMConfig.` field, class) | fields (flat keyword when it differs) |
|---|---|
| `models` (ModelsConfig) | model, sub_model, base_url, api_key, sub_base_url, sub_api_key, named (`models`), model_options, sub_model_options, client_options, prices, cache, cache_nondeterministic, concurrency |
| `sandbox` (SandboxConfig) | kind (`sandbox`), options (`sandbox_options`), max_output_chars |
| `budget` (recursa.core.budget.Budget) | max_iterations, max_depth, max_subcalls, max_tokens, max_cost_usd, max_seconds, cell_timeout, max_consecutive_errors |
| `tracing` (TracingConfig) | trace_dir, trace_path, on_event, sinks |
| `strategy` (StrategyConfig) | mode (`strategy`), route, route_threshold, tips, system_prompt, example, sources, sub_tools, last_turn_seconds, preflight, mcp_servers |

`RLMConfig.to_dict()` / `from_dict()` (and the JSON twins) carry what was set, for the server,
the bench and batch workers; API keys never go into them (give them again, or name their
variables in RLMOptions), and a field holding an object (a model client, a callback, a tool)
has no JSON form: saying so is an error, not a silent drop.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from recursa.base.types import Event, ModelClient, RecursaError, Sandbox, TraceSink
from recursa.core.budget import Budget

if TYPE_CHECKING:
    from recursa.core.tools import Tool, ToolSet
    from recursa.models.cache import ResponseCache
else:   # checked by the validators below; their modules load only when used
    Tool = ToolSet = ResponseCache = Any

__all__ = ["RLMConfig", "ModelsConfig", "SandboxConfig", "Budget", "TracingConfig",
           "StrategyConfig", "ConfigError", "FLAT", "GROUPS", "Setting"]


class ConfigError(RecursaError, ValueError):
    """A setting that cannot be used as given; the message names the keyword and its field."""


class _Group(BaseModel):
    """A frozen group of settings; unknown fields are refused, objects (clients, callbacks)
    are allowed where a field takes one."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True,
                              validate_default=False)


def _spec(v: Any, what: str) -> Any:
    """A model spec string (not checked here: aliases resolve in `ModelsConfig.resolved`) or a
    client object."""
    if v is None or not isinstance(v, str):
        return v
    if not v.strip():
        raise ValueError(f"{what} must be a model spec such as openai:gpt-5-mini, not ''")
    return v


def _options(v: Any, what: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} must be a dict, not {type(v).__name__}")
    return dict(v)


class ModelsConfig(_Group):
    """Which models answer, where, with which options and prices; how many calls at once."""

    model: str | ModelClient | None = None         # None: the default model (resolve_model)
    sub_model: str | ModelClient | None = None     # None: the root model
    base_url: str | None = None
    api_key: SecretStr | None = None
    sub_base_url: str | None = None                # None: base_url, for one provider
    sub_api_key: SecretStr | None = None           # None: api_key, for one provider
    named: dict[str, str | ModelClient] = Field(default_factory=dict)   # llm_query(model=name)
    model_options: dict[str, Any] = Field(default_factory=dict)
    sub_model_options: dict[str, Any] = Field(default_factory=dict)
    client_options: dict[str, Any] = Field(default_factory=dict)
    prices: dict[str, Any] = Field(default_factory=dict)   # {spec: Price | (in, out) | dict}
    cache: bool | str | os.PathLike[str] | ResponseCache | None = None
    cache_nondeterministic: bool = False
    concurrency: int = Field(32, ge=1)             # sub-calls in flight at once

    @field_validator("model", "sub_model", mode="plain")
    @classmethod
    def _check_spec(cls, v: Any, info: Any) -> Any:
        return _spec(v, info.field_name)

    @field_validator("named", mode="plain")
    @classmethod
    def _check_named(cls, v: Any) -> dict[str, Any]:
        return {str(k): _spec(s, f"models[{k!r}]") for k, s in _options(v, "models").items()}

    @field_validator("model_options", "sub_model_options", "client_options", "prices",
                     mode="plain")
    @classmethod
    def _check_dict(cls, v: Any, info: Any) -> dict[str, Any]:
        return _options(v, info.field_name)

    @field_validator("cache", mode="plain")
    @classmethod
    def _check_cache(cls, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str, os.PathLike)) or hasattr(v, "get"):
            return v
        raise ValueError(f"cache must be True, a path or a ResponseCache, not "
                         f"{type(v).__name__}")

    def resolved(self) -> ModelsConfig:
        """A copy with aliases and the default model replaced by their specs, every spec
        checked against the providers (so a typo fails at construction, not mid-run)."""
        from recursa.models import provider_for_spec, resolve_model

        def one(spec: Any) -> Any:
            if isinstance(spec, str):
                spec = resolve_model(spec)[0]
                provider_for_spec(spec)
            return spec

        update: dict[str, Any] = {"model": one(resolve_model(self.model)[0]
                                               if self.model is None else self.model)}
        if self.sub_model is not None:
            update["sub_model"] = one(self.sub_model)
        if self.named:
            update["named"] = {k: one(v) for k, v in self.named.items()}
        return self.model_copy(update=update)


class SandboxConfig(_Group):
    """Where model-written code runs and how much of its output the root sees per turn."""

    kind: str | Callable[[], Sandbox] = "local"    # a kind name, or a factory of Sandboxes
    options: dict[str, Any] = Field(default_factory=dict)
    max_output_chars: int = Field(8192, ge=256)

    @field_validator("kind", mode="plain")
    @classmethod
    def _check_kind(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip():
            return v
        if callable(v) and not isinstance(v, str):
            return v
        raise ValueError(f"sandbox must be a sandbox kind (local, docker, ...) or a function "
                         f"returning a Sandbox, not {v!r}")

    @field_validator("options", mode="plain")
    @classmethod
    def _check_options(cls, v: Any) -> dict[str, Any]:
        return _options(v, "sandbox_options")


class TracingConfig(_Group):
    """Where a run's events go: a trace file (or one per run in a directory), a callback,
    sinks."""

    trace_dir: Path | None = None
    trace_path: Path | None = None
    on_event: Callable[[Event], Any] | None = None
    sinks: tuple[TraceSink, ...] = ()

    @field_validator("sinks", mode="plain")
    @classmethod
    def _check_sinks(cls, v: Any) -> tuple[Any, ...]:
        sinks = tuple(v or ())
        for s in sinks:
            if not callable(getattr(s, "emit", None)):
                raise ValueError(f"a sink must have an emit(event) method; "
                                 f"{type(s).__name__} has none")
        return sinks


class StrategyConfig(_Group):
    """How the root works and what it is told: the mode, the route, its prompt's parts, the
    tools sub-models may call, the last-answer turn's time, the checks before a run."""

    mode: str = "auto"                     # auto | code | plan (recursa.core.strategy)
    route: str = "rlm"                     # rlm | direct | auto (recursa.core.route)
    route_threshold: int | None = None
    tips: str | None = None
    system_prompt: str | None = None
    example: bool = True
    sources: bool = False
    sub_tools: ToolSet | None = None
    last_turn_seconds: float | None = None
    preflight: bool = True
    # MCP servers whose allowed tools become REPL functions (recursa.core.mcp_tools.ServerConfig,
    # parsed here from a path or a dict, so a bad config fails when the RLM is made)
    mcp_servers: tuple[Any, ...] = ()

    @field_validator("mode", mode="plain")
    @classmethod
    def _check_mode(cls, v: Any) -> str:
        from recursa.core.strategy import check_strategy
        return check_strategy(v)

    @field_validator("route", mode="plain")
    @classmethod
    def _check_route(cls, v: Any) -> str:
        from recursa.core.route import check_route
        return check_route(v)

    @field_validator("route_threshold", mode="plain")
    @classmethod
    def _check_threshold(cls, v: Any) -> int | None:
        from recursa.core.route import check_threshold
        return check_threshold(v)

    @field_validator("last_turn_seconds")
    @classmethod
    def _check_last_turn(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("last_turn_seconds must be positive")
        return v

    @field_validator("mcp_servers", mode="plain")
    @classmethod
    def _check_mcp(cls, v: Any) -> tuple[Any, ...]:
        if v is None or (isinstance(v, list | tuple) and not v):
            return ()
        # the mcp SDK itself loads only when a run starts the servers
        from recursa.core.mcp_tools import load_servers
        return tuple(load_servers(v))

    @field_validator("sub_tools", mode="plain")
    @classmethod
    def _check_tools(cls, v: ToolSet | Sequence[Callable[..., Any] | Tool] | None
                     ) -> ToolSet | None:
        if not v:      # recursa.core.tools loads only for a run that has tools
            return None
        from recursa.core.tools import ToolSet
        return ToolSet.of(v)


GROUPS: dict[str, type[BaseModel]] = {"models": ModelsConfig, "sandbox": SandboxConfig,
                                      "budget": Budget, "tracing": TracingConfig,
                                      "strategy": StrategyConfig}

# every flat keyword RLM() takes -> (group, field)
FLAT: dict[str, tuple[str, str]] = {
    **{k: ("models", k) for k in ("model", "sub_model", "base_url", "api_key", "sub_base_url",
                                  "sub_api_key", "model_options", "sub_model_options",
                                  "client_options", "prices", "cache",
                                  "cache_nondeterministic", "concurrency")},
    "models": ("models", "named"),
    "sandbox": ("sandbox", "kind"), "sandbox_options": ("sandbox", "options"),
    "max_output_chars": ("sandbox", "max_output_chars"),
    **{k: ("budget", k) for k in Budget.model_fields},
    **{k: ("tracing", k) for k in ("trace_dir", "trace_path", "on_event", "sinks")},
    "strategy": ("strategy", "mode"),
    **{k: ("strategy", k) for k in ("route", "route_threshold", "tips", "system_prompt",
                                    "example", "sources", "sub_tools", "last_turn_seconds",
                                    "preflight", "mcp_servers")},
}
_KEYWORD = {where: k for k, where in FLAT.items()}
_SECRETS = {"api_key", "sub_api_key"}


def _set(group: BaseModel | None) -> dict[str, Any]:
    """The fields of `group` that were given (not left at their defaults)."""
    if group is None:
        return {}
    return {k: getattr(group, k) for k in group.model_fields_set}


def _plain(value: Any) -> Any:
    """`value` unwrapped for a comparison or a caller (SecretStr -> str)."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def _error(e: ValidationError, group: str) -> ConfigError:
    """pydantic's errors as one line that names the keyword and its field."""
    parts = []
    for d in e.errors():
        loc = [str(x) for x in d.get("loc", ())]
        field = loc[0] if loc else ""
        where = f"{group}.{'.'.join(loc)}" if loc else group
        kw = _KEYWORD.get((group, field))
        name = f"{kw} ({where})" if kw else where
        msg = str(d.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{name}: {msg}")
    return ConfigError("; ".join(parts))


def _validate(cls: type[BaseModel], group: str, data: Mapping[str, Any]) -> Any:
    try:
        return cls.model_validate(dict(data))
    except ValidationError as e:
        raise _error(e, group) from None


class RLMConfig(BaseModel):
    """Everything an RLM is configured with, in five groups (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    models: ModelsConfig = Field(default_factory=ModelsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    budget: Budget = Field(default_factory=Budget)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)

    KEYWORDS: ClassVar[dict[str, tuple[str, str]]] = FLAT

    @field_validator("budget", mode="before")
    @classmethod
    def _strict_budget(cls, v: Any) -> Any:
        """Budget ignores unknown keys; a config refuses them like the other groups."""
        if isinstance(v, Mapping):
            unknown = set(v) - set(Budget.model_fields)
            if unknown:
                raise ValueError(f"unknown limit(s): {', '.join(sorted(unknown))}")
        return v

    # ------------------------------------------------------------ building
    @classmethod
    def build(cls, config: RLMConfig | None = None, *,
              groups: Mapping[str, BaseModel | None] | None = None,
              override: bool = False, **flat: Any) -> RLMConfig:
        """`config`, with whole `groups` ({"budget": Budget(...), ...}) and `flat` keywords
        (None: not given) merged in. A flat keyword fills in what its group left unset; one
        that gives a set field another value is a ConfigError, unless `override` (then a
        keyword given as None puts its field back to the default)."""
        unknown = set(flat) - set(FLAT)
        if unknown:
            raise TypeError(f"RLM() got unknown option(s): {', '.join(sorted(unknown))}")
        given = {k: v for k, v in (groups or {}).items() if v is not None}
        out: dict[str, Any] = {}
        for name, gcls in GROUPS.items():
            base: BaseModel | None = getattr(config, name) \
                if config is not None and name in config.model_fields_set else None
            if name in given:
                group = given[name]
                if not isinstance(group, gcls):
                    raise ConfigError(f"{name} must be a {gcls.__name__}, not "
                                      f"{type(group).__name__}")
                if base is not None and base != group and not override:
                    raise ConfigError(f"{name} is given twice, as config.{name} and as "
                                      f"{name}={gcls.__name__}(...); give it once")
                base = group.model_copy() if name == "budget" else group   # not frozen
            mine = {FLAT[k][1]: v for k, v in flat.items() if FLAT[k][0] == name}
            updates = {f: v for f, v in mine.items() if v is not None}
            reset = {f for f, v in mine.items() if v is None} if override else set()
            kept = {f: v for f, v in _set(base).items() if f not in reset}
            if not updates and not (reset & set(_set(base))):
                if base is not None:
                    out[name] = base
                continue
            fresh = _validate(gcls, name, updates)    # the flat values, checked
            if not override:
                for f in updates:
                    if f in kept and _plain(kept[f]) != _plain(getattr(fresh, f)):
                        raise ConfigError(
                            f"{_KEYWORD[(name, f)]}={_plain(getattr(fresh, f))!r} conflicts "
                            f"with {name}.{f}={_plain(kept[f])!r} given in the {name} group; "
                            f"give it once (or use RLMConfig.replace to override)")
            out[name] = _validate(gcls, name, {**kept, **_set(fresh)})
        return cls(**out)

    def replace(self, **flat: Any) -> RLMConfig:
        """A copy with `flat` keywords (as RLM() takes them) set, overriding what was set;
        a keyword given as None goes back to its default."""
        return RLMConfig.build(self, override=True, **flat)

    def with_groups(self, **groups: BaseModel) -> RLMConfig:
        """A copy with whole groups replaced."""
        return RLMConfig.build(self, groups=groups, override=True)

    def kwargs(self) -> dict[str, Any]:
        """The set fields as flat keywords, as RLM() takes them (API keys included, plain)."""
        out: dict[str, Any] = {}
        for kw, (group, f) in FLAT.items():
            g = getattr(self, group)
            if f in g.model_fields_set:
                value = _plain(getattr(g, f))
                out[kw] = list(value) if f == "sinks" else value
        return out

    # ------------------------------------------------------------ plain data
    def to_dict(self) -> dict[str, Any]:
        """What was set, as JSON-ready data (no API keys); ConfigError for a field holding an
        object, such as a model client or a callback."""
        out: dict[str, Any] = {}
        for name in GROUPS:
            group: BaseModel = getattr(self, name)
            keep = group.model_fields_set - _SECRETS
            for f in sorted(keep):
                _check_plain(getattr(group, f), f"{name}.{f}")
            data = group.model_dump(mode="json", include=keep)
            if data:
                out[name] = data
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLMConfig:
        """An RLMConfig from `to_dict()`'s shape; bad or unknown fields are a ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a config must be a dict of groups, not {type(data).__name__}")
        unknown = set(data) - set(GROUPS)
        if unknown:
            raise ConfigError(f"unknown config group(s): {', '.join(sorted(unknown))} "
                              f"(the groups are {', '.join(GROUPS)})")
        groups = {}
        for name, part in data.items():
            if not isinstance(part, Mapping):
                raise ConfigError(f"{name} must be a dict of fields, not {type(part).__name__}")
            if name == "budget":
                try:
                    cls._strict_budget(part)
                except ValueError as e:
                    raise ConfigError(f"budget: {e}") from None
            groups[name] = _validate(GROUPS[name], name, part)
        return cls(**groups)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> RLMConfig:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"a config must be JSON: {e}") from None
        return cls.from_dict(data)


def _check_plain(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, int, float, str, Path)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_plain(v, where)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{where}: a key {k!r} has no JSON form")
            _check_plain(v, where)
        return
    if isinstance(value, os.PathLike):
        return
    raise ConfigError(f"{where} holds a {type(value).__name__}, which has no JSON form; "
                      f"give a spec, name or path there (or leave it out of the saved config)")


# ---------------------------------------------------------------- RLM's flat attributes
T = TypeVar("T")


class Setting(Generic[T]):
    """A flat attribute of an object with a `config: RLMConfig` (RLM), read from and written
    to its group field: `rlm.strategy = "plan"` is `rlm.config = rlm.config.replace(...)`,
    validated as at construction."""

    def __init__(self, keyword: str):
        self.keyword = keyword
        self.group, self.field = FLAT[keyword]

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = _plain(getattr(getattr(obj.config, self.group), self.field))   # type: ignore[attr-defined]
        return list(value) if self.field == "sinks" else value

    def __set__(self, obj: object, value: T) -> None:
        config: RLMConfig = obj.config    # type: ignore[attr-defined]
        obj.config = config.replace(**{self.keyword: value})   # type: ignore[attr-defined]
