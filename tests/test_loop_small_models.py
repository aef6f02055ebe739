"""The loop's handling of what small models get wrong (repeated cells, prose answers, fences,
bare FINAL lines, histories longer than the window), and that every message the root model
received is rebuilt exactly from the trace (SFT export)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers_scripted import repl
from recursa import RLM
from recursa.base.types import Capabilities, Completion, Message
from recursa.core import prompts
from recursa.core.compaction import history_budget
from recursa.core.compaction import msg_tokens as _msg_tokens
from recursa.core.parse import (
    answer_text,
    code_blocks,
    final_line,
    final_literal,
    normalize_code,
    prose_answer,
)
from recursa.envs.sft import root_calls, root_conversations, root_messages
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load

CTX = "".join(f"line {i:04d}: the quick brown fox jumps over the lazy dog\n" for i in range(400))


class Recording:
    """A root model that answers from a script and records exactly what it was sent; with
    `context_window` set, like a local model's client."""

    def __init__(self, replies: list[str], context_window: int | None = None,
                 token_scale: float | None = None) -> None:
        self.inner = ReplayClient(list(replies))
        self.token_scale = token_scale    # set: its usage says scale x the estimated tokens
        self.name = "replay:root"
        self.capabilities = Capabilities(context_window=context_window)
        self.calls: list[list[Message]] = []
        self.replies: list[str] = []
        self.options: list[dict[str, Any]] = []

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        self.calls.append(copy.deepcopy(messages))
        self.options.append(dict(options))
        comp = await self.inner.complete(messages, **options)
        self.replies.append(comp.text)
        if self.token_scale:
            comp.usage.input_tokens = int(self.token_scale * _msg_tokens(messages))
        return comp

    async def aclose(self) -> None:
        pass


def run(replies: list[str], tmp_path: Path, *, window: int | None = None,
        sandbox: str = "inprocess", token_scale: float | None = None,
        **kw: Any) -> tuple[Any, Recording, Any]:
    root = Recording(replies, window, token_scale)
    trace = tmp_path / f"t{len(list(tmp_path.glob('*.jsonl')))}.jsonl"
    res = RLM(model=root, sub_model=ReplayClient(lambda m: "sub-answer", name="replay:sub"),
              sandbox=sandbox, trace_path=trace, **kw).completion("How many lines?", context=CTX)
    run_ = load(trace)
    return res, root, run_


def assert_rebuilt_exactly(root: Recording, run_: Any) -> None:
    rebuilt = root_calls(run_)
    assert rebuilt is not None
    assert [m for m, _ in rebuilt] == root.calls
    assert [r for _, r in rebuilt] == root.replies
    assert root_messages(run_) == root.calls[-1] + [
        {"role": "assistant", "content": rebuilt[-1][1]}]


def cells(run_: Any) -> list[Any]:
    return [n for n in run_.walk() if n.kind == "cell"]


def turn_nodes(run_: Any) -> list[Any]:
    return [run_.nodes[c] for c in run_.root.children if run_.nodes[c].kind == "turn"]


# ------------------------------------------------------------------ parsing
def test_fences_and_bare_final_lines() -> None:
    assert code_blocks("Here:\n```\nprint(1)\n```") == ["print(1)"]          # bare fence
    assert code_blocks("```py\nx = 1\n```\n```\n1\n```") == ["x = 1"]        # py beats bare
    assert code_blocks("```repl\na\n```\n```python\nb\n```") == ["a"]        # repl beats all
    assert code_blocks("```text\nnot code\n```") == []
    assert final_line("I found it.\nFINAL(x)\n") == "FINAL(x)"
    assert final_line("`FINAL_VAR(\"best\")`") == 'FINAL_VAR("best")'
    assert final_line("I will call FINAL(x) later.") is None                 # a mention
    assert final_line("```repl\nFINAL(1)\n```") is None                      # inside a fence
    assert final_literal("FINAL(March 2023)") == "March 2023"
    assert final_literal("FINAL('Lyon')") == "Lyon"
    assert normalize_code(["print( 1 )  # again\n\n"]) == normalize_code(["print(1)"])
    assert normalize_code(["print('a b')"]) != normalize_code(["print('ab')"])
    assert normalize_code(["if x:\n    y()\nz()"]) != normalize_code(["if x:\n    y()\n    z()"])


@pytest.mark.parametrize("text, expected", [
    ("29785", (False, "29785")),
    ("**Final answer:** March 2023", (True, "March 2023")),
    ("Final Answer:\n\n`Lyon`", (True, "Lyon")),
    ("I looked at the records.\nAnswer: 'History'", (False, "History")),
    ("Let me look at the context first:", None),
    ("Which label do you mean?", None),
    ("I will call FINAL(x) once I know.", None),
    ("x" * 500, None),
])
def test_prose_answer_rule(text: str, expected: Any) -> None:
    assert prose_answer(text) == expected


# ------------------------------------------------------------------ repeated cells
def test_repeated_cell_is_not_rerun_and_the_model_is_reminded(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(len(context))"), repl("print( len(context) )\n"),
                           repl("FINAL(str(len(context)))")], tmp_path)
    assert res.status == "final" and res.answer == str(len(CTX)) and res.turns == 3
    assert [c.data["code"] for c in cells(run_)] == ["print(len(context))",
                                                     "FINAL(str(len(context)))"]
    reminder = root.calls[2][-1]["content"]
    assert "same code as in turn 1, so it was not run again" in reminder
    assert f"It printed:\n{len(CTX)}" in reminder and "FINAL" in reminder
    assert turn_nodes(run_)[1].data["repeat_of"] == 1
    assert_rebuilt_exactly(root, run_)


def test_repeats_count_as_failed_turns(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(context[:50])")] * 10, tmp_path, max_consecutive_errors=3)
    assert res.status == "error" and res.limit == "max_consecutive_errors"
    assert res.turns == 4 and len(cells(run_)) == 1     # ran once, then three reminders
    assert_rebuilt_exactly(root, run_)


def test_failed_repeat_says_it_failed(tmp_path: Path) -> None:
    res, root, run_ = run([repl("1/0"), repl("1/0"), repl("FINAL('ok')")], tmp_path)
    reminder = root.calls[2][-1]["content"]
    assert "It failed:" in reminder and "ZeroDivisionError" in reminder
    assert prompts.TODO_FAILED in reminder
    assert res.answer == "ok" and len(cells(run_)) == 2


def test_same_code_after_other_code_runs_again(tmp_path: Path) -> None:
    # `print(x)` after a cell changed x is not a repeat: its output may differ
    res, _, run_ = run([repl("x = 1"), repl("print(x)"), repl("x = 2"), repl("print(x)"),
                        repl("FINAL(str(x))")], tmp_path)
    assert len(cells(run_)) == 5 and res.answer == "2"


def test_a_cell_that_called_a_model_may_run_again(tmp_path: Path) -> None:
    res, _, run_ = run([repl("print(llm_query('hi'))")] * 2 + [repl("FINAL('x')")], tmp_path)
    assert len(cells(run_)) == 3 and res.subcalls == 2


def test_a_rerun_that_printed_the_same_is_not_run_a_third_time(tmp_path: Path) -> None:
    """A 1.5B resent one llm_batch cell four times, each printing the same answer (the
    sub-model at temperature 0): the second send runs, the third gets the reminder."""
    res, root, run_ = run([repl("print(llm_query('hi'))")] * 3 + [repl("FINAL('x')")],
                          tmp_path)
    assert len(cells(run_)) == 3 and res.subcalls == 2 and res.answer == "x"
    reminder = root.calls[3][-1]["content"]
    assert "same code as in turn 2, so it was not run again" in reminder
    assert "It printed:\nsub-answer" in reminder
    assert turn_nodes(run_)[2].data["repeat_of"] == 2


# ------------------------------------------------------------------ prose answers
def test_short_prose_after_output_is_a_draft_then_confirmed_in_code(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(len(context.splitlines()))"), "400",
                           repl('FINAL(answer["content"])')], tmp_path)
    assert res.status == "final" and res.answer == "400"      # the draft was in the REPL
    nudge = root.calls[2][-1]["content"]
    assert "took it as your draft answer" in nudge and "'400'" in nudge
    assert turn_nodes(run_)[1].data["prose_answer"] == {"kind": "draft", "content": "400"}
    assert_rebuilt_exactly(root, run_)


def test_draft_kept_when_the_run_ends_at_its_limit(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(len(context.splitlines()))"), "There are 400 lines.",
                           repl("print(1)"), "KEEP"], tmp_path, max_iterations=3)
    assert res.status == "extracted" and res.answer == "There are 400 lines."
    # the last-turn request joins the last feedback: the roles still alternate
    roles = [m["role"] for m in root.calls[-1]]
    assert all(a != b for a, b in zip(roles[1:], roles[2:], strict=False))
    assert "reached its limit" in root.calls[-1][-1]["content"]
    assert_rebuilt_exactly(root, run_)


def test_explicit_final_answer_in_prose_commits(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(len(context.splitlines()))"),
                           "The output shows the count.\nFinal answer: 400"], tmp_path)
    assert (res.status, res.answer, res.ready, res.turns) == ("final", "400", True, 2)
    assert_rebuilt_exactly(root, run_)


def test_the_same_prose_answer_twice_commits(tmp_path: Path) -> None:
    res, root, run_ = run([repl("print(len(context.splitlines()))"), "400", "400"], tmp_path)
    assert (res.status, res.answer, res.turns) == ("final", "400", 3)
    assert_rebuilt_exactly(root, run_)


def test_prose_before_any_output_is_not_an_answer(tmp_path: Path) -> None:
    res, root, _ = run(["42", repl("FINAL('looked')")], tmp_path)
    assert res.answer == "looked"
    assert root.calls[1][-1]["content"].startswith(prompts.NO_CODE)


def test_prose_does_not_replace_a_draft_built_by_code(tmp_path: Path) -> None:
    res, root, _ = run([repl('answer["content"] = "built in code"'), "Done.", "KEEP"], tmp_path,
                       max_iterations=2)
    assert res.answer == "built in code"
    assert root.calls[2][-1]["content"].startswith(prompts.NO_CODE)


def test_bare_final_line_outside_a_fence_is_honoured(tmp_path: Path) -> None:
    res, root, run_ = run([repl("n = len(context.splitlines())\nprint(n)"),
                           "The count is printed above.\nFINAL(str(n))"], tmp_path)
    assert (res.status, res.answer) == ("final", "400")
    assert cells(run_)[-1].data["code"] == "FINAL(str(n))"
    res, _, _ = run([repl("print(1)"), "FINAL(March 2023)"], tmp_path)   # not Python
    assert (res.status, res.answer) == ("final", "March 2023")


def test_bare_fence_runs(tmp_path: Path) -> None:
    res, _, _ = run(["```\nFINAL(context[:4])\n```"], tmp_path)
    assert res.answer == "line"


# ------------------------------------------------------------------ made-up numbers
def test_a_number_never_shown_is_held_once(tmp_path: Path) -> None:
    guess = repl('FINAL("There are 1,234 lines.")')
    res, root, run_ = run([repl("print(len(context))"), guess, guess], tmp_path)
    assert (res.status, res.answer, res.turns) == ("final", "There are 1,234 lines.", 3)
    note = root.calls[2][-1]["content"]
    assert note.startswith("[no output]") and "Not committed yet" in note and "1,234" in note
    assert turn_nodes(run_)[1].data["held"] == {"answer": "There are 1,234 lines.",
                                                "number": "1,234"}
    assert_rebuilt_exactly(root, run_)


def test_the_held_answer_stays_a_draft(tmp_path: Path) -> None:
    res, root, _ = run([repl("print(1)"), "Final answer: 98765", "KEEP"], tmp_path,
                       max_iterations=2)
    assert (res.status, res.answer) == ("extracted", "98765")
    assert "Not committed yet" in root.calls[2][-1]["content"]


@pytest.mark.parametrize("final", [
    'FINAL(str(len(context) * 7))',             # computed, not written by hand
    'FINAL("22,000 characters")',               # shown (in the context's description)
    'FINAL("line 0129")',                       # shown (printed by the first cell)
])
def test_numbers_from_code_or_output_commit_at_once(tmp_path: Path, final: str) -> None:
    res, _, _ = run([repl("print(context[7000:7200])"), repl(final)], tmp_path)
    assert res.status == "final" and res.turns == 2


def test_a_worded_guess_never_backed_by_output_is_held_once(tmp_path: Path) -> None:
    """A typed-in answer whose words no output showed (here after an empty search)."""
    guess = repl('answer["content"] = "A malfunction in the electrical system."\n'
                 'answer["ready"] = True')
    res, root, run_ = run([repl("print(context.count('outage'))"), guess, guess], tmp_path)
    assert (res.status, res.turns) == ("final", 3)
    note = root.calls[2][-1]["content"]
    assert "Not committed yet" in note and "'malfunction'" in note
    assert_rebuilt_exactly(root, run_)


@pytest.mark.parametrize("final", [
    'FINAL("The quick brown fox.")',                   # its words were printed
    'FINAL(" ".join(context.split()[5:8]))',            # computed, not typed
])
def test_worded_answers_backed_by_output_or_code_commit_at_once(tmp_path: Path,
                                                                 final: str) -> None:
    res, _, _ = run([repl("print(context[:200])"), repl(final)], tmp_path)
    assert res.status == "final" and res.turns == 2


def test_an_empty_answer_is_never_committed(tmp_path: Path) -> None:
    empty = repl('best = ""\nanswer["content"] = best\nanswer["ready"] = True')
    res, root, run_ = run([empty, empty, repl('FINAL("line 0001")')], tmp_path)
    assert (res.status, res.answer, res.turns) == ("final", "line 0001", 3)
    assert "Not committed: the answer is empty" in root.calls[1][-1]["content"]
    assert "Not committed: the answer is empty" in root.calls[2][-1]["content"]
    assert_rebuilt_exactly(root, run_)


# ------------------------------------------------------------------ compaction
def test_history_budget() -> None:
    def env(window: int | None, max_tokens: int | None = None, cap: int | None = None) -> Any:
        caps = Capabilities(context_window=window)
        return SimpleNamespace(root_client=SimpleNamespace(capabilities=caps),
                               root_options={"max_tokens": max_tokens} if max_tokens else {},
                               max_history_tokens=cap)
    assert history_budget(env(None)) is None
    assert history_budget(env(8192)) == int(8192 * 0.85) - 1024
    assert history_budget(env(8192, 512)) == int(8192 * 0.85) - 512
    assert history_budget(env(4000, 4000)) == int(4000 * 0.85) - 1000   # at most a quarter
    assert history_budget(env(None, cap=3000)) == 3000
    assert history_budget(env(8192, cap=3000)) == 3000


def test_compaction_follows_the_models_own_token_count_when_the_estimate_is_low(
        tmp_path: Path) -> None:
    """A model whose tokens are 1.6x the estimate (digits, punctuation): after its first reply
    the history is fitted in its units, so every later call's real size stays in the window."""
    window, scale = 3400, 1.6
    script = [repl(f"part{i} = context[{i * 900}:{(i + 1) * 900}]\nprint(part{i})")
              for i in range(8)]
    script += ["Final answer: done"]
    res, root, _ = run(script, tmp_path, window=window, token_scale=scale)
    assert res.status == "final" and res.answer == "done"
    budget = int(window * 0.85) - window // 4
    real = [int(scale * _msg_tokens(c)) for c in root.calls]
    assert all(r <= budget for r in real[1:]), real
    assert max(_msg_tokens(c) for c in root.calls[1:]) <= budget / scale + 1


@pytest.mark.parametrize("sandbox", ["inprocess", "local"])
def test_compaction_keeps_every_call_inside_the_window(tmp_path: Path, sandbox: str) -> None:
    window = 3400   # room for the system prompt (~1,000 tokens with search and combinators)
    script = [repl(f"part{i} = context[{i * 900}:{(i + 1) * 900}]\nprint(part{i})")
              for i in range(8)]
    script += [repl("print(len(history), history[2]['content'][:13])"), "Final answer: done"]
    res, root, run_ = run(script, tmp_path, window=window, sandbox=sandbox)
    assert res.status == "final" and res.answer == "done" and res.turns == 10
    budget = int(window * 0.85) - window // 4
    assert all(_msg_tokens(c) <= budget for c in root.calls), [_msg_tokens(c) for c in root.calls]
    events = [p.data["compaction"] for t in turn_nodes(run_) for p in t.points
              if "compaction" in p.data]
    assert len(events) >= 2
    assert all(e["tokens_after"] <= e["budget"] < e["tokens_before"] for e in events)
    # the first user message stays; the summary says what ran and where the full history is
    summary = events[-1]["messages"][0]["content"]
    assert summary.startswith(root.calls[0][1]["content"])
    assert "were removed from this conversation" in summary and "ran:\npart" in summary
    assert "REPL variable `history`" in summary and "part5" in summary
    # the REPL holds the whole conversation, the first reply included
    out = cells(run_)[-1].data["output"]
    n, first = out.split(" ", 1)
    assert int(n) >= 14 and first.startswith("```repl\npart0")
    assert_rebuilt_exactly(root, run_)
    convs = root_conversations(run_)
    assert convs is not None and len(convs) == len(events) + 1
    # every reply the model wrote is in some training example
    replies = {m["content"] for c in convs for m in c if m["role"] == "assistant"}
    assert set(script) <= replies


def test_one_output_larger_than_the_window_is_cut_down(tmp_path: Path) -> None:
    window = 2400
    res, root, run_ = run([repl("print(context)"), repl("print(len(context))"),
                           "Final answer: done"], tmp_path, window=window)
    assert res.status == "final" and res.answer == "done"
    budget = int(window * 0.85) - window // 4
    assert all(_msg_tokens(c) <= budget for c in root.calls)
    assert "cut to fit the context window" in root.calls[1][-1]["content"]
    assert_rebuilt_exactly(root, run_)


def test_compaction_of_the_last_turn_and_a_clashing_history_name(tmp_path: Path) -> None:
    window = 2400
    script = [repl("history = 'mine'")]
    script += [repl(f"print(context[{i * 900}:{(i + 1) * 900}])") for i in range(5)]
    script += ["KEEP"]
    res, root, run_ = run(script, tmp_path, window=window, max_iterations=6)
    assert res.status == "extracted"
    budget = int(window * 0.85) - window // 4
    assert all(_msg_tokens(c) <= budget for c in root.calls)
    names = {p.data["compaction"]["history_var"] for t in turn_nodes(run_) for p in t.points
             if "compaction" in p.data}
    assert names == {"full_history"}         # the model's own `history` was left alone
    assert_rebuilt_exactly(root, run_)


def test_a_compaction_before_a_refused_call_is_replayed_too(tmp_path: Path) -> None:
    from recursa.core.dispatch import MIN_CUT_OUTPUT, text_tokens
    script = [repl(f"print(context[{i * 900}:{(i + 1) * 900}])") for i in range(8)] + ["KEEP"]
    _, root, run_ = run(script[:-1] + ["FINAL('x')"], tmp_path, window=3000)
    first = next(i for i, t in enumerate(turn_nodes(run_))
                 if any("compaction" in p.data for p in t.points))
    spent = sum(t.usage.total_tokens for t in turn_nodes(run_)[:first])
    call = root.calls[first]
    est = sum(text_tokens(m["content"]) for m in call) + 4 * len(call)
    # the budget refuses exactly the call the compaction was made for (even with its output
    # cut to the floor a call near a limit is cut to)
    res, root, run_ = run(script, tmp_path, window=3000,
                          max_tokens=spent + est + MIN_CUT_OUTPUT - 1)
    assert res.limit == "max_tokens" and len(root.calls) == first + 1
    refused = turn_nodes(run_)[first]
    assert "error" in refused.data and any("compaction" in p.data for p in refused.points)
    assert_rebuilt_exactly(root, run_)


def test_every_new_path_in_one_run_is_rebuilt_exactly(tmp_path: Path) -> None:
    script = [repl("print(context[:1200])"),
              repl("print(context[:1200])"),                 # repeat
              "It has 400 lines.",                           # prose draft
              "Let me count them properly, carefully, with a regular expression " * 4,   # no code
              "```python\nimport re\nprint(len(re.findall('line', context)))\n```",
              repl("print(context[1200:2400])"),
              repl("print(context[2400:3600])"),
              repl('FINAL("about 4,321")'),                  # held: never shown
              "FINAL(len(re.findall('line', context)))"]     # bare FINAL line
    res, root, run_ = run(script, tmp_path, window=2400)
    assert res.status == "final" and res.answer == "400"
    assert any("compaction" in p.data for t in turn_nodes(run_) for p in t.points)
    kinds = [k for t in turn_nodes(run_) for k in ("repeat_of", "prose_answer", "held")
             if k in t.data]
    assert kinds == ["repeat_of", "prose_answer", "held"]
    assert_rebuilt_exactly(root, run_)


@pytest.mark.parametrize("reply,answer", [
    ("```repl\n29785\n```", "29785"),
    ('FINAL("Lyon")', "Lyon"),
    ("```python\nFINAL('Lyon')\n```", "Lyon"),
    ("The city is Lyon.", "The city is Lyon."),
    ("FINAL(March 2023)", "March 2023"),
    ("Answer: **42**\n```repl\nprint(total)\n```", "42"),
    ('```repl\nanswer["content"] = "blue"\nanswer["ready"] = True\n```', "blue"),
    ("```\nParis\n```", "Paris"),
    # code that computes its answer, or names a variable, is no answer text
    ("Let me check.\n```repl\nprint(context[:100])\n```", None),
    ("FINAL(total)", None),
    ("", None),
])
def test_last_turn_answers_are_plain_text(reply: str, answer: str | None) -> None:
    assert answer_text(reply) == answer
