"""The llm-recursa plugin's pieces without the CLI (tests/test_llm_plugin.py runs the real one)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

llm = pytest.importorskip("llm", reason="the llm package is not installed (dev extra)")

_PATH = Path(__file__).resolve().parents[1] / "plugins" / "llm-recursa" / "llm_recursa.py"
_spec = importlib.util.spec_from_file_location("llm_recursa_under_test", _PATH)
assert _spec is not None and _spec.loader is not None
plugin = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = plugin      # as an import does: pydantic resolves Options' hints there
_spec.loader.exec_module(plugin)


def test_stored_keys_go_only_to_their_provider(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / "keys.json").write_text(json.dumps({"openai": "sk-stored"}))
    assert plugin._stored_key("openai:gpt-5-mini", None) == "sk-stored"
    assert plugin._stored_key("openai:my-model", "http://127.0.0.1:8000/v1") is None
    assert plugin._stored_key("local:smollm2-135m", None) is None
    assert plugin._stored_key("anthropic:claude-x", None) is None      # none stored
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert plugin._stored_key("openai:gpt-5-mini", None) is None       # recursa reads the env


def test_fragments_and_question_are_told_apart() -> None:
    model = plugin.RecursaModel("recursa", None)
    one = llm.Prompt("What failed?", model, fragments=[llm.Fragment("log text", "a.log")])
    assert plugin._context_and_query(one) == ("log text", "What failed?")
    two = llm.Prompt("Compare", model, fragments=[llm.Fragment("x", "a"),
                                                  llm.Fragment("y", "a")])
    assert plugin._context_and_query(two) == ({"a": "x", "a (2)": "y"}, "Compare")
    bare = llm.Prompt("just a question", model)
    assert plugin._context_and_query(bare) == (None, "just a question")
    with pytest.raises(llm.ModelError, match="give a question"):
        plugin._context_and_query(llm.Prompt("", model, fragments=[llm.Fragment("x", "a")]))


def test_each_option_reaches_rlm_under_its_cli_name(tmp_path: Path, monkeypatch) -> None:
    """What RLM(...) receives for each -o option: the arguments `recursa run`'s flags give
    (recursa.frontend.options.RLMOptions.rlm_kwargs), so the plugin and the CLI run alike."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "recursa").mkdir()
    (tmp_path / "recursa" / "config.toml").write_text('[aliases]\nsmall = "openai:tiny"\n')
    from recursa import RLM
    from recursa.frontend.options import RLMOptions
    opts = plugin.RecursaModel.Options

    def sent(**options: object) -> dict:
        return plugin.rlm_arguments(opts(**options), "openai:big", None)

    plain = sent()
    assert {k: plain[k] for k in ("model", "sub_model", "tips")} == \
        {"model": "openai:big", "sub_model": "openai:big", "tips": None}
    assert not {"strategy", "route", "sources", "prices", "sandbox", "mcp_servers"} & set(plain)  # RLM's defaults
    cases = [({"strategy": "plan"}, {"strategy": "plan"}),
             ({"route": "auto", "route_threshold": 500}, {"route": "auto", "route_threshold": 500}),
             ({"sources": True}, {"sources": True}),
             ({"price": "0.15/0.6"}, {"prices": {"openai:big": (0.15, 0.6)}}),
             ({"price": "1/2,small=0.1/0.2", "sub_model": "small"},
              {"prices": {"openai:big": (1.0, 2.0), "openai:tiny": (0.1, 0.2)},
               "sub_model": "openai:tiny"}),
             ({"max_cost": 0.5, "max_iterations": 3}, {"max_cost_usd": 0.5, "max_iterations": 3}),
             ({"sandbox": "inprocess", "trace": "t.jsonl"},
              {"sandbox": "inprocess", "trace_path": "t.jsonl"}),
             ({"mcp": "mcp.json"}, {"mcp_servers": "mcp.json"}),
             ({"max_answer_tokens": 50}, {"model_options": {"max_tokens": 50},
                                          "sub_model_options": {"max_tokens": 50}})]
    for options, want in cases:
        got = sent(**options)
        assert {k: got.get(k) for k in want} == want, options
    assert not sent(sources=False).get("sources")
    # the CLI's flags give RLM the same values
    cli = RLMOptions(model="openai:big", strategy="plan", route="auto", route_threshold=500,
                     prices=[(None, 0.15, 0.6)], max_cost_usd=0.5).rlm_kwargs()
    mine = sent(strategy="plan", route="auto", route_threshold=500, price="0.15/0.6",
                max_cost=0.5)
    for k in ("strategy", "route", "route_threshold", "prices", "max_cost_usd"):
        assert mine[k] == cli[k], k
    RLM(**mine)          # and RLM takes them all
