"""The REPL's combinators (chunk, llm_map, llm_filter, llm_reduce, pairs) end to end: a scripted
model, real sandboxes, the real dispatcher, budget and trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recursa import RLM
from recursa.base.types import Completion
from recursa.core.combinators import LeafType, leaf_item, yes_score
from recursa.models.logprobs import first_logprobs
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

RECORDS = "\n".join(f"User {i}: " + ("I love it" if i % 3 else "awful, broken")
                    for i in range(1, 13))


def is_root(messages) -> bool:
    return messages[0]["role"] == "system" and "persistent Python REPL" in messages[0]["content"]


def sub_text(messages) -> str:
    """The item a leaf reads (the text before the instruction)."""
    return leaf_item(messages[-1]["content"])


def run_cell(code: str, sub=None, *, name: str = "local:fake", window: int | None = None,
             context: str = RECORDS, sandbox: str = "inprocess", trace: Path | None = None,
             **limits):
    """Run `code` as the root's only turn (then FINAL); returns (what the root was shown, the
    sub-model's client, the Result)."""
    root = ReplayClient([f"```repl\n{code}\n```", '```repl\nFINAL("done")\n```'])
    client = ReplayClient(sub or (lambda m: "ok"), name=name)
    if window:
        client.context_window = window     # what the host sizes leaves from
    rlm = RLM(model=root, sub_model=client, sandbox=sandbox, preflight=False,
              trace_path=trace, **limits)
    res = rlm.completion("q?", context=context)
    shown = root.calls[1][-1]["content"] if len(root.calls) > 1 else ""
    return shown, client, res


def label_sub(messages) -> str:
    return "negative" if "awful" in sub_text(messages) else '"positive"'


def test_map_with_labels_is_constrained_parsed_and_counted_by_code():
    code = ("labels = llm_map('Is this review positive or negative?', context.splitlines(), "
            "labels=['positive', 'negative'])\nprint(collections.Counter(labels))")
    shown, client, _ = run_cell(code, label_sub)
    assert "Counter({'positive': 8, 'negative': 4})" in shown
    subs = client.options
    assert len(subs) == 12
    # the host built the constraint: labels whose first letters differ are one reply token
    # under llama.cpp's grammar of the bare labels (the leaf costs no decoding step more)
    assert all(o["grammar"] == 'root ::= "positive" | "negative"' and o["max_tokens"] == 1
               for o in subs)


def test_labels_that_share_a_first_letter_are_a_json_schema_and_a_token_names_its_label():
    def sub(messages):
        return "neutral" if "awful" in sub_text(messages) else '"negative"'
    code = ("print(llm_map('Tone?', context.splitlines()[:3], labels=['negative', 'neutral']))")
    shown, client, _ = run_cell(code, sub)
    assert "['negative', 'negative', 'neutral']" in shown
    assert all(o["json_schema"] == {"type": "string", "enum": ["negative", "neutral"]}
               and o["max_tokens"] < 20 for o in client.options)
    leaf = LeafType.of(labels=["praise", "complaint"])
    assert [leaf.parse(t) for t in ("pr", "compl", "Praise", "x")] == \
        ["praise", "complaint", "praise", None]


def test_replies_out_of_the_set_become_none_and_are_reported():
    def sub(messages):
        return "I think it is mixed" if "User 1:" in sub_text(messages) else "negative"
    shown, _, _ = run_cell("print(llm_map('Sentiment?', context.splitlines()[:3], "
                           "labels=['positive', 'negative']))", sub)
    assert "[None, 'negative', 'negative']" in shown
    assert "1 replies did not fit the type" in shown


def test_other_providers_get_response_format_and_unconstrained_ones_nothing():
    _, client, _ = run_cell("llm_map('n?', ['a'], output='number')", lambda m: "7",
                            name="openai:fake")
    sub = client.options[0]
    assert sub["response_format"]["json_schema"]["schema"]["properties"]["value"] == \
        {"type": "number"}
    _, client, _ = run_cell("llm_map('n?', ['a'], output='number')", lambda m: "7",
                            name="replay:")
    sub = client.options[0]
    assert "json_schema" not in sub and "response_format" not in sub


@pytest.mark.parametrize("labels, output, reply, value", [
    (None, "number", "About 1,204 items.", 1204),
    (None, "int", "42", 42),
    (None, "bool", "Yes.", True),
    (None, {"name": "str", "age": "int"}, '{"name": "Ada", "age": 36}', {"name": "Ada", "age": 36}),
    (None, {"name": "str", "age": "int"}, '{"name": "Ada"}', None),
    (["red", "green"], None, "The answer is green", "green"),
    (["red", "green"], None, "red or green", None),
    (None, None, "  free text ", "free text"),
])
def test_leaf_types_parse(labels, output, reply, value):
    assert LeafType.of(labels, output).parse(reply) == value


def test_bad_types_are_clear_errors():
    with pytest.raises(ValueError, match="labels must be"):
        LeafType.of([], None)
    with pytest.raises(ValueError, match="field 'x' has kind 'float64'"):
        LeafType.of(None, {"x": "float64"})


def test_dry_run_states_calls_and_tokens_and_calls_no_model():
    code = ("e = llm_map('Sentiment?', context.splitlines(), labels=['a', 'b'], dry_run=True)\n"
            "print(e['calls'], e['tokens'] > 0, e['leaf_tokens'])\n"
            "print(llm_filter('Good?', context.splitlines(), dry_run=True)['calls'])")
    shown, client, _ = run_cell(code, window=4000)
    assert "12 True 2000" in shown and "\n12" in shown
    assert client.calls == []


def test_a_map_over_the_budget_is_refused_before_any_call():
    shown, client, res = run_cell("llm_map('Sentiment?', context.splitlines())", label_sub,
                                  max_subcalls=5)
    assert "needs 12 sub-calls but only 5 are left" in shown
    assert client.calls == [] and res.subcalls == 0


def test_an_item_too_long_for_the_sub_model_is_named():
    shown, client, _ = run_cell("llm_map('Sum?', ['short', 'x' * 20000])", window=2000)
    assert "#1 (~5,0" in shown and "chunk(text)" in shown
    assert client.calls == []


def test_chunk_sizes_overlap_and_default_from_the_window():
    text = "".join(f"line {i:04d} " + "w" * 30 + "\n" for i in range(400))   # ~4,400 tokens
    code = ("parts = chunk(context, 500, overlap=50)\n"
            "print(len(parts), max(len(p) for p in parts), all(p.endswith('\\n') "
            "for p in parts[:-1]))\n"
            "print(parts[0][-200:] in parts[1])\n"
            "print(''.join(chunk(context, 500)) == context)\n"
            "print(len(chunk(context)))")
    shown, _, _ = run_cell(code, window=2000, context=text)
    lines = shown.splitlines()
    n, longest, on_lines = lines[0].split()
    assert int(n) >= 9 and int(longest) <= 2000 and on_lines == "True"
    assert lines[1] == "True" and lines[2] == "True"
    assert int(lines[3]) == pytest.approx(len(text) / 4 / 900, abs=1.5)   # 0.9 of 1000-token leaves


def test_filter_reduce_and_pairs():
    def sub(messages):
        t = messages[-1]["content"]
        if "Question about the text:" in t:
            return "yes" if "awful" in sub_text(messages) else "no"
        return f"summary of {t.count('User')} users"
    code = ("bad = llm_filter('Is this a complaint?', context.splitlines())\n"
            "print(bad)\n"
            "print(llm_reduce('Summarize these.', context.splitlines()))\n"
            "ids = [l.split(':')[0] for l in context.splitlines()]\n"
            "labs = ['bad' if l in bad else 'good' for l in context.splitlines()]\n"
            "print(pairs(ids, labs, keep='bad'))\n"
            "print(len(pairs(range(5), where=lambda a, b: b == a + 1)))")
    shown, _, _ = run_cell(code, sub)
    assert "['User 3: awful, broken', 'User 6: awful, broken', 'User 9: awful, broken', " \
           "'User 12: awful, broken']" in shown
    assert "summary of 12 users" in shown
    assert "('User 3', 'User 6')" in shown and "('User 9', 'User 12')" in shown
    assert shown.count("('User") == 6
    assert "\n4\n" in shown


def test_reduce_goes_tree_wise_within_the_window_and_inside_its_bound():
    items = [f"fact {i}: " + "x" * 300 for i in range(40)]   # ~3,100 tokens in all
    code = (f"items = {items!r}\n"
            "e = llm_reduce('Combine.', items, max_tokens=50, dry_run=True)\n"
            "print(e['calls'], e['levels'])\n"
            "print(llm_reduce('Combine.', items, max_tokens=50))")
    shown, client, res = run_cell(code, lambda m: "combined " + str(len(m[-1]["content"])),
                                  window=2000)
    calls, levels = (int(x) for x in shown.splitlines()[0].split())
    subs = client.calls
    assert levels >= 2 and 1 < len(subs) <= calls
    assert all(len(c[-1]["content"]) // 4 <= 1000 + 200 for c in subs)   # each leaf fits
    assert "combined" in shown.splitlines()[1]


def test_raw_client_options_never_pass_from_sandboxed_code():
    code = ("print(llm_query('hi', grammar='root ::= \"x\"', json_schema={}, timeout=1, "
            "temperature=0.5))\n"
            "try:\n    llm_map('x', ['a'], json_schema={})\nexcept TypeError as e:\n"
            "    print('refused', e)")
    shown, client, _ = run_cell(code, lambda m: "fine")
    sub = client.options
    assert sub == [{"temperature": 0.5}]
    assert "refused" in shown


def test_combinators_and_preimported_modules_in_the_isolated_sandbox(tmp_path: Path):
    code = ("print(re.findall(r'User (\\d+): awful', context)[:2], math.floor(2.5), "
            "json.dumps([1]))\n"
            "print(llm_map('Sentiment?', context.splitlines()[:3], labels=['positive', "
            "'negative']))\nprint(len(chunk(context, 20)))\nSHOW_VARS()")
    trace = tmp_path / "t.jsonl"
    shown, _, _ = run_cell(code, label_sub, sandbox="local", trace=trace)
    assert "['3', '6'] 2 [1]" in shown
    assert "['positive', 'positive', 'negative']" in shown
    assert "No user variables defined." in shown   # helpers and modules are not variables
    evs = load_events(trace)
    comb = [e for e in evs if e.kind == "combinator"]
    # the span's updates are its progress: the last one says every leaf is done
    assert [e.phase for e in comb if e.phase != "update"] == ["start", "end"]
    updates = [e.data for e in comb if e.phase == "update"]
    assert updates and updates[-1]["done"] == updates[-1]["total"] == 3
    assert comb[0].data["estimate"]["calls"] == 3
    subs = [e for e in evs if e.kind == "subcall" and e.phase == "start"]
    assert len(subs) == 3 and all(e.parent == comb[0].id for e in subs)


def test_trace_keeps_the_typed_map_under_its_cell(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    run_cell("llm_map('Sentiment?', context.splitlines()[:2], labels=['a', 'b'])",
             lambda m: "a", trace=trace)
    evs = load_events(trace)
    start = next(e for e in evs if e.kind == "combinator" and e.phase == "start")
    cell = next(e for e in evs if e.id == start.parent)
    assert cell.kind == "cell"
    assert start.data["op"] == "llm_map" and start.data["type"] == "labels"
    json.dumps(start.data)


# ------------------------------------------------------------------ llm_rank
def test_yes_score_reads_the_first_tokens_logprobs_and_else_the_word():
    lp = {"Yes": math.log(0.6), "yes": math.log(0.1), "No": math.log(0.2), "The": math.log(0.1)}
    assert yes_score("Yes", lp) == pytest.approx(math.log(0.7) - math.log(0.2))
    # without logprobs (a client that gives none): the word itself
    assert yes_score("Yes.", None) == 1.0 and yes_score("no", None) == -1.0
    assert yes_score("Maybe", None) == 0.0
    # logprobs that name neither word fall back to the reply's word too
    assert yes_score("no", {"The": -0.1}) == -1.0


def test_first_logprobs_parses_the_openai_and_llama_cpp_shape():
    resp = {"choices": [{"logprobs": {"content": [{"token": "Yes", "logprob": -0.02,
            "top_logprobs": [{"token": "Yes", "logprob": -0.02}, {"token": "No", "logprob": -4.9},
                             {"token": "bad"}]}]}}]}
    assert first_logprobs(resp) == {"Yes": -0.02, "No": -4.9}
    assert first_logprobs({"choices": [{"message": {"content": "Yes"}}]}) is None
    assert first_logprobs(None) is None


def rank_item(messages) -> str:
    """The item a rank leaf reads ("Text: <item>\nQuestion: ...")."""
    return messages[-1]["content"].split("\nQuestion: ")[0].removeprefix("Text: ")


def _sure(p_yes: dict[str, float]):
    """A sub-model that says Yes to everything, more or less sure (by the item's first word)."""
    def reply(messages) -> Completion:
        if "Question: which?" not in messages[-1]["content"]:      # llm_filter's leaf
            return Completion(text='"yes"')
        p = p_yes[rank_item(messages).split()[0]]
        return Completion(text="Yes", first_logprobs={"Yes": math.log(p),
                                                      "No": math.log(1 - p)})
    return reply


def test_rank_orders_items_by_how_sure_the_yes_is(tmp_path: Path):
    """Every item gets a yes (as the 1.5B gives one to every look-alike), so a filter keeps them
    all; the rank still puts the surest first, asks for one token and its alternatives, and
    traces the scores."""
    code = ("items = ['alpha one', 'beta two', 'gamma three', 'delta four']\n"
            "print(llm_filter('which?', items))\nprint(llm_rank('which?', items))\n"
            "print(llm_rank('which?', items, k=2))\nprint(llm_rank('which?', items, dry_run=True))")
    trace = tmp_path / "t.jsonl"
    shown, client, _ = run_cell(code, _sure({"alpha": 0.6, "beta": 0.9, "gamma": 0.55,
                                             "delta": 0.7}), trace=trace)
    assert "['alpha one', 'beta two', 'gamma three', 'delta four']" in shown     # filter: all
    assert "['beta two', 'delta four', 'alpha one', 'gamma three']" in shown
    assert "['beta two', 'delta four']\n" in shown
    assert "'calls': 4" in shown
    ranks = [o for o in client.options if o.get("logprobs")]
    assert len(ranks) == 8 and all(o["max_tokens"] == 1 and o["top_logprobs"] == 10
                                   for o in ranks)
    end = [e for e in load_events(trace) if e.kind == "combinator" and e.phase == "end"
           and e.data["op"] == "llm_rank"][0]
    assert end.data["scores"][1] == pytest.approx(math.log(0.9) - math.log(0.1), abs=1e-3)


def test_rank_without_logprobs_orders_by_the_word_and_keeps_failures_last():
    def reply(messages):
        t = rank_item(messages)
        return RuntimeError("down") if t == "c" else ("no" if t == "a" else "yes")
    shown, _, _ = run_cell("print(llm_rank('q?', ['a', 'b', 'c', 'd']))", reply)
    assert "['b', 'd', 'a', 'c']" in shown
