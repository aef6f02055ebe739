"""The llm-recursa plugin's pieces without the CLI (tests/test_llm_plugin.py runs the real one)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

llm = pytest.importorskip("llm", reason="the llm package is not installed (dev extra)")

_PATH = Path(__file__).resolve().parents[1] / "plugins" / "llm-recursa" / "llm_recursa.py"
_spec = importlib.util.spec_from_file_location("llm_recursa_under_test", _PATH)
assert _spec is not None and _spec.loader is not None
plugin = importlib.util.module_from_spec(_spec)
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
