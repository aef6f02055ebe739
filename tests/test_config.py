"""RLM's settings as typed groups (recursa.core.config): every flat keyword lands in one group
field, groups and keywords combine or conflict clearly, and a config survives JSON."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from recursa import RLM, Budget
from recursa.core.config import (
    FLAT,
    GROUPS,
    ConfigError,
    ModelsConfig,
    RLMConfig,
    SandboxConfig,
    StrategyConfig,
    TracingConfig,
)
from recursa.core.tools import ToolSet
from recursa.frontend.options import RLMOptions
from recursa.models.replay import ReplayClient

SPEC = "openai:gpt-4o-mini"      # built lazily: no key or network is needed to construct


def lookup(name: str) -> str:
    """Look a name up."""
    return name


class Sink:
    def emit(self, event: Any) -> None:
        pass

    def close(self) -> None:
        pass


def on_event(event: Any) -> None:
    pass


def factory() -> Any:
    raise AssertionError("not called")


# a value for every flat keyword, and what its field holds afterwards (when it differs)
SAMPLES: dict[str, tuple[Any, Any]] = {
    "model": ("openai:gpt-5", "openai:gpt-5"),
    "sub_model": ("openai:gpt-5-mini", "openai:gpt-5-mini"),
    "base_url": ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
    "api_key": ("sk-root", "sk-root"),
    "sub_base_url": ("http://127.0.0.1:8/v1", "http://127.0.0.1:8/v1"),
    "sub_api_key": ("sk-sub", "sk-sub"),
    "models": ({"small": "openai:gpt-5-nano"}, {"small": "openai:gpt-5-nano"}),
    "model_options": ({"temperature": 0.5}, {"temperature": 0.5}),
    "sub_model_options": ({"max_tokens": 64}, {"max_tokens": 64}),
    "client_options": ({"timeout": 5}, {"timeout": 5}),
    "prices": ({SPEC: (0.1, 0.2)}, {SPEC: (0.1, 0.2)}),
    "cache": ("cache.sqlite", "cache.sqlite"),
    "cache_nondeterministic": (True, True),
    "concurrency": (4, 4),
    "sandbox": ("inprocess", "inprocess"),
    "sandbox_options": ({"memory_mb": 512}, {"memory_mb": 512}),
    "max_output_chars": (1000, 1000),
    "max_iterations": (3, 3), "max_depth": (2, 2), "max_subcalls": (7, 7),
    "max_tokens": (1000, 1000), "max_cost_usd": (0.5, 0.5), "max_seconds": (60.0, 60.0),
    "cell_timeout": (9.0, 9.0), "max_consecutive_errors": (2, 2),
    "trace_dir": ("traces", Path("traces")),
    "trace_path": ("t.jsonl", Path("t.jsonl")),
    "on_event": (on_event, on_event),
    "sinks": ([Sink()], None),
    "tips": ("be brief", "be brief"),
    "system_prompt": ("You are {x}", "You are {x}"),
    "example": (False, False),
    "sources": (True, True),
    "sub_tools": ([lookup], None),
    "last_turn_seconds": (5.0, 5.0),
    "preflight": (False, False),
    "strategy": ("plan", "plan"),
    "route": ("auto", "auto"),
    "route_threshold": (2048, 2048),
    "mcp_servers": ({"db": {"command": "srv", "allow": ["q"]}}, None),
}
GROUP_KEYWORDS = {"config", "budget", "tracing"}     # take only a group


def flat_keywords() -> list[str]:
    """The keywords RLM() takes, from its signature (and Budget's fields for **limits)."""
    params = inspect.signature(RLM.__init__).parameters
    names = [p for p in params if p not in ("self", "limits") and p not in GROUP_KEYWORDS]
    return names + list(Budget.model_fields)


def test_every_keyword_of_rlm_has_one_group_field_and_a_sample() -> None:
    keywords = flat_keywords()
    assert sorted(keywords) == sorted(FLAT), "a keyword of RLM() without a group (or a stale " \
        "row in recursa.core.config.FLAT)"
    assert sorted(SAMPLES) == sorted(FLAT)
    fields = list(FLAT.values())
    assert len(set(fields)) == len(fields), "two keywords share a field"
    for group, field in fields:
        assert field in GROUPS[group].model_fields


@pytest.mark.parametrize("keyword", flat_keywords())
def test_a_flat_keyword_lands_in_its_group_field(keyword: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)         # cache.sqlite, traces
    value, expected = SAMPLES[keyword]
    kw = {"model": SPEC, "sandbox": "inprocess", keyword: value}
    rlm = RLM(**kw)
    group, field = FLAT[keyword]
    held = getattr(getattr(rlm.config, group), field)
    if keyword in ("api_key", "sub_api_key"):
        assert held.get_secret_value() == value and value not in repr(rlm.config)
    elif keyword == "sinks":
        assert held == tuple(value) and rlm.sinks == value
    elif keyword == "sub_tools":
        assert isinstance(held, ToolSet) and held.names == ["lookup"]
    elif keyword == "mcp_servers":      # parsed when the RLM is made (recursa.core.mcp_tools)
        assert [(s.name, s.command, s.allow) for s in held] == [("db", "srv", ("q",))]
    else:
        assert held == expected
    # the field counts as given (to_dict keeps it; a second value for it conflicts)
    assert field in getattr(rlm.config, group).model_fields_set
    # and the flat attribute reads the group (cache: the opened store, not the spec)
    if keyword != "cache":
        attr = getattr(rlm.budget if group == "budget" else rlm, keyword)
        assert attr == (value if keyword not in ("trace_dir", "trace_path", "sub_tools",
                                                 "mcp_servers") else held)


def test_a_whole_group_or_the_config_builds_the_same_rlm() -> None:
    flat = RLM(model=SPEC, sandbox="inprocess", max_iterations=4, strategy="code",
               trace_dir="tr", max_output_chars=2000)
    grouped = RLM(models=ModelsConfig(model=SPEC),
                  sandbox=SandboxConfig(kind="inprocess", max_output_chars=2000),
                  budget=Budget(max_iterations=4), strategy=StrategyConfig(mode="code"),
                  tracing=TracingConfig(trace_dir=Path("tr")))
    whole = RLM(config=RLMConfig(models=ModelsConfig(model=SPEC),
                                 sandbox=SandboxConfig(kind="inprocess", max_output_chars=2000),
                                 budget=Budget(max_iterations=4),
                                 strategy=StrategyConfig(mode="code"),
                                 tracing=TracingConfig(trace_dir=Path("tr"))))
    assert flat.config == grouped.config == whole.config
    assert whole.budget.max_iterations == 4 and whole.sandbox == "inprocess"
    assert whole.max_output_chars == 2000 and whole.strategy == "code"


def test_a_keyword_fills_in_what_its_group_left_unset() -> None:
    rlm = RLM(model=SPEC, sandbox="inprocess", budget=Budget(max_iterations=4), max_depth=2)
    assert (rlm.budget.max_iterations, rlm.budget.max_depth) == (4, 2)
    cfg = RLMConfig(budget=Budget(max_iterations=4))
    rlm = RLM(config=cfg, model=SPEC, sandbox="inprocess", trace_dir="x", max_iterations=4)
    assert rlm.budget.max_iterations == 4 and rlm.trace_dir == Path("x")   # same value: fine


@pytest.mark.parametrize("kw, needle", [
    (dict(budget=Budget(max_iterations=4), max_iterations=5),
     "max_iterations=5 conflicts with budget.max_iterations=4"),
    (dict(config=RLMConfig(strategy=StrategyConfig(mode="plan")), strategy="code"),
     "strategy='code' conflicts with strategy.mode='plan'"),
    (dict(config=RLMConfig(budget=Budget(max_depth=2)), budget=Budget(max_depth=3)),
     "budget is given twice"),
    (dict(sandbox=SandboxConfig(kind="docker"), config=RLMConfig(
        sandbox=SandboxConfig(kind="inprocess"))), "sandbox is given twice"),
])
def test_two_values_for_one_field_is_a_clear_error(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match="give it once") as e:
        RLM(model=SPEC, **kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("kw, needle", [
    (dict(max_iterations=0), "max_iterations (budget.max_iterations): Input should be greater"),
    (dict(strategy="fast"), "strategy (strategy.mode): strategy must be one of"),
    (dict(route="fast"), "route must be one of rlm, direct, auto"),
    (dict(max_output_chars=100), "max_output_chars (sandbox.max_output_chars)"),
    (dict(concurrency=0), "concurrency (models.concurrency)"),
    (dict(sandbox_options=[1]), "sandbox_options (sandbox.options): sandbox_options must be "
     "a dict"),
    (dict(sinks=[object()]), "a sink must have an emit(event) method"),
    (dict(sandbox=""), "sandbox must be a sandbox kind"),
    (dict(model="nosuchprovider:x"), "nosuchprovider"),
])
def test_a_bad_value_names_its_keyword_and_field(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        RLM(**{"model": SPEC, "sandbox": "inprocess", **kw})
    assert needle in str(e.value)


def test_unknown_keywords_and_groups_are_refused() -> None:
    with pytest.raises(TypeError, match="unknown option"):
        RLM(model=SPEC, max_iteration=3)
    with pytest.raises(ConfigError, match="unknown config group"):
        RLMConfig.from_dict({"limits": {}})
    with pytest.raises(ConfigError, match="unknown limit"):
        RLMConfig.from_dict({"budget": {"max_iteratons": 3}})
    with pytest.raises(ConfigError, match="Extra inputs"):
        RLMConfig.from_dict({"sandbox": {"image": "x"}})
    with pytest.raises(ConfigError, match="must be a Budget"):
        RLMConfig.build(groups={"budget": {"max_iterations": 3}})   # type: ignore[dict-item]


def test_attributes_write_through_to_the_config_and_are_validated() -> None:
    rlm = RLM(model=SPEC, sandbox="inprocess")
    rlm.strategy, rlm.sources, rlm.route_threshold = "plan", True, 100
    assert (rlm.config.strategy.mode, rlm.config.strategy.sources) == ("plan", True)
    assert rlm.config.strategy.route_threshold == 100
    with pytest.raises(ConfigError, match="route must be one of"):
        rlm.route = "sideways"
    rlm.on_event = on_event
    assert rlm.config.tracing.on_event is on_event
    rlm.on_event = None
    assert rlm.on_event is None
    assert rlm.sub_model == SPEC        # the root's, when none is named
    rlm.sub_model = "openai:gpt-5-nano"
    assert rlm.sub_model == "openai:gpt-5-nano" and rlm.model == SPEC


def test_round_trip_through_json_keeps_what_was_set_and_no_keys() -> None:
    cfg = RLMOptions(model=SPEC, sandbox="inprocess", max_iterations=6, max_cost_usd=0.25,
                     strategy="plan", route="auto", route_threshold=4096, temperature=0.2,
                     prices=[(None, 0.1, 0.4)], subcall_concurrency=3).config()
    cfg = cfg.replace(api_key="sk-secret", trace_dir="runs", tips="count twice",
                      models={"small": "openai:gpt-5-nano"})
    text = cfg.to_json()
    assert "sk-secret" not in text
    data = json.loads(text)
    assert data["budget"] == {"max_iterations": 6, "max_cost_usd": 0.25}
    assert data["tracing"] == {"trace_dir": "runs"}
    back = RLMConfig.from_json(text)
    # equal but for the key and JSON's list for the price tuple
    assert back == cfg.replace(api_key=None, prices={SPEC: [0.1, 0.4]})
    assert back.models.prices == {SPEC: [0.1, 0.4]}      # JSON has lists; prices take them
    assert RLM(config=back).config.models.prices == {SPEC: [0.1, 0.4]}
    assert RLMConfig.from_dict(back.to_dict()).to_dict() == back.to_dict()


def test_an_object_in_a_field_has_no_json_form_and_says_where() -> None:
    client = ReplayClient([], name="replay:x")
    with pytest.raises(ConfigError, match=r"models.model holds a ReplayClient"):
        RLMConfig.build(model=client).to_dict()
    with pytest.raises(ConfigError, match=r"tracing.on_event holds a function"):
        RLMConfig.build(on_event=on_event).to_dict()
    with pytest.raises(ConfigError, match="must be JSON"):
        RLMConfig.from_json("{")


def test_replace_overrides_and_none_goes_back_to_the_default() -> None:
    cfg = RLMConfig.build(model=SPEC, sub_model="openai:gpt-5-nano", max_iterations=4)
    again = cfg.replace(max_iterations=9, sub_model=None)
    assert again.budget.max_iterations == 9 and again.models.sub_model is None
    assert again.models.model == SPEC and cfg.budget.max_iterations == 4
    assert cfg.kwargs() == {"model": SPEC, "sub_model": "openai:gpt-5-nano",
                            "max_iterations": 4}


def test_the_rlm_keeps_its_own_copy_of_a_budget() -> None:
    b = Budget(max_iterations=4)
    rlm = RLM(model=SPEC, sandbox="inprocess", budget=b)
    b.max_iterations = 20
    assert rlm.budget.max_iterations == 4


def test_the_default_model_is_resolved_into_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECURSA_MODEL", SPEC)
    rlm = RLM(sandbox="inprocess")
    assert rlm.model == SPEC == rlm.config.models.model


def test_options_build_a_config_that_rlm_takes() -> None:
    opts = RLMOptions(model=SPEC, sandbox="inprocess", max_iterations=3, max_answer_tokens=64,
                      subcall_concurrency=5, strategy="plan", max_output_chars=2048)
    cfg = opts.config()
    assert cfg.models.model_options == {"max_tokens": 64} == cfg.models.sub_model_options
    assert (cfg.models.concurrency, cfg.sandbox.max_output_chars) == (5, 2048)
    assert cfg.budget.max_iterations == 3 and cfg.strategy.mode == "plan"
    rlm = opts.build(trace_path="t.jsonl")
    assert rlm.config.replace(trace_path=None) == RLM(config=cfg).config


def test_the_rlms_layer_maps_into_groups_and_recursa_options_override() -> None:
    from recursa.compat.rlms import RLM as RlmsRLM
    kw: dict[str, Any] = dict(backend="openai", backend_kwargs={"model_name": "gpt-4o-mini"},
                              max_iterations=5, max_budget=2.0)
    mapped = RlmsRLM(**kw, recursa_options={"sandbox": "inprocess"})._rlm.config
    assert (mapped.budget.max_iterations, mapped.budget.max_cost_usd) == (5, 2.0)
    assert mapped.budget.max_depth == 0 and mapped.sandbox.kind == "inprocess"
    assert mapped.models.model == "openai:gpt-4o-mini"
    # a whole group replaces the mapped one; a keyword overrides one field
    cfg = RlmsRLM(**kw, recursa_options={"budget": Budget(max_cost_usd=1.0),
                                         "sandbox": "inprocess", "max_seconds": 30})._rlm.config
    assert (cfg.budget.max_iterations, cfg.budget.max_cost_usd) == (30, 1.0)
    assert cfg.budget.max_seconds == 30
