"""The planned mode (`RLM(strategy="plan")`): the root fills a typed plan, the runtime runs it.

Before the first code turn, the root model picks one plan from a small library and fills its
slots (a question, a label set, ...) as JSON; on llama.cpp the reply is constrained by the
plans' JSON schema, so even a 1.5B model returns a valid plan. The runtime turns the plan into
fixed REPL code built on the combinators (`recursa.core.combinators`), first runs it as a dry run to
get its bound on sub-calls, tokens and cost (a `plan` trace event and a line in the live view,
before any sub-call), checks the bound against the budget, then runs it. Its printed results go
into the root's first message, and the root answers from them in the usual code loop (where it
may also write code of its own). A plan the model cannot fill, a bound over the budget or a
failed plan falls back to the code mode, saying so.

Plans: the kinds registered in `recursa.core.strategies.plans` (`retrieve_read`: find the pieces
that answer a question and read them; `label_count`: label every record from a fixed set, then
count by code; `chained_lookup`: a lookup whose answer is the key of a second lookup; `pairs`: label
records, then pair their ids by code). This module chooses and runs them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from recursa.base.types import BudgetExceeded, Completion, Message, ModelError
from recursa.core import prompts
from recursa.core.strategies import Run, RunEnv
from recursa.core.strategies.plans import (
    KINDS,
    PLAN,
    describe,
    kind_of,
    parse,
    plan_code,
    plan_schema,
    query_plan,
)
from recursa.core.strategies.plans.answer_steps import (  # noqa: F401  (named here for the probes)
    COUNT_MAX_TOKENS,
    PAIR_MAX_TOKENS,
    CountChoice,
    committed,
    count_code,
    count_messages,
    last_value,
    pair_code,
    pair_messages,
    pair_schema,
    parse_count_choice,
    parse_pair_rule,
    scalar_answer,
)
from recursa.core.strategies.plans.base import AnswerStep
from recursa.core.strategies.plans.chained_lookup import ChainedLookup  # noqa: F401
from recursa.core.strategies.plans.code import CodeInstead
from recursa.core.strategies.plans.label_count import (  # noqa: F401
    QUERY_LEAF,
    LabelCount,
    condition_phrase,
    condition_words,
    leaf_question,
    plain_opposite,
    query_choices,
)
from recursa.core.strategies.plans.pairs import Pairs  # noqa: F401
from recursa.core.strategies.plans.repl import answers as repl_answers
from recursa.core.strategies.plans.repl import source

__all__ = ["KINDS", "PLAN", "PLAN_MODE", "describe", "parse", "plan_code", "plan_schema",
           "run_plan"]


PLAN_MAX_TOKENS = 400

PLAN_SYSTEM = """You plan how to answer a query about a context that is too large to read at \
once. The context is stored as the variable `context` in a Python REPL. Choose ONE plan and fill \
its fields; the runtime runs it with a small language model reading each piece, then you answer \
from its results.

Plans (reply with one JSON object):
""" + "\n".join(k.prompt for k in KINDS.values())

PLAN_USER = """Query: {query}

The context:
{description}

Reply with the JSON plan only."""

RESULTS = """Before this conversation the runtime ran a plan you chose:
{plan}
Its bound: at most {calls:,} sub-calls and {tokens:,} tokens. What it printed:
{output}

Its variables are in the REPL ({names}). If these results answer the query, commit the answer \
now with FINAL(...) in a ```repl block, using the numbers and names printed above. If not, write \
code to finish the job."""

FELL_BACK = "(A planned run was tried first but not used: {why}.)"

# After a plan ran, the root answers from its printed results in one plain call, not in the
# code loop: there the 1.5B, given a table that answered the query, copied the worked example's
# search instead (a dev counting task).
ANSWER_SYSTEM = """A program has read the whole of a long context for you and printed its \
results. Answer the query from those results alone: reply with the answer only, in the \
form the query asks for (a name, a number or one short sentence), working it out from the \
printed numbers where needed. If the results do not answer the query, reply: none"""

ANSWER_USER = """Query: {query}

The program's results:
{output}

Answer:"""
ANSWER_MAX_TOKENS = 80


def answer_messages(query: str, output: str) -> list[Message]:
    """The plain answer call's messages: the query and the plan's printed results."""
    return [{"role": "system", "content": ANSWER_SYSTEM},
            {"role": "user", "content": ANSWER_USER.format(query=query, output=output)}]


def request(env: RunEnv, query: str, description: str) -> tuple[list[dict[str, Any]],
                                                                  dict[str, Any]]:
    """Messages and options of the planning call; the reply is constrained where the client
    can take a JSON schema."""
    messages = [{"role": "system", "content": PLAN_SYSTEM},
                {"role": "user", "content": PLAN_USER.format(query=query,
                                                             description=description)}]
    options = {**env.root_options, "temperature": 0.0, "max_tokens": PLAN_MAX_TOKENS}
    schema = plan_schema()
    from recursa.models.registry import structured_output
    how = structured_output(env.root_client)
    if how == "json_schema":
        options["json_schema"] = schema
    elif how == "response_format":
        options["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "plan", "schema": {"type": "object", "properties": {"choice": schema},
                                       "required": ["choice"]}}}
    return messages, options


# What a query that needs a label on every record asks for: a count, a most / least, a
# comparison or pairs. Without one of these words, a labelling plan is a misread of the query
# (a 1.5B root answered a lookup, "what code opens the ...?", with label_count over 119 records).
_AGGREGATE = re.compile(
    r"\b(how many|how much|count|counts|counting|number of|numbers of|most|least|fewest|fewer|"
    r"more(?! than one)|less|majority|minority|proportion|percentage|share|ratio|average|total|"
    r"compare|comparison|pairs?|largest|smallest|biggest|highest|lowest|frequent|common)\b",
    re.I)


# A quantity the text states is a lookup, not a count of records: "within how many days",
# "how many words may a cover text have at most", "for at least how long". These phrases are
# taken out before the aggregate test (a 1.5B root read "how many days" in a legal text as a count
# of every line, issue 34).
# Units counted as records when a verb of their own follows ("how many days had an outage").
_MEASURE = re.compile(
    r"\b(?:how many|how much|number of)\s+(?:\w+\s+)?(?:seconds|minutes|hours|days|weeks|"
    r"months|years|decades|words|characters|pages|percent|dollars|euros|pounds|miles|kilometres|"
    r"kilometers|metres|meters|bytes|kilobytes|megabytes|time)\b"
    r"(?!\s+(?:had|have|were|saw|showed|passed|went|ended|began|with|in which|when|that|where)\b)"
    r"|\bat (?:most|least)\b", re.I)


def asks_aggregate(query: str) -> bool:
    """Whether the query asks for an aggregate over records (a count, most / least, a comparison
    or pairs) rather than a quantity or fact the text states."""
    return _AGGREGATE.search(_MEASURE.sub(" ", query)) is not None


def fits(plan: Any, query: str) -> Any:
    """`plan`, or in place of a labelling plan for a query that asks for no aggregate (no count,
    most / least, comparison or pairs), the plan that takes the query as it stands (a
    retrieval of it)."""
    if kind_of(plan).aggregate and not asks_aggregate(query):
        return query_plan(query)
    return plan


def read_plan(text: str, query: str) -> Any:
    """The plan in the root's reply, fitted to the query. A labelling plan that is not even
    valid (one label for both sides: "combination" / "combination") for a query that asks for
    no aggregate is the same misreading `fits` corrects, so it becomes the retrieval too instead
    of a fall-back to code; otherwise its kind may rebuild it from the query (`rescue`)."""
    try:
        return fits(parse(text), query)
    except ValueError:
        m = re.search(r'"plan"\s*:\s*"(' + "|".join(k for k in KINDS if KINDS[k].aggregate)
                      + ')"', text)
        if m and not asks_aggregate(query):
            return query_plan(query)
        rescue = KINDS[m.group(1)].rescue if m else None
        if rescue is not None and (plan := rescue(query)) is not None:
            return plan
        raise


# ------------------------------------------------------------------ the planned step
class PlanMode:
    """The plan mode as a strategy (recursa.core.strategies.Strategy)."""

    name = "plan"

    async def begin(self, run: Run) -> bool:
        return await run_plan(run, run.description)


PLAN_MODE = PlanMode()


async def run_plan(run: Run, description: str) -> bool:
    """The plan turn of `run` (a top-level run in plan mode): ask, bound, run, and put the
    results (or why there are none) into the root's first message; then the root answers
    from them. True when that answer is final (the run is over)."""
    env, st = run.env, run.st
    turn = run.rec.turn(turn=st.turns + 1, plan=True)
    messages, options = request(env, run.query, description)
    try:
        comp = await env.dispatcher.call_model(env.root_client, messages, role="root",
                                               subcall=False, options=options)
    except ModelError as e:     # the root model failed: the run ends, as in the code mode
        turn.fail(str(e))
        st.error = e
        return True
    except BudgetExceeded as e:
        turn.fail(str(e))
        return _note(run, f"the planning call failed ({e})")
    st.turns += 1
    turn.replied(comp)
    try:
        plan = read_plan(comp.text, run.query)
    except ValueError as e:
        turn.end(comp, blocks=0, plan_error=str(e))
        return _note(run, f"the reply was not a valid plan ({e})")
    kind = kind_of(plan)
    if isinstance(plan, CodeInstead):
        turn.end(comp, blocks=0, plan="code")
        return False
    ev = env.tracer.emit("plan", phase="start", parent=turn.id, depth=run.depth,
                         plan=plan.model_dump())
    bound_cell = await _cell(run, turn, 0, plan_code(plan, dry=True, query=run.query))
    try:
        bound = json.loads((bound_cell.stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = f"its dry run failed: {(bound_cell.error or bound_cell.stdout)[-300:]}"
        env.tracer.emit("plan", id=ev, phase="end", parent=turn.id, depth=run.depth, error=why)
        turn.end(comp, blocks=1)
        return _note(run, why)
    env.tracer.emit("plan", phase="point", parent=ev, depth=run.depth, bound=bound,
                    plan_kind=plan.plan)
    over = _over_budget(env, bound)
    if over:
        env.tracer.emit("plan", id=ev, phase="end", parent=turn.id, depth=run.depth, error=over)
        turn.end(comp, blocks=1)
        return _note(run, over)
    late = _over_time(env, bound)
    if late:      # work it would abandon is not started: the run ends here, saying why
        env.tracer.emit("plan", id=ev, phase="end", parent=turn.id, depth=run.depth, error=late)
        turn.end(comp, blocks=1)
        st.limit, st.error = "max_seconds", late
        return True
    cut_before = len(env.dispatcher.partial)
    cell = await _cell(run, turn, 1, plan_code(plan, dry=False, query=run.query))
    cut = env.dispatcher.partial[cut_before:]
    if cut:       # a limit stopped the map: the answer rests on the part it finished
        st.partial = "; ".join(p.describe(kind.noun) for p in cut)
        st.limit = cut[-1].limit
    env.tracer.emit("plan", id=ev, phase="end", parent=turn.id, depth=run.depth,
                    bound=bound, error=cell.error, **({"partial": st.partial} if cut else {}))
    turn.end(comp, blocks=2)
    if cell.error:
        return _note(run, f"it failed: {cell.error[-300:]}")
    output = (cell.stdout or "").strip() or "(nothing)"
    shown = output[:env.max_output_chars]
    names = ", ".join(n for n in cell.variables if not n.startswith("_") and n in _RESULTS)
    _preface(run, RESULTS.format(plan=describe(plan), calls=bound["calls"],
                                 tokens=bound["tokens"], output=shown, names=names),
             replace_start=True)
    from recursa.core.guards import plain_digits
    st.seen.append(plain_digits(output))
    step = kind.answer(plan, run.query) if kind.answer is not None else None
    if step is not None and await _computed_answer(run, step):
        return True
    return await _answer(run, shown, sourced=kind.sourced)


# what a plan's code leaves in the REPL for the root, by name
_RESULTS = frozenset(n for k in KINDS.values() for n in k.results)


async def _answer_call(run: Run, turn: Any, messages: list[Message],
                       options: dict[str, Any]) -> Completion | None:
    """The root call of an answer turn, allowed past a spent budget's last turn (`_at_limit`);
    None when it failed (the turn records why, and the code loop goes on)."""
    try:
        comp = await run.env.dispatcher.call_model(run.env.root_client, messages, role="root",
                                                   subcall=False, options=options,
                                                   force=_at_limit(run.env))
    except (ModelError, BudgetExceeded) as e:
        turn.fail(str(e))
        return None
    run.st.turns += 1
    turn.replied(comp)
    return comp


async def _computed_answer(run: Run, step: AnswerStep) -> bool:
    """One typed root call (constrained by the step's schema where the client takes one), turned
    into REPL code by the step (with what the trace keeps of the choice); what it reads from the
    cell (its printed value, or what it committed) is the run's final answer. A reply that does
    not parse, a value the labels cannot give (None) or an error leaves the answer to the plain
    call."""
    env, st = run.env, run.st
    if env.output is not None or env.sources:
        return False
    turn = run.rec.turn(turn=st.turns + 1, plan_answer=True, **step.mark)
    options = {**env.root_options, "temperature": 0.0, "max_tokens": step.max_tokens}
    from recursa.models.registry import structured_output
    if structured_output(env.root_client) == "json_schema":
        options["json_schema"] = step.schema
    comp = await _answer_call(run, turn, step.messages, options)
    if comp is None:
        return False
    made = step.code(comp.text)
    if made is None:
        turn.end(comp, blocks=0, plan_answer=None)
        return False
    code, seen = made
    cell = await _cell(run, turn, 0, code)
    answer = None if cell.error else step.read(cell)
    if answer is None:
        turn.end(comp, blocks=1, plan_answer=None, **seen)
        return False
    st.final = answer
    turn.end(comp, blocks=1, plan_answer=answer, ended=True, **seen)
    return True


async def _answer(run: Run, output: str, sourced: bool = False) -> bool:
    """One plain root call that answers the query from the plan's results; its answer is the
    run's final one unless it says "none" (or the run needs what only the code loop does: a
    typed output, or sources after a plan that read no passages), and then the code loop goes
    on from the results. `sourced`: the plan read passages, and with sources asked for, those
    its answer came from are attached by code (`source_code`), not by the model."""
    env, st = run.env, run.st
    if env.output is not None or (env.sources and not sourced):
        return False
    turn = run.rec.turn(turn=st.turns + 1, plan_answer=True)
    messages = answer_messages(run.query, output)
    options = {**env.root_options, "temperature": 0.0, "max_tokens": ANSWER_MAX_TOKENS}
    comp = await _answer_call(run, turn, messages, options)
    if comp is None:
        return False
    text = comp.text.strip()
    if text.lower().startswith("answer:"):
        text = text[7:].strip()
    # code instead of an answer: the code loop is the place for it
    if not text or "```" in text or text.strip(" .'\"").lower() == "none":
        turn.end(comp, blocks=0, plan_answer=None)
        return False
    if env.sources:     # sources the runtime cannot give: the code loop (and its hold) goes on
        cell = await _cell(run, turn, 0, source_code(text))
        if cell.error is not None or not cell.answer.get("sources"):
            turn.end(comp, blocks=1, plan_answer=None)
            return False
        st.answer = cell.answer
    st.final = text
    turn.end(comp, blocks=1 if env.sources else 0, plan_answer=text, ended=True)
    return True


def source_code(final: str) -> str:
    """REPL code that commits `final` with its sources: the pieces whose reader's answer and
    `final` hold one another (words compared, case and punctuation aside), or when none do,
    every piece a reader answered from. A 1.5B root asked to attach them itself committed the
    right answer without sources, twice in a row (tests/test_sources_model.py)."""
    return f"{source(repl_answers._plan_sourced)}\n_plan_sourced({final!r})\ndel _plan_sourced"


async def _cell(run: Run, turn: Any, index: int, code: str) -> Any:
    cell_id = turn.cell(index, code)
    run.node.parent = cell_id
    cell = await run.run_cell(code)
    turn.cell_end(cell_id, cell, cell.stdout or cell.error or "")
    run.st.cells_run += 1
    run.st.variables = list(cell.variables)
    return cell


def _over_budget(env: RunEnv, bound: dict[str, Any]) -> str | None:
    b, ledger = env.budget, env.ledger
    if b.max_subcalls is not None and ledger.subcalls + bound["calls"] > b.max_subcalls:
        return f"its bound of {bound['calls']:,} sub-calls is over the budget (max_subcalls)"
    if b.max_tokens is not None and ledger.tokens + bound["tokens"] > b.max_tokens:
        return f"its bound of {bound['tokens']:,} tokens is over the budget (max_tokens)"
    cost = bound.get("cost_usd")
    if b.max_cost_usd is not None and cost is not None and \
            ledger.cost_spent + cost > b.max_cost_usd:
        return f"its bound of ${cost:.4f} is over the budget (max_cost_usd)"
    return None


def _at_limit(env: RunEnv) -> bool:
    """A limit stopped the plan's work: its answer call is the run's last-answer turn, admitted
    in the time and budget kept for that turn (recursa.core.deadline)."""
    return env.ledger.limit_reached(subcalls=False) is not None


def _over_time(env: RunEnv, bound: dict[str, Any]) -> str | None:
    """Why the plan cannot finish inside the time limit at this machine's measured pace, or
    None (no limit, nothing measured yet, or it may fit).

    The test is the least time the plan can take (every input read once, one reply token a
    call), not its worst case: replies are usually far shorter than their cap, and a map that
    runs out of time still answers from the part it finished. Refusing on the worst case
    turned runs that would have fit into no answer on a slow machine."""
    left = env.ledger.deadline.left()
    if left is None:
        return None
    model = env.dispatcher.sub_client.name
    calls = bound["calls"]
    need = env.dispatcher.pace.seconds(
        model, calls=calls, input_tokens=bound.get("input_tokens", bound["tokens"]),
        output_tokens=calls, concurrency=env.dispatcher.concurrency)
    if need is None or need <= left:
        return None
    return (f"the plan needs {calls:,} sub-calls, at least {need:,.0f} s at the pace "
            f"measured on this machine, but the time limit (max_seconds) leaves {max(0, left):,.0f}"
            " s: it was not started. Raise max_seconds (or set none) for this input")


def _note(run: Run, why: str) -> bool:
    _preface(run, FELL_BACK.format(why=why))
    return False


def _preface(run: Run, text: str, replace_start: bool = False) -> None:
    """Add `text` to the root's first message (before its first code turn); with results,
    in place of its "start by exploring" line, which would contradict them."""
    msg = run.messages[1]
    content = msg["content"]
    start = prompts.FIRST_USER.rsplit("\n\n", 1)[-1]
    if replace_start and start in content:
        content = content.replace(start, text, 1)
    else:
        content = f"{content}\n\n{text}"
    msg["content"] = content
    run.st.first_user = msg["content"]
    run.st.full[1] = dict(msg)
