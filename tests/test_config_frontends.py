"""The front ends that build RLMs themselves (the OpenAI server, the bench's REPL methods, the
RL environments' rollouts) hand `RLM` one `RLMConfig` value, built from their own settings,
rather than re-spelling its keywords (docs/config.md, "Who builds one"). No model runs: `RLM`
is stopped as it is made, with what it was given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from recursa.core.config import RLMConfig
from recursa.core.rlm import RLM


class _Made(Exception):
    """Raised by the stand-in RLM.__init__, carrying the keywords it was called with."""

    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("RLM made")
        self.kwargs = kwargs


def _handed(monkeypatch: pytest.MonkeyPatch, make: Any) -> RLMConfig:
    """The RLMConfig `make()` hands RLM, which must be the only thing it hands it."""
    def stop(self: RLM, **kwargs: Any) -> None:
        raise _Made(kwargs)
    monkeypatch.setattr(RLM, "__init__", stop)
    with pytest.raises(_Made) as made:
        make()
    kwargs = made.value.kwargs
    assert set(kwargs) == {"config"}, f"RLM was also given {sorted(set(kwargs) - {'config'})}"
    assert isinstance(kwargs["config"], RLMConfig)
    return kwargs["config"]


def test_the_server_derives_each_run_from_its_rlm_config(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette")
    from recursa.server.openai_app import RunSpec, ServerConfig, default_rlm_factory
    server = ServerConfig(rlm=RLMConfig.build(
        model="replay:root", sub_model="replay:sub", sandbox="inprocess", max_iterations=5,
        max_output_chars=4096, route="auto", tips="be brief", trace_dir="runs"))

    def hook(ev: Any) -> None:
        pass
    cfg = _handed(monkeypatch, lambda: default_rlm_factory(
        server, RunSpec(sub_model="replay:other", on_event=hook)))
    # the server's settings, with its shared clients and the request's sub-model and hook
    assert cfg.models.model is server.shared_clients["replay:root"]
    assert cfg.models.sub_model is server.shared_clients["replay:other"]
    assert cfg.tracing.on_event is hook and str(cfg.tracing.trace_dir) == "runs"
    assert (cfg.sandbox.kind, cfg.sandbox.max_output_chars) == ("inprocess", 4096)
    assert cfg.budget == server.caps() and cfg.budget.max_iterations == 5
    assert (cfg.strategy.route, cfg.strategy.tips) == ("auto", "be brief")
    asyncio.run(server.aclose_clients())


def test_a_server_config_refuses_loose_settings() -> None:
    pytest.importorskip("starlette")
    from recursa.server.openai_app import ServerConfig
    with pytest.raises(TypeError, match="ServerConfig.rlm must be an RLMConfig"):
        ServerConfig(rlm={"models": {"model": "replay:"}})     # type: ignore[arg-type]


def test_a_bench_rlm_method_hands_its_method_config_as_one_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from recursa.bench.methods import MethodConfig, run_rlm
    from recursa.bench.tasks.base import Instance
    method = MethodConfig(method="rlm-plan", depth=0, model="replay:", sandbox="inprocess",
                          limits={"max_iterations": 7}, max_output_chars=2048, tips="t")
    inst = Instance(id="i", task="t", query="q?", context="c", gold="g", length_tokens=1,
                    meta={"question_type": "lookup"})
    cfg = _handed(monkeypatch, lambda: asyncio.run(run_rlm(method, inst, None)))
    assert cfg.budget.max_iterations == 7 and cfg.budget.max_depth == 0
    assert cfg.budget.max_subcalls == 0 and cfg.strategy.mode == "plan"
    assert cfg.strategy.sources and cfg.strategy.tips == "t"
    assert (cfg.sandbox.kind, cfg.sandbox.max_output_chars) == ("inprocess", 2048)


def test_an_env_rollout_hands_its_settings_as_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from recursa.envs.rollout import run_rollout
    cfg = _handed(monkeypatch, lambda: asyncio.run(run_rollout(
        "oolong", "rlm", 0, model="replay:", sandbox="inprocess", max_iterations=3,
        rlm_options={"model": "openai:ignored", "max_iterations": 9, "route": "auto"})))
    # the shared options' other settings, the rollout's own models, sandbox and limits
    assert cfg.models.model == "replay:" and cfg.sandbox.kind == "inprocess"
    assert cfg.budget.max_iterations == 3 and cfg.strategy.route == "auto"
