"""recursa.compat.rlms against the real `rlms` 0.1.3 wheel (dev extra), side by side: both talk
to one scripted OpenAI-compatible HTTP server, so the same model replies reach both, and the
answers, call counts, trajectories and limit errors must agree."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from openai_testserver import OpenAITestServer, _text_of
from recursa.compat import rlms as compat

rlm_ref = pytest.importorskip("rlm", reason="the rlms wheel is not installed (dev extra)")

SUB_PROMPT = "Which pump failed? "
ROOT = [
    "Let me look first.\n```repl\nn = len(context)\nwords = str(context).split()\n"
    "print(n, len(words))\n```",
    "```repl\nverdict = llm_query('" + SUB_PROMPT + "' + str(context)[:300])\nprint(verdict)\n```",
    "```repl\nanswer['content'] = f'{n} items, {len(words)} words; sub-model: {verdict}'\n"
    "answer['ready'] = True\n```",
]


def scripted(request: dict[str, Any]) -> str:
    """A sub-call gets its own answer; a root call the script's next turn, counted by the
    scripted replies already in its history (rlms adds a first assistant message of its own)."""
    msgs = request.get("messages", [])
    users = [_text_of(m.get("content")) for m in msgs if m.get("role") == "user"]
    if users and users[-1].startswith(SUB_PROMPT):
        return "pump 7, seized bearing" if "pump 7" in users[-1] else "no pump named"
    done = sum(1 for m in msgs if m.get("role") == "assistant"
               and _text_of(m.get("content")).strip() in {r.strip() for r in ROOT})
    return ROOT[min(done, len(ROOT) - 1)]


@pytest.fixture(scope="module")
def server():
    with OpenAITestServer(responder=scripted) as srv:
        yield srv


def both(server: OpenAITestServer, **kw: Any) -> tuple[Any, Any]:
    args = dict(backend="openai", backend_kwargs={"model_name": "test-model",
                                                  "base_url": server.base_url,
                                                  "api_key": "test-key"}, **kw)
    return rlm_ref.RLM(**args), compat.RLM(**args)


REPORT = ("Maintenance log. Pump 3 ran normally. Then pump 7 stopped with a seized bearing. "
          "Pump 9 was fine.").lower()


@pytest.mark.parametrize("context", [REPORT, ["pump 3 ok", "pump 7 seized", "pump 9 ok"]],
                         ids=["str", "list"])
def test_same_answers_through_both(server: OpenAITestServer, context: Any) -> None:
    ref, ours = both(server, max_iterations=6)
    a = ref.completion(context, root_prompt="Which pump failed?")
    b = ours.completion(context, root_prompt="Which pump failed?")
    assert isinstance(b, compat.RLMChatCompletion)
    assert a.response == b.response
    assert "sub-model: pump 7, seized bearing" in b.response
    assert b.root_model == a.root_model == "test-model"
    assert b.prompt == context
    # the same calls (3 root turns + 1 sub-call), counted under the same model name
    ra, rb = a.usage_summary.to_dict(), b.usage_summary.to_dict()
    assert set(ra["model_usage_summaries"]) == set(rb["model_usage_summaries"]) == {"test-model"}
    assert rb["model_usage_summaries"]["test-model"]["total_calls"] == \
        ra["model_usage_summaries"]["test-model"]["total_calls"] == 4
    assert b.usage_summary.total_input_tokens > 0 and b.execution_time > 0
    assert b.result is not None and b.result.status == "final" and b.result.turns == 3
    assert compat.RLMChatCompletion.from_dict(b.to_dict()).response == b.response


def test_logger_gets_the_same_trajectory(server: OpenAITestServer, tmp_path) -> None:
    from rlm.logger import RLMLogger
    ref_log = RLMLogger(log_dir=str(tmp_path / "ref"))
    our_log = RLMLogger(log_dir=str(tmp_path / "ours"))     # rlms's own logger class
    ref, _ = both(server, logger=ref_log)
    _, ours = both(server, logger=our_log)
    a = ref.completion(REPORT, root_prompt="Which pump failed?")
    b = ours.completion(REPORT, root_prompt="Which pump failed?")
    ta, tb = a.metadata, b.metadata
    assert ta is not None and tb is not None
    assert tb["run_metadata"]["root_model"] == ta["run_metadata"]["root_model"] == "test-model"
    assert "api_key" not in tb["run_metadata"]["backend_kwargs"]
    assert len(tb["iterations"]) == len(ta["iterations"]) == 3
    for ia, ib in zip(ta["iterations"], tb["iterations"], strict=True):
        assert ib["response"] == ia["response"]
        assert [c["code"] for c in ib["code_blocks"]] == [c["code"] for c in ia["code_blocks"]]
    assert tb["iterations"][0]["code_blocks"][0]["result"]["stdout"].strip() == \
        ta["iterations"][0]["code_blocks"][0]["result"]["stdout"].strip()
    assert tb["iterations"][-1]["final_answer"] == ta["iterations"][-1]["final_answer"]
    # the logger wrote its JSONL file in rlms's shape (one metadata line, one per iteration)
    assert our_log.log_file_path and len(open(our_log.log_file_path).readlines()) == 4


def test_callbacks_fire(server: OpenAITestServer) -> None:
    seen: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def rec(*args: Any) -> None:
        with lock:
            seen.append(args)
    _, ours = both(server, on_iteration_start=lambda d, n: rec("start", d, n),
                   on_iteration_complete=lambda d, n, s: rec("end", d, n))
    ours.completion(REPORT, root_prompt="Which pump failed?")
    assert seen == [("start", 0, 1), ("end", 0, 1), ("start", 0, 2), ("end", 0, 2),
                    ("start", 0, 3), ("end", 0, 3)]


def test_limits_raise_rlms_errors_with_the_partial_answer(server: OpenAITestServer) -> None:
    ref, ours = both(server, max_tokens=10)
    with pytest.raises(Exception) as ea:
        ref.completion(REPORT, root_prompt="Which pump failed?")
    with pytest.raises(compat.TokenLimitExceededError) as eb:
        ours.completion(REPORT, root_prompt="Which pump failed?")
    assert type(ea.value).__name__ == type(eb.value).__name__ == "TokenLimitExceededError"
    assert eb.value.token_limit == 10 and eb.value.completion is not None
    assert eb.value.completion.result.status == "limit"


def test_iterations_running_out_still_answer(server: OpenAITestServer) -> None:
    _, ours = both(server, max_iterations=1)
    out = ours.completion(REPORT, root_prompt="Which pump failed?")
    assert out.result is not None and out.result.status == "extracted"
    assert out.result.turns == 1


def test_persistent_asks_follow_ups_in_one_sandbox(server: OpenAITestServer) -> None:
    _, ours = both(server, persistent=True)
    with ours:
        first = ours.completion(REPORT, root_prompt="Which pump failed?")
        again = ours.completion(REPORT, root_prompt="And why?")
        assert first.response == again.response       # the script answers the same way
        with pytest.raises(compat.UnsupportedOption, match="same prompt"):
            ours.completion("another document", root_prompt="?")
    assert ours._session is None


@pytest.mark.parametrize(("kw", "names"), [
    ({"custom_tools": {"lookup": len}}, "sub_tools"),
    ({"custom_sub_tools": {"lookup": len}}, "sub_tools"),
    ({"environment": "prime"}, "recursa_options={'sandbox'"),
    ({"environment_kwargs": {"setup_code": "x = 1"}}, "sandbox_options"),
    ({"backend": "portkey"}, "base_url"),
    ({"max_depth": 0}, "make_client"),
    ({"compaction_threshold_pct": 0.5}, "WINDOW_FILL"),
    ({"orchestrator": False}, "custom_system_prompt"),
    ({"backend_kwargs": {"model_name": "m", "http_client": object()}}, "client_options"),
    ({"backend_kwargs": {"base_url": "http://x"}}, "model_name is required"),
    ({"other_backends": ["openai", "openai"],
      "other_backend_kwargs": [{"model_name": "a"}, {"model_name": "b"}]}, "models"),
])
def test_what_cannot_map_is_refused_naming_the_equivalent(kw: dict[str, Any], names: str) -> None:
    args: dict[str, Any] = {"backend_kwargs": {"model_name": "m"}, **kw}
    with pytest.raises(compat.UnsupportedOption, match="rlms option") as e:
        compat.RLM(**args)
    assert names in str(e.value)


def test_an_unknown_environment_is_told_every_sandbox_kind() -> None:
    from recursa.sandbox.kinds import kind_names
    with pytest.raises(compat.UnsupportedOption) as e:
        compat.RLM(backend_kwargs={"model_name": "m"}, environment="prime")
    listed = str(e.value).split("recursa's sandboxes are ", 1)[1].split(": recursa_options")[0]
    assert [k.removesuffix(" (not isolated)") for k in listed.split(", ")] == kind_names()
    assert {k for k in listed.split(", ") if k.endswith(" (not isolated)")} == \
        {f"{k} (not isolated)" for k in kind_names(isolates=False)}


def test_options_map_onto_recursa() -> None:
    r = compat.RLM(backend="anthropic", backend_kwargs={"model_name": "claude-x",
                                                        "sampling_args": {"temperature": 0}},
                   other_backends=["openai"], other_backend_kwargs=[{"model_name": "gpt-y"}],
                   max_depth=3, max_iterations=7, max_timeout=30, max_errors=2,
                   max_budget=1.5, user_prologue="Be brief.", custom_system_prompt="Use {x}.",
                   recursa_options={"sandbox": "inprocess", "preflight": False})
    inner = r._rlm
    assert (inner.model, inner.sub_model) == ("anthropic:claude-x", "openai:gpt-y")
    assert inner.budget.max_depth == 2 and inner.budget.max_iterations == 7
    assert inner.budget.max_seconds == 30 and inner.budget.max_consecutive_errors == 2
    assert inner.budget.max_cost_usd == 1.5 and inner.model_options == {"temperature": 0}
    assert inner.tips == "Be brief." and inner.sandbox == "inprocess"
    assert inner.system_prompt.format() == "Use {x}."


def test_child_rlm_callbacks_and_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    """max_depth=2 (rlms) lets rlm_query start a child RLM; its start and end reach rlms's
    subcall callbacks. A recursa model object can stand in through recursa_options."""
    from recursa.models import ReplayClient
    seen: list[tuple[Any, ...]] = []
    script = ReplayClient([
        "```repl\nx = rlm_query('count the pumps', context='pump 3, pump 7')\nFINAL(x)\n```",
        "```repl\nFINAL(str(context.count('pump')) + ' pumps')\n```",   # the child's turn
    ])
    r = compat.RLM(backend_kwargs={"model_name": "m"}, max_depth=2, verbose=True,
                   on_subcall_start=lambda d, m, p: seen.append(("start", d, m, p)),
                   on_subcall_complete=lambda d, m, s, e: seen.append(("end", d, m, e)),
                   recursa_options={"model": script, "sandbox": "inprocess",
                                    "preflight": False})
    out = r.completion("ignored", root_prompt="How many pumps?")
    assert out.response == "2 pumps"
    assert seen == [("start", 1, "replay:", "count the pumps"), ("end", 1, "replay:", None)]
    assert "turn 1: 1 code block(s)" in capsys.readouterr().err    # verbose: the console view
