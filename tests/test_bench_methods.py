"""Bench methods (rlm, rlm-d0, direct, direct-trunc, compaction, codeact-bm25) with a scripted
model: each one answers S-NIAH through recursa's real loop, sandbox, budget and trace."""

from __future__ import annotations

from typing import Any

import pytest

from helpers_scripted import sniah_model
from recursa.bench import get_task
from recursa.bench.methods import (
    BM25Index,
    MethodConfig,
    context_text,
    method_label,
    parse_method,
    run_method,
    split_chunks,
)
from recursa.obs.trace import load


def cfg(method: str, **kw: Any) -> MethodConfig:
    name, depth, truncate = parse_method(method)
    base: dict[str, Any] = dict(method=name, depth=depth, truncate=truncate, model="replay:",
                                sandbox="inprocess",
                                client_options={"responder": "helpers_scripted:sniah_model"},
                                limits={"max_iterations": 3})
    base.update(kw)
    return MethodConfig(**base)


@pytest.fixture(scope="module")
def inst() -> Any:
    return get_task("sniah").generate(seed=3, length_tokens=3000)


def test_labels_round_trip() -> None:
    for label in ("rlm", "rlm-d0", "rlm-d2", "direct", "direct-trunc", "compaction",
                  "codeact-bm25"):
        name, depth, trunc = parse_method(label)
        assert method_label(name, depth, trunc) == label
    assert parse_method("rlm", depth=0) == ("rlm", 0, False)
    with pytest.raises(ValueError, match="unknown method"):
        parse_method("rag")


def test_context_text_and_chunks() -> None:
    assert context_text(["a", "b"]).count("### Document") == 2
    assert context_text({"f.py": "x"}) == "### f.py\nx"
    text = "word " * 1000
    chunks = split_chunks(text, 300)
    assert "".join(chunks) == text
    assert all(len(c) <= 300 for c in chunks) and all(c.endswith(" ") for c in chunks[:-1])


@pytest.mark.parametrize("method", ["rlm", "rlm-d0", "direct", "compaction", "codeact-bm25"])
async def test_method_solves_sniah(method: str, inst: Any, tmp_path: Any) -> None:
    trace = tmp_path / "t.jsonl"
    res = await run_method(cfg(method), inst, str(trace))
    assert get_task("sniah").score(res.answer, inst).score == 1.0, (res.answer, res.error)
    assert res.status == "final" and res.ready
    assert res.usage["root"].usage.input_tokens > 0
    run = load(trace)       # every method writes the same trace format
    assert run.root is not None and run.totals.tokens > 0
    if method == "rlm":
        assert res.subcalls == 4 and res.usage["sub"].usage.input_tokens > 0
    if method in ("rlm-d0", "direct", "codeact-bm25"):
        assert res.subcalls == 0


async def test_rlm_d0_cannot_make_subcalls(inst: Any) -> None:
    code = "```repl\nprint(llm_query('hi'))\n```"
    c = cfg("rlm-d0", client_options={}, limits={"max_iterations": 1})
    from recursa.models import ReplayClient
    replies = iter([code, "none"])
    client = ReplayClient(lambda m: next(replies))
    import recursa.bench.methods as methods
    orig = methods._make_clients
    methods._make_clients = lambda _cfg: (client, client)
    try:
        res = await run_method(c, inst, None)
    finally:
        methods._make_clients = orig
    assert res.subcalls == 0
    assert "no language-model calls" in client.calls[0][0]["content"]
    assert "llm_query" not in client.calls[0][0]["content"]


async def test_direct_overflow_is_a_recorded_failure(inst: Any) -> None:
    res = await run_method(cfg("direct", window_tokens=1000), inst, None)
    assert res.status == "error" and res.limit == "context_window"
    assert "exceeds the model's window of 1,000" in (res.error or "")
    assert res.turns == 0 and res.answer == ""


async def test_direct_truncate_fits_the_window(inst: Any) -> None:
    from recursa.models import ReplayClient
    client = ReplayClient(lambda m: "1234567")
    import recursa.bench.methods as methods
    orig = methods._make_clients
    methods._make_clients = lambda _cfg: (client, client)
    try:
        res = await run_method(cfg("direct-trunc", window_tokens=1500), inst, None)
    finally:
        methods._make_clients = orig
    prompt = client.calls[0][0]["content"]
    assert "characters cut to fit the window" in prompt
    assert len(prompt) // 4 + 512 <= 1500
    assert inst.query in prompt and res.status == "final"


async def test_compaction_carries_notes_across_windows(inst: Any) -> None:
    from recursa.models import ReplayClient
    client = ReplayClient(sniah_model)
    import recursa.bench.methods as methods
    orig = methods._make_clients
    methods._make_clients = lambda _cfg: (client, client)
    try:
        res = await run_method(cfg("compaction", chunk_tokens=500), inst, None)
    finally:
        methods._make_clients = orig
    n = len(split_chunks(context_text(inst.context), 2000))
    assert len(client.calls) == n + 1 == res.turns
    assert res.answer == inst.gold
    # the window with the needle is not the last one, yet the answer survives in the notes
    assert inst.meta["needle"] not in client.calls[-2][0]["content"] or inst.meta["depth"] > 0.9


async def test_compaction_answers_from_notes_at_a_budget_limit(inst: Any) -> None:
    res = await run_method(cfg("compaction", chunk_tokens=300, limits={"max_tokens": 3000}),
                           inst, None)
    assert res.status == "limit" and res.limit == "max_tokens"
    assert res.turns >= 2     # some windows, then the forced answer turn


def test_bm25_index_finds_the_needle(inst: Any) -> None:
    passages = split_chunks(context_text(inst.context), 800)
    idx = BM25Index(passages)
    hits = idx.search(inst.meta["key"], k=3)
    assert hits and inst.gold in hits[0]["text"]
    assert hits == sorted(hits, key=lambda h: -h["score"])
    assert idx.search("the of and", k=3) == []


async def test_codeact_never_sees_the_input(inst: Any) -> None:
    from recursa.models import ReplayClient
    probe = "```repl\nprint(type(context).__name__, len(context))\nprint(context)\n```"
    replies = iter([probe, "```repl\nFINAL('x')\n```"])
    client = ReplayClient(lambda m: next(replies))
    import recursa.bench.methods as methods
    orig = methods._make_clients
    methods._make_clients = lambda _cfg: (client, client)
    try:
        await run_method(cfg("codeact-bm25"), inst, None)
    finally:
        methods._make_clients = orig
    seen = client.calls[1][-1]["content"]
    assert "not loaded in this REPL" in seen and inst.gold not in seen
    assert inst.gold not in str(client.calls)


async def test_codeact_search_in_the_local_sandbox(inst: Any) -> None:
    """search() works over the real worker process (bubblewrap where present) too."""
    res = await run_method(cfg("codeact-bm25", sandbox="local"), inst, None)
    assert res.answer == inst.gold, res.error


async def test_rlm_deeper_runs_nested_children(inst: Any) -> None:
    opts = {"responder": "helpers_scripted:depth_model"}
    res = await run_method(cfg("rlm-d2", client_options=opts), inst, None)
    assert res.answer == inst.gold and res.status == "final"
    assert res.usage["child"].calls == 2          # child and grandchild, one turn each
    # at depth 1 the child's own rlm_query is a plain sub-call, which cannot read the context
    res1 = await run_method(cfg("rlm", client_options=opts), inst, None)
    assert res1.usage["child"].calls == 1 and res1.subcalls == 1
    assert res1.answer == "none"


async def test_codeact_search_survives_a_sandbox_restart(inst: Any) -> None:
    """A cell that times out restarts the worker; search() is defined again afterwards."""
    from recursa.models import ReplayClient
    stuck = ("```repl\nimport signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "while True:\n    pass\n```")      # ignores the interrupt: the worker is killed
    replies = iter([stuck,
                    "```repl\nhits = search(" + repr(inst.meta["key"]) + ", k=2)\n"
                    "import re\nFINAL(re.search(r'is: (\\d{7})', hits[0]['text']).group(1))\n```"])
    client = ReplayClient(lambda m: next(replies))
    import recursa.bench.methods as methods
    orig = methods._make_clients
    methods._make_clients = lambda _cfg: (client, client)
    try:
        res = await run_method(cfg("codeact-bm25", sandbox="local",
                                   limits={"max_iterations": 3, "cell_timeout": 1}), inst, None)
    finally:
        methods._make_clients = orig
    assert "restart" in client.calls[1][-1]["content"].lower()
    assert res.answer == inst.gold, res.error


def test_worked_example_ablation_labels_and_prompts() -> None:
    """rlm-noex / codeact-bm25-noex cut the worked example; codeact-bm25 now has one of the
    same kind as rlm's (the same budget), so the comparison is not confounded by it."""
    from recursa.bench.methods import (
        CODEACT_SYSTEM,
        MethodConfig,
        split_worked_example,
        without_worked_example,
    )
    from recursa.core import prompts
    assert split_worked_example("rlm-noex") == ("rlm", False)
    assert split_worked_example("rlm-d2-noex") == ("rlm-d2", False)
    assert split_worked_example("codeact-bm25") == ("codeact-bm25", True)
    with pytest.raises(ValueError, match="worked example"):
        split_worked_example("direct-noex")
    cfg = MethodConfig(method="rlm", model="m", worked_example=False)
    assert cfg.label == "rlm-noex"
    assert MethodConfig(method="rlm", depth=2, model="m", worked_example=False).label == "rlm-d2-noex"
    cut = without_worked_example(CODEACT_SYSTEM)
    assert "Example of a whole run" in CODEACT_SYSTEM
    assert "Example of a whole run" not in cut and "Ada" not in cut
    assert cut.rstrip().endswith("{tips}")
    fields = {"context_type": "str", "max_output_chars": 2000, "sub_chars": 8000, "chunk": 4000,
              "tools": "", "tips": ""}
    with_ex = prompts.system_prompt(context_type="str", max_output_chars=2000)
    without = prompts.system_prompt(context_type="str", max_output_chars=2000, example=False)
    assert "Example of a whole run" in with_ex and "Ada" not in without   # rlm's RLM(example=)
    ex_rlm = len(with_ex) - len(without)
    ex_codeact = len(CODEACT_SYSTEM) - len(cut)
    assert 0.6 < ex_codeact / ex_rlm < 1.4          # about the same worked-example budget
    assert "FINAL(\"Lyon\")" in CODEACT_SYSTEM.format(**fields)
