"""The planned mode (RLM(strategy="plan")) with a scripted root and sub-model, real sandboxes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recursa import RLM
from recursa.bench.methods import MethodConfig, parse_method
from recursa.core.combinators import leaf_item
from recursa.core.prompts import system_prompt
from recursa.core.strategies import plan as pl
from recursa.core.strategies.plans.label_count import query_choices
from recursa.frontend.options import RLMOptions
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load_events

REVIEWS = "\n".join(f"User {i}: " + ("I love it" if i % 3 else "awful, broken")
                    for i in range(1, 31))


def is_planner(messages) -> bool:
    return messages[0]["content"].startswith("You plan")


def is_answer_call(messages) -> bool:
    return messages[0]["content"] == pl.ANSWER_SYSTEM


def is_pair_call(messages) -> bool:
    return "asks for pairs of ids" in messages[0]["content"]


def is_count_call(messages) -> bool:
    return (messages[0]["content"].startswith("A program has labelled every record")
            and not is_pair_call(messages))


# retrievals with search() (the search extra); without it the plan reads every chunk instead
needs_search = pytest.mark.skipif(
    not __import__("recursa.core.search_host").core.search_host.available(),
    reason="the search extra is not installed")


def scripted(plan: dict | str, *code_turns: str, answer: str = "none",
             count: str = '{"op": "other"}', pair: str = "not a rule"):
    """A root that answers the planning call with `plan`, the count choice after a labelling
    plan with `count`, the pair rule after a pairs plan with `pair` and the call that answers
    from the plan's results with `answer` ("none": go on), then writes `code_turns`."""
    state = {"i": 0}

    def respond(messages):
        if is_planner(messages):
            return plan if isinstance(plan, str) else json.dumps(plan)
        if is_pair_call(messages):
            return pair
        if is_count_call(messages):
            return count
        if is_answer_call(messages):
            return answer
        reply = code_turns[min(state["i"], len(code_turns) - 1)]
        state["i"] += 1
        return f"```repl\n{reply}\n```"
    return ReplayClient(respond, name="local:fake-root")


def sentiment(messages) -> str:
    return "negative" if "awful" in leaf_item(messages[-1]["content"]) else "positive"


def run(root, sub=sentiment, context=REVIEWS, trace: Path | None = None,
        query: str = "How many reviews are negative?", **kw):
    sub_client = ReplayClient(sub, name="local:fake-sub")
    rlm = RLM(model=root, sub_model=sub_client, sandbox="inprocess", strategy="plan",
              preflight=False, trace_path=trace, **kw)
    return rlm.completion(query, context=context), sub_client


def first_code_message(root: ReplayClient) -> str:
    return next(c for c in root.calls if not is_planner(c) and not is_answer_call(c)
                and not is_count_call(c) and not is_pair_call(c))[1]["content"]


def test_label_count_plan_runs_with_a_bound_shown_first_and_the_root_answers(tmp_path):
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"},
                    "FINAL(str(label_counts['negative']))")
    trace = tmp_path / "t.jsonl"
    res, sub = run(root, trace=trace)
    assert res.status == "final" and res.answer == "10"
    # plan, count choice ("other"), answer call ("none"), code
    assert len(sub.calls) == 30 and res.turns == 4
    # the planning call was constrained by the plans' schema, inlined (no $ref)
    opts = root.options[0]
    assert "$ref" not in json.dumps(opts["json_schema"]) and opts["temperature"] == 0.0
    msg = first_code_message(root)
    assert "negative: 10" in msg and "at most 30 sub-calls" in msg
    evs = load_events(trace)
    kinds = [(e.kind, e.phase) for e in evs]
    bound = kinds.index(("plan", "point"))
    assert bound < kinds.index(("subcall", "start"))          # the bound before any sub-call
    point = evs[bound]
    assert point.data["bound"]["calls"] == 30 and point.data["plan_kind"] == "label_count"
    assert ("plan", "end") in kinds


def test_the_root_answers_from_the_plans_results_in_one_plain_call(tmp_path):
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"},
                    "FINAL('never reached')", answer="10")
    trace = tmp_path / "t.jsonl"
    res, sub = run(root, trace=trace)
    assert (res.status, res.answer, res.turns) == ("final", "10", 3)
    asked = [c for c in root.calls if is_answer_call(c)]
    assert len(asked) == 1 and len(root.calls) == 3          # no code turn
    assert "How many reviews are negative?" in asked[0][1]["content"]
    assert "negative: 10" in asked[0][1]["content"]
    end = [e for e in load_events(trace) if e.kind == "turn" and e.phase == "end"][-1]
    assert end.data["plan_answer"] == "10"


@pytest.mark.parametrize("answer", ["none", "None.", "```repl\nFINAL('10')\n```"])
def test_an_answer_call_that_gives_none_or_code_goes_on_in_the_code_loop(answer):
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"},
                    "FINAL(str(label_counts['negative']))", answer=answer)
    res, _ = run(root)
    assert (res.status, res.answer, res.turns) == ("final", "10", 4)
    assert "negative: 10" in first_code_message(root)


SHOPS = "\n".join(f"Shop: {'North' if i % 2 else 'South'} | " +
                    ("awful, broken" if i % 3 == 0 or (i % 2 and i < 12) else "I love it")
                    for i in range(1, 25))


@pytest.mark.parametrize("op, query, answer", [
    ("how_many", "How many negative reviews are there?", "12"),
    ("how_many", "How many negative reviews did North get?", "8"),
    ("how_many_more", "How many more negative reviews did North get than South?", "4"),
    ("how_many_more", "By how many negative reviews does South trail North?", "-4"),
    ("which_most", "Which shop got the most negative reviews?", "North"),
    ("which_fewest", "Which shop got the fewest negative reviews?", "South"),
])
def test_after_a_labelling_plan_the_root_chooses_a_count_and_the_repl_computes_it(
        tmp_path, op, query, answer):
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive",
                     "group_by": "Shop"}, "FINAL('never reached')", answer="999",
                    count=json.dumps({"op": op}))
    trace = tmp_path / "t.jsonl"
    res, _ = run(root, context=SHOPS, trace=trace, query=query)
    # North (odd i): 1, 3, 5, 7, 9, 11, 15, 21 negative = 8; South: 6, 12, 18, 24 = 4
    assert (res.status, res.answer, res.turns) == ("final", answer, 2)
    asked = [c for c in root.calls if is_count_call(c)][0]
    assert "as positive or negative" in asked[0]["content"] and query in asked[1]["content"]
    assert "per Shop" in asked[0]["content"]
    assert not [c for c in root.calls if is_answer_call(c)]     # the plain call never ran
    end = [e for e in load_events(trace) if e.kind == "turn" and e.phase == "end"][-1]
    assert end.data["count_op"] == op and end.data["plan_answer"] == answer


@pytest.mark.parametrize("count, query", [
    ('{"op": "other"}', "How many negative reviews did North get?"),
    ("not json", "How many negative reviews did North get?"),
    # a count the results cannot give: two groups named for one count, none for a difference
    ('{"op": "how_many"}', "How many negative reviews did North and South get?"),
    ('{"op": "how_many_more"}', "How many more negative reviews than positive ones?"),
])
def test_a_count_the_results_cannot_give_leaves_the_answer_to_the_plain_call(count, query):
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive",
                     "group_by": "Shop"}, "FINAL('never reached')", answer="8", count=count)
    res, _ = run(root, context=SHOPS, query=query)
    assert (res.status, res.answer, res.turns) == ("final", "8", 3)


def test_a_tie_for_most_is_not_an_answer_and_groups_match_whole_words():
    ns = {"re": __import__("re"), "label_counts": {"neg": 5},
          "group_counts": {"Oak": {"neg": 2}, "Oakley": {"neg": 2}, "Elm": {"neg": 1}}}
    out = {}
    for op, q in [("which_most", "Which shop got most?"), ("how_many", "How many at Oakley?"),
                  ("how_many_more", "How many more at Elm than at Oak?")]:
        code = pl.count_code(op, q, "neg").replace("print(repr(plan_answer))", "")
        exec(code, ns)
        out[op] = ns["plan_answer"]
    assert out == {"which_most": None, "how_many": 2, "how_many_more": -1}


def test_parse_count_choice_and_scalar_answer():
    assert pl.parse_count_choice('{"op": "which_most"}') == "which_most"
    assert pl.parse_count_choice("how_many_more") == "how_many_more"
    assert pl.parse_count_choice('{"op": "other"}') is None
    assert pl.parse_count_choice('{"op": "sum"}') is None and pl.parse_count_choice("") is None
    assert pl.scalar_answer(14) == "14" and pl.scalar_answer(6.0) == "6"
    assert pl.scalar_answer(2.5) == "2.5" and pl.scalar_answer(" Oakley ") == "Oakley"
    assert pl.scalar_answer(True) is None and pl.scalar_answer([1]) is None
    assert pl.scalar_answer("") is None and pl.scalar_answer(None) is None


def _vault_run(monkeypatch=None):
    text = ("filler line about nothing\n" * 300 + "The vault code is 4417.\n" +
            "more filler here\n" * 300)

    def sub(messages):
        t = messages[-1]["content"]
        piece = leaf_item(t)
        if "Question about the text:" in t:
            return "yes" if "vault" in piece else "no"
        return "4417" if "vault" in piece else "none"
    root = scripted({"plan": "retrieve_read", "question": "What is the vault code?",
                     "keywords": []}, "FINAL(plan_answers[0])")
    sub_client = ReplayClient(sub, name="local:fake-sub")
    sub_client.context_window = 2048          # several pieces
    rlm = RLM(model=root, sub_model=sub_client, sandbox="inprocess", strategy="plan",
              preflight=False)
    res = rlm.completion("What is the vault code?", context=text)
    assert res.answer == "4417"
    filters = [c for c in sub_client.calls if "Question about" in c[-1]["content"]]
    reads = [c for c in sub_client.calls if "Question about" not in c[-1]["content"]]
    return root, filters, reads


def test_retrieve_read_without_search_filters_chunks_then_reads_the_relevant_ones(monkeypatch):
    from recursa.core import search_host

    async def no_search(payload, args):
        raise RuntimeError("search is not installed")
    monkeypatch.setattr(search_host, "search", no_search)
    root, filters, reads = _vault_run()
    assert len(filters) >= 3 and len(reads) == 1
    assert "1 read; answers: ['4417']" in first_code_message(root)


def test_retrieve_read_with_search_reads_only_the_searched_passages():
    root, filters, reads = _vault_run()
    assert not filters and 1 <= len(reads) <= 16     # k=8 windows, merged, cut to fit a leaf
    assert "found by search()" in first_code_message(root)
    assert "answers: ['4417']" in first_code_message(root)


def test_a_chained_lookup_feeds_the_first_answer_into_the_second_question():
    text = "Ada's manager is Grace.\n" + "x\n" * 50 + "Grace works in Lyon.\n"

    def sub(messages):
        t = messages[-1]["content"]
        if "Question about" in t:
            return "yes"
        if "Who is Ada's manager" in t:
            return "Grace"
        if "Where does Grace work" in t:
            return "Lyon"
        return "none"
    root = scripted({"plan": "chained_lookup", "first_question": "Who is Ada's manager?",
                     "second_question": "Where does {answer} work?"}, "FINAL(plan_answers[0])")
    res, _ = run(root, sub=sub, context=text)
    assert res.answer == "Lyon"
    assert "first answer: Grace" in first_code_message(root)


def test_pairs_plan_pairs_ids_by_code():
    root = scripted({"plan": "pairs", "instruction": "Is this review negative?",
                     "labels": ["positive", "negative"], "keep": ["negative"],
                     "id_prefix": "User"}, "FINAL(str(len(plan_pairs)))")
    res, _ = run(root)
    assert res.answer == "45"                      # 10 negative users: 10 * 9 / 2
    assert "('3', '6')" in first_code_message(root)


# users 1-5: 1 three complaints; 2 two complaints, one praise; 3 three praises; 4 one
# complaint, two praises; 5 one praise
USERS = "\n".join(f"User {u}: " + ("awful, broken" if bad else "I love it")
                   for u, bad in [(1, 1), (2, 1), (3, 0), (1, 1), (4, 1), (2, 0), (3, 0),
                                  (1, 1), (4, 0), (5, 0), (2, 1), (3, 0), (4, 0)])
PAIRS_PLAN = {"plan": "pairs", "instruction": "Label every record, then list the pairs.",
              "labels": ["positive", "negative"], "keep": ["negative"], "id_prefix": "User"}


def rule(a: str, a_min: int, a_max: int | None, b: str, b_min: int, b_max: int | None) -> str:
    return json.dumps({"first_label": a, "first_min": a_min, "first_max": a_max,
                       "second_label": b, "second_min": b_min, "second_max": b_max})


@pytest.mark.parametrize("pair, answer", [
    (rule("negative", 2, None, "positive", 2, None), "(1, 3)\n(1, 4)\n(2, 3)\n(2, 4)"),
    (rule("positive", 2, None, "negative", 2, None), "(1, 3)\n(1, 4)\n(2, 3)\n(2, 4)"),
    (rule("negative", 2, None, "negative", 2, None), "(1, 2)"),
    (rule("negative", 0, 0, "negative", 0, 0), "(3, 5)"),
    (rule("negative", 9, None, "positive", 0, None), "No pair meets the condition."),
])
def test_after_a_pairs_plan_the_root_writes_a_rule_and_the_repl_builds_the_pairs(
        tmp_path, pair, answer):
    root = scripted(PAIRS_PLAN, "FINAL('never reached')", answer="(9, 9)", pair=pair)
    trace = tmp_path / "t.jsonl"
    res, sub = run(root, context=USERS, trace=trace, query="Which pairs of users ...?")
    assert (res.status, res.answer, res.turns) == ("final", answer, 2)
    # the leaves name the sides the other way round from the plan, its first side last
    assert all("better: negative or positive?" in c[-1]["content"] for c in sub.calls)
    asked = [c for c in root.calls if is_pair_call(c)][0]
    assert '"positive", "negative"' in asked[0]["content"]
    assert not [c for c in root.calls if is_answer_call(c)]     # the plain call never ran
    events = load_events(trace)
    printed = " ".join(str(e.data.get("output")) for e in events if e.kind == "cell")
    assert "  2: positive 1, negative 2" in printed
    end = [e for e in events if e.kind == "turn" and e.phase == "end"][-1]
    assert end.data["pair_rule"] == json.loads(pair) and end.data["plan_answer"] == answer


@pytest.mark.parametrize("pair", [
    "not json",
    rule("angry", 2, None, "positive", 2, None),        # a label outside the plan's set
    rule("negative", 3, 1, "positive", 2, None),        # no count is at least 3 and at most 1
    '{"first_label": "negative", "first_min": -1}',
])
def test_a_pair_rule_that_is_not_one_leaves_the_answer_to_the_plain_call(pair):
    root = scripted(PAIRS_PLAN, "FINAL('never reached')", answer="(1, 2)", pair=pair)
    res, _ = run(root, context=USERS, query="Which pairs of users ...?")
    assert (res.status, res.answer, res.turns) == ("final", "(1, 2)", 3)


def test_the_pair_rules_schema_holds_its_labels_to_the_plans():
    schema = pl.pair_schema(["positive", "negative"])
    assert schema["properties"]["first_label"]["enum"] == ["positive", "negative"]
    assert schema["properties"]["second_label"]["enum"] == ["positive", "negative"]



def test_a_record_without_the_id_prefix_is_nobodys_and_unlabelled_ids_meet_no_upper_bound(
        tmp_path):
    """A line that names no user is not "user 3" (its number), and a user whose record got no
    label is not known to have "no complaint"."""
    text = USERS + "\nA note without a user: awful, broken\nUser 6: ???"

    def sub(messages):
        piece = leaf_item(messages[-1]["content"])
        return "" if "???" in piece else sentiment(messages)
    root = scripted(PAIRS_PLAN, "FINAL('never reached')", answer="(9, 9)",
                    pair=rule("negative", 0, 0, "negative", 0, 0))
    trace = tmp_path / "t.jsonl"
    res, _ = run(root, sub=sub, context=text, trace=trace, query="Which pairs of users ...?")
    # user 3 and 5 wrote no complaint; the note is nobody's; user 6's review has no label
    assert (res.status, res.answer) == ("final", "(3, 5)")
    printed = " ".join(str(e.data.get("output")) for e in load_events(trace) if e.kind == "cell")
    assert "  3: positive 3, negative 0" in printed and "  6: positive 0, negative 0" in printed


def test_committed_and_last_value_read_a_cell():
    from types import SimpleNamespace as NS
    assert pl.committed(NS(answer={"content": "(1, 2)", "ready": True})) == "(1, 2)"
    assert pl.committed(NS(answer={"content": "(1, 2)", "ready": False})) is None
    assert pl.committed(NS(answer={"content": " ", "ready": True})) is None
    assert pl.last_value(NS(stdout="x\n[('1', '2')]\n")) == [("1", "2")]
    assert pl.last_value(NS(stdout="")) is None and pl.last_value(NS(stdout="a b")) is None
    assert pl.parse_pair_rule(rule("Negative", 1, None, "POSITIVE", 1, None),
                              ["positive", "negative"]).first_label == "negative"


@pytest.mark.parametrize("reply, why", [
    ("I would search for it.", "not a valid plan"),
    ('{"plan": "label_count", "label": "only one"}', "not a valid plan"),
    ('{"plan": "label_count", "label": "code", "opposite": "Code "}',
     "label and opposite must differ"),
])
def test_a_bad_plan_falls_back_to_code_saying_so(reply, why):
    root = scripted(reply, "FINAL(str(len(context.splitlines())))")
    res, sub = run(root)
    assert res.answer == "30" and sub.calls == []
    assert why in first_code_message(root)


def test_the_code_plan_and_a_plan_over_budget_leave_the_code_mode_as_it_was():
    root = scripted({"plan": "code"}, "FINAL(str(len(context.splitlines())))")
    res, sub = run(root)
    assert res.answer == "30" and "plan" not in first_code_message(root).lower()
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"}, "FINAL('x')")
    res, sub = run(root, max_subcalls=5)
    assert sub.calls == []
    assert "its bound of 30 sub-calls is over the budget" in first_code_message(root)


def test_plan_schema_accepts_every_plan_and_parse_reads_wrapped_replies():
    import jsonschema
    schema = pl.plan_schema()
    for plan in ({"plan": "code"}, {"plan": "chained_lookup", "first_question": "a",
                                    "second_question": "b {answer}"}):
        jsonschema.validate(plan, schema)
        assert pl.parse(json.dumps({"choice": plan})).plan == plan["plan"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"plan": "label_count", "label": "x"}, schema)


def test_auto_picks_plan_for_small_models_only():
    from recursa.core.strategy import choose
    assert choose("auto", "local:qwen2.5-coder-1.5b")[0] == "plan"
    assert choose("auto", "openai:qwen2.5-7b-instruct")[0] == "plan"
    assert choose("auto", "openai:gpt-5")[0] == "code"
    assert choose("auto", "openai:llama-70b")[0] == "code"
    assert choose("code", "local:qwen2.5-coder-1.5b") == ("code", "asked for")
    # the library's default is auto: a user who gives no strategy gets the mode for the model
    assert RLM(model=ReplayClient([])).strategy == "auto"
    with pytest.raises(ValueError, match="strategy must be one of"):
        RLM(model=ReplayClient([]), strategy="planned")


def test_strategy_reaches_the_cli_options_and_the_bench_label():
    assert RLMOptions(model="replay:", strategy="plan").rlm_kwargs()["strategy"] == "plan"
    name, depth, _ = parse_method("rlm-d2-plan")
    cfg = MethodConfig(method=name, depth=depth, model="replay:")
    assert (cfg.method, cfg.strategy, cfg.label) == ("rlm", "plan", "rlm-d2-plan")
    cfg = MethodConfig(method="rlm", strategy="auto", model="replay:")
    assert cfg.label == "rlm-auto"
    assert MethodConfig(method="rlm", model="replay:").label == "rlm"


def test_the_worked_example_is_optional_and_plain_questions_are_named():
    with_ex = system_prompt(context_type="str", max_output_chars=8192)
    without = system_prompt(context_type="str", max_output_chars=8192, example=False)
    assert "Ada meeting" in with_ex and "Ada meeting" not in without
    for p in (with_ex, without):
        assert "len(context.splitlines())" in p and "llm_map(" in p and "pairs(" in p


def test_plain_line_count_without_importing_re():
    """The issue's failure: `re` was not imported and the count was off by a trailing newline."""
    root = ReplayClient(['```repl\nn = len(re.findall("\\n", context))\nprint(n)\n```',
                         "```repl\nFINAL(str(len(context.splitlines())))\n```"])
    res = RLM(model=root, sandbox="inprocess", example=False,
              preflight=False).completion("How many lines does the context have?",
                                          context="a\n" * 1200)
    assert res.answer == "1200"
    assert "1200" in root.calls[1][-1]["content"]
    assert "Ada meeting" not in root.calls[0][0]["content"]


def test_the_plan_leaves_its_results_but_not_its_helpers_in_the_repl():
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"}, "SHOW_VARS()", "FINAL('x')")
    run(root)
    shown = [c for c in root.calls if not is_planner(c) and not is_answer_call(c)
             and not is_count_call(c)][1][-1]["content"]
    assert "label_counts: Counter" in shown and "records: list" in shown
    assert "_plan" not in shown and "plan_bound" not in shown


def test_the_live_view_shows_the_bound_before_the_plan_runs():
    import io

    from rich.console import Console

    from recursa.base.types import Event
    from recursa.obs.console import ConsoleView
    buf = io.StringIO()
    view = ConsoleView(Console(file=buf, width=120))
    try:
        view.emit(Event(kind="plan", id="p1", phase="point", data={
            "plan_kind": "label_count", "bound": {"calls": 30, "tokens": 1240,
                                                  "cost_usd": 0.0012}}))
    finally:
        view.close()
    assert "plan label_count: at most 30 sub-calls, 1,240 tokens, $0.0012" in buf.getvalue()


def test_the_record_question_names_both_sides_opposite_first():
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive"},
                    "FINAL(str(label_counts['negative']))")
    res, sub = run(root)
    assert res.answer == "10" and len(sub.calls) == 30
    leaf = sub.calls[0][-1]["content"]
    assert leaf.startswith("Which fits the text better: positive or negative?")
    msg = first_code_message(root)
    assert "negative: 10" in msg and "positive: 20" in msg


GROUPED = "\n".join(f"Review {i} | Shop: {'North' if i % 2 else 'South'} | Text: "
                     + ("awful, broken" if i % 5 == 0 or (i % 2 and i % 3 == 0) else "I love it")
                     for i in range(1, 31))


def test_group_by_counts_the_judgements_per_value_of_a_record_field():
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive",
                     "group_by": "shop"},
                    "FINAL(max(group_counts, key=lambda g: group_counts[g]['negative']))")
    res, sub = run(root, context=GROUPED, query="Which shop got the most negative reviews?")
    north = sum(1 for i in range(1, 31, 2) if i % 5 == 0 or i % 3 == 0)     # 7
    south = sum(1 for i in range(2, 31, 2) if i % 5 == 0)                   # 3
    msg = first_code_message(root)
    assert f"North: {15 - north} positive, {north} negative" in msg
    assert f"South: {15 - south} positive, {south} negative" in msg
    assert f"most negative: North ({north}) | fewest negative: South ({south})" in msg
    assert res.answer == "North"


def test_group_by_a_field_no_record_has_says_so():
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive",
                     "group_by": "Team"}, "FINAL(str(label_counts['negative']))")
    res, _ = run(root, context=GROUPED, query="How many reviews are negative?")
    assert "no record has a field 'Team'" in first_code_message(root)
    assert res.answer == "10"


@pytest.mark.parametrize("query, kind", [
    ("What code opens the bike shed at the jail? Answer with the number only.", "retrieve_read"),
    ("How many reviews are negative?", "label_count"),
    ("Which shop received the fewest complaints?", "label_count"),
    ("There is more than one code for the shed. List them.", "retrieve_read"),
    # a quantity the text states is a lookup, however it is asked (issue 34: "how many days" in
    # a licence was read as a count of every line)
    ("Within how many days must you cure the violation?", "retrieve_read"),
    ("How many years must the written offer stay valid?", "retrieve_read"),
    ("How many words may a cover text have at most?", "retrieve_read"),
    ("For at least how long must the copy stay online?", "retrieve_read"),
    ("How much time does the holder have to notify you?", "retrieve_read"),
    ("What number of days is the notice period?", "retrieve_read"),
    # ... and records counted stay counts, units included
    ("How many days had at least one outage?", "label_count"),
    ("How many of the notes say the pump leaked?", "label_count"),
    ("How many reviews from the last 30 days are negative?", "label_count"),
    ("Which year had the most complaints?", "label_count"),
    ("How many weeks with a late delivery are in the log?", "label_count"),
])
def test_a_labelling_plan_is_kept_only_for_a_query_that_asks_for_an_aggregate(query, kind):
    plan = pl.parse(json.dumps({"plan": "label_count", "label": "code", "opposite": "other"}))
    fitted = pl.fits(plan, query)
    assert fitted.plan == kind
    if kind == "retrieve_read":
        assert fitted.question == query


@needs_search
def test_a_misread_labelling_plan_runs_as_a_retrieval_of_the_query():
    root = scripted({"plan": "label_count", "label": "code", "opposite": "none"},
                    "FINAL(plan_answers[0])")
    res, sub = run(root, sub=lambda m: "4827193" if "User 7:" in m[-1]["content"] else "none",
                   query="Which code does user 7 use? Answer with the number only.")
    assert "retrieve_read" in first_code_message(root)
    assert res.answer == "4827193"


@needs_search
def test_an_invalid_labelling_plan_for_a_plain_question_runs_as_a_retrieval_too():
    # one label for both sides is not a valid plan; for a query that asks for no aggregate it is
    # the same misreading, and the retrieval runs instead of a fall-back to code
    root = scripted({"plan": "label_count", "label": "code", "opposite": "code"},
                    "FINAL(plan_answers[0])")
    res, _ = run(root, sub=lambda m: "4827193" if "User 7:" in m[-1]["content"] else "none",
                 query="Which code does user 7 use? Answer with the number only.")
    assert "retrieve_read" in first_code_message(root) and res.answer == "4827193"
    # for an aggregate it stays an invalid plan, and the code mode says so
    root = scripted({"plan": "label_count", "label": "bad", "opposite": "bad"},
                    "FINAL(str(len(context)))")
    run(root)
    assert "not a valid plan" in first_code_message(root)


@needs_search
def test_a_guess_that_search_finds_nothing_for_is_replaced_by_the_question(monkeypatch):
    from recursa.core import search_host
    real, asked = search_host.search, []

    async def search(payload, args):
        asked.append(args["query"])
        return [] if args["query"] == "1" else await real(payload, args)
    monkeypatch.setattr(search_host, "search", search)
    text = "filler line about nothing\n" * 300 + "The vault code is 4417.\n" + "more\n" * 300

    def sub(messages):
        t = messages[-1]["content"]
        if t.startswith("Write one short sentence"):
            return "1"                    # the 1.5B obeying "answer with the number only"
        return "4417" if "vault" in leaf_item(t) else "none"
    root = scripted({"plan": "retrieve_read", "question": "What is the vault code?",
                     "keywords": []}, "FINAL(plan_answers[0])")
    res, _ = run(root, sub=sub, context=text, query="What is the vault code?")
    assert asked[-2:] == ["1", "What is the vault code?"] and res.answer == "4417"


@needs_search
def test_each_reader_reads_a_short_piece_and_a_no_in_its_own_words_is_not_an_answer():
    text = "filler line about nothing in particular\n" * 400 + "The vault code is 4417.\n" + \
        "more filler of no interest at all\n" * 400
    read: list[str] = []

    def sub(messages):
        t = messages[-1]["content"]
        if t.startswith("Write one short sentence"):
            return "The vault code is 1234."
        read.append(leaf_item(t))
        return "4417" if "vault" in leaf_item(t) else "The text does not specify the code."
    root = scripted({"plan": "retrieve_read", "question": "What is the vault code?",
                     "keywords": []}, "FINAL(str(plan_answers))")
    res, _ = run(root, sub=sub, context=text, query="What is the vault code?")
    assert read and max(len(p) for p in read) < 1800        # ~320 tokens a read, not a window
    assert res.answer == "['4417']"                          # the readers' "does not specify" dropped


def test_a_header_before_records_that_share_their_fields_is_not_a_record():
    header = "Shop reviews, one per line: the shop, then the words"
    root = scripted({"plan": "label_count", "label": "negative", "opposite": "positive",
                     "group_by": "Shop"}, "FINAL('never reached')", answer="12")
    res, sub = run(root, context=header + "\n" + SHOPS,
                   query="How many negative reviews are there?")
    assert (res.status, res.answer) == ("final", "12") and len(sub.calls) == 24
    shown = [c for c in root.calls if is_answer_call(c)][0][1]["content"]
    assert "1 leading line(s) not in the records' form, left out: 'Shop reviews" in shown
    assert "24 records labelled" in shown


def test_with_sources_asked_a_retrievals_answer_carries_the_passage_its_reader_answered_from():
    """RLM(sources=True) in plan mode: the runtime attaches the pieces whose reader gave the
    answer (checked and located like any source), not the model."""
    lines = [f"Note {i}: ticket {1000 + i} was closed without changes." for i in range(400)]
    lines[250] = "Note 250: the wifi password of the Oslo office is fjord-2291."
    text = "\n".join(lines)

    def sub(messages):
        t = messages[-1]["content"]
        if "Question about the text:" in t:
            return "yes" if "wifi" in leaf_item(t) else "no"
        if t.startswith("Write one short sentence"):
            return "The wifi password is fjord-2291."
        piece = leaf_item(t)
        return "The password is fjord-2291." if "fjord" in piece else "none"
    root = scripted({"plan": "retrieve_read", "question": "What is the Oslo wifi password?",
                     "keywords": ["wifi"]}, "FINAL('never reached')", answer="fjord-2291")
    res, _ = run(root, sub=sub, context=text, query="What is the Oslo wifi password?",
                 sources=True)
    assert (res.status, res.answer) == ("final", "fjord-2291")
    found = [s for s in res.sources if s.found]
    assert found and all(s.found for s in res.sources)
    assert any(s.location is not None and s.location.line == 251 and "fjord-2291" in (s.text or "")
               for s in found), [(s.text, s.location) for s in res.sources]


# the query's condition reaches the leaves: many phrasings, a root that picked coarse labels
@pytest.mark.parametrize("query, label, opposite, judged", [
    ("How many customer messages complain they were billed the wrong amount?", "complain",
     "satisfied", "query"),
    ("Count the messages where the customer says the charge on the bill was too high.",
     "complaint", "other", "query"),
    ("How many of these reviews are negative?", "negative", "positive", "labels"),
    ("Which desk's notes are most often negative here: North or South? Answer with the "
     "desk's name only.", "negative", "positive", "labels"),
    ("How many notes say the pump leaked?", "leaked", "dry", "labels"),    # one word unsaid
    ("How many notes say the old pump leaked oil?", "leaked", "dry", "query"),
    # a word and its inflection are one unsaid word ("renters", "rented"), two others are not
    ("How many renters here were unhappy with what they rented?", "unhappy", "happy", "labels"),
    ("How many tenants here were unhappy with what they paid?", "unhappy", "happy", "query"),
    ("How many of the notes say the pump leaked?", "pump leaked", "dry", "labels"),
    ("What number of tickets were reopened after being closed?", "reopened", "closed",
     "labels"),
    ("What number of tickets were reopened by the night shift?", "reopened", "closed",
     "query"),
])
def test_the_leaves_judge_the_querys_whole_condition(query, label, opposite, judged):
    records = "\n".join(f"Note {i} | Desk: {'North' if i % 2 else 'South'} | " +
                        ("the pump leaked again" if i % 3 else "all dry") for i in range(1, 13))
    root = scripted({"plan": "label_count", "label": label, "opposite": opposite},
                    "FINAL('never reached')", count='{"op": "how_many"}')
    res, sub = run(root, sub=lambda m: "yes" if m[-1]["content"].startswith("Does the text")
                   else label, context=records, query=query)
    asked = sub.calls[0][-1]["content"]
    if judged == "query":
        assert asked.startswith('Does the text below match this description: "'
                                + pl.condition_phrase(query) + '"?'), asked
        assert sub.options[0]["grammar"] == 'root ::= "no" | "yes"'
    else:
        assert asked.startswith(f"Which fits the text better: {opposite} or {label}?"), asked
    # either way the counts are in the plan's own labels
    assert res.answer == "12", (res.answer, res.status)


def test_condition_words_leave_out_the_frame_and_names():
    assert pl.condition_words("Which site's reviews are most often negative here: Amazon, IMDb "
                              "or Yelp? Answer with the site's name only.") == \
        ["site", "negative"]
    assert pl.condition_phrase("How many of the notes below are about a food or a drink? "
                               "Answer with a number.") == "about a food or a drink"
    assert pl.condition_words("How many customer messages complain they were billed the wrong "
                              "amount?") == ["customer", "complain", "billed", "wrong", "amount"]


def test_a_negated_opposite_is_asked_as_other():
    """The 1.5B picks a side that repeats the record's topic word: "non-food or food?" found 12
    of 30 dev foods, "other or food?" 25 (benchmarks/probes/opposite.py)."""
    assert pl.plain_opposite("food", "non-food") == "other"
    assert pl.plain_opposite("animal", "not an animal") == "other"
    assert pl.plain_opposite("negative", "positive") == "positive"
    assert pl.plain_opposite("animal", "no animal") == "other"
    assert pl.plain_opposite("food", "Non food") == "other"
    # an antonym of its own stays (dev reviews: half the false positives of "other")
    assert pl.plain_opposite("favourable", "unfavourable") == "unfavourable"
    assert pl.plain_opposite("happy", "unhappy") == "unhappy"
    assert pl.plain_opposite("praise", "dispraise") == "dispraise"
    assert pl.plain_opposite("cracked", "intact") == "intact"
    assert pl.LabelCount(plan="label_count", label="food", opposite="non-food").labels == \
        ["other", "food"]


def test_a_root_model_that_fails_the_planning_call_ends_the_run_as_in_the_code_mode():
    from recursa.base.types import ModelError
    root = ReplayClient([ModelError("local:fake-root died: SIGKILL", retryable=False)],
                        name="local:fake-root")
    res, sub = run(root)
    assert res.status == "error" and "SIGKILL" in res.error
    assert sub.calls == [] and len(root.calls) == 1      # no fall-back turn on a dead model


@pytest.mark.parametrize("query, choices", [
    ("Which kind of thing do the most of these notes describe: tools, fruits or birds?",
     ["tools", "fruits", "birds"]),
    ("Of tools, fruits, birds and boats, which is described by the most entries?",
     ["tools", "fruits", "birds", "boats"]),
    ("Which colour is commonest: red, green, or blue?", ["red", "green", "blue"]),
    ("Which appears least often among cats, dogs and birds?", ["cats", "dogs", "birds"]),
    # not a list of options to label every record with
    ("How many of these are red, green or blue?", []),                   # no most / fewest
    ("Which desk is most often late here: North, South or East?", []),    # names: groups
    ("Which is most common, red or blue?", []),                           # two, and a lead word
    ("Which of the records, rows or lines is most common?", []),
])
def test_the_options_a_most_query_lists_are_found(query, choices):
    assert query_choices(query) == choices


@pytest.mark.parametrize("sides, op, answer", [
    (("tool", "fruit"), "which_most", "birds"),          # 13 birds, 12 tools, 7 fruits
    (("tool", "fruit"), "which_fewest", "fruits"),
    # one word for both sides is no valid plan, but with listed options its sides would not be
    # used: the records are labelled with the options all the same
    (("entry", "entry"), "which_most", "birds"),
])
def test_a_most_query_over_listed_options_labels_every_record_with_one_of_them(sides, op,
                                                                             answer):
    """The root named two of the three options (or one word twice) as its sides; the leaves
    are asked all three and "other" (first), and the most is computed over all the records (no
    groups) among the options only."""
    records = "\n".join(f"Entry {i}: " + ["a hammer for nails", "a ripe red apple",
                                          "a small songbird"][(i % 5 > 1) + (i % 5 > 2)]
                        for i in range(30))       # per 5: 2 tools, 1 fruit, 2 birds
    records += "\nEntry 30: a ripe red apple\nEntry 31: a small songbird"
    # more records of none of the options than of any option: their side is never the answer
    records += "".join(f"\nEntry {i}: a harbour town" for i in range(32, 52))
    root = scripted({"plan": "label_count", "label": sides[0], "opposite": sides[1]},
                    "FINAL('never reached')", answer="999", count=json.dumps({"op": op}))

    def sub(messages):
        item = leaf_item(messages[-1]["content"])
        return "tools" if "hammer" in item else "fruits" if "apple" in item else \
            "birds" if "songbird" in item else "other"
    query = (f"Which kind of thing do the {op.removeprefix('which_')} of these entries "
             "describe: tools, fruits or birds?")
    assert query_choices(query) == ["tools", "fruits", "birds"]
    res, sub_client = run(root, sub=sub, context=records, query=query)
    assert sub_client.calls[0][-1]["content"].startswith(
        "Which fits the text better: other, tools, fruits or birds?")
    assert (res.status, res.answer) == ("final", answer), res.answer
