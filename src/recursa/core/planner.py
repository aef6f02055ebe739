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

Plans: `retrieve_read` (find the pieces that answer a question and read them), `label_count`
(label every record from a fixed set, then count by code), `two_hop` (a lookup whose answer is
the key of a second lookup) and `pairs` (label records, then pair their ids by code).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError, model_validator

from recursa.base.types import BudgetExceeded, Cell, Message, ModelClient, ModelError
from recursa.core import prompts
from recursa.core.budget import Budget, Ledger
from recursa.core.dispatch import Dispatcher, Node
from recursa.core.plan_answers import (
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
from recursa.core.recorder import RunRecorder
from recursa.core.state import RunState
from recursa.obs.trace import Tracer


class RunEnv(Protocol):
    """What the plan step reads of a run's shared settings (recursa.core.loop.RunEnv)."""

    budget: Budget
    ledger: Ledger
    tracer: Tracer
    dispatcher: Dispatcher
    root_client: ModelClient
    root_options: dict[str, Any]
    max_output_chars: int
    strategy: str
    output: Any            # the answer's type (recursa.core.output), or None
    sources: bool


class Run(Protocol):
    """What the plan step uses of a run (recursa.core.loop.Run): no import of the loop, which
    calls this module."""

    st: RunState
    rec: RunRecorder
    query: str
    depth: int
    node: Node

    @property
    def env(self) -> RunEnv: ...

    @property
    def messages(self) -> list[Message]: ...

    async def run_cell(self, code: str) -> Cell: ...

PLAN_MAX_TOKENS = 400
Text = Annotated[str, Field(min_length=1, max_length=300)]
Label = Annotated[str, Field(min_length=1, max_length=40)]


def _distinct(labels: list[str]) -> list[str]:
    # a 1.5B root has filled ["code", "code"]: repeats dropped; a set that cannot tell two
    # records apart is not a plan
    out: dict[str, str] = {}
    for x in labels:
        out.setdefault(x.strip().lower(), x.strip())
    if len(out) < 2:
        raise ValueError("a label set needs at least two different labels")
    return list(out.values())


Labels = Annotated[list[Label], Field(min_length=2, max_length=12), AfterValidator(_distinct)]


class RetrieveRead(BaseModel):
    """Find the pieces of the context that answer `question`, then read them."""

    plan: Literal["retrieve_read"]
    question: Text
    keywords: list[Label] = Field(default_factory=list, max_length=6)


def _word(x: str) -> str:
    return x.strip().strip("'\".").lower()


class LabelCount(BaseModel):
    """Judge every record as `label` or `opposite`, then count the judgements by code, per
    value of the record field `group_by` when one is named. recursa writes the per-record
    question from the two sides: a root that wrote its own asked the aggregate question
    ("Count the complaints for each shop") or a leading one, and a 1.5B leaf answers a leading
    question with the same label for every record."""

    plan: Literal["label_count"]
    label: Label
    opposite: Label
    group_by: Annotated[str, Field(max_length=40)] = ""

    @model_validator(mode="after")
    def _two_sides(self) -> LabelCount:
        if _word(self.label) == _word(self.opposite):
            raise ValueError("label and opposite must differ")
        return self

    @property
    def labels(self) -> list[str]:
        # the opposite first: asked "complaint or praise?", the 1.5B said complaint to 33 of 40
        # reviews (18 were); asked "praise or complaint?", it was right on 40 of 40 (dev split)
        return [plain_opposite(self.label, self.opposite), self.label.strip()]


def plain_opposite(label: str, opposite: str) -> str:
    """The opposite side as a leaf is asked it: "other" in place of the label negated by a
    word ("non-food", "not an animal", "no animal", "without food"). The 1.5B picks a side that
    repeats the record's topic word: asked "non-food or food?" it found 12 of 30 dev foods,
    "other or food?" 25 of 30; for animals 1 of 30 against 27 of 30
    (benchmarks/probes/opposite.py). An antonym of its own ("unfavourable", "unhappy") is kept:
    against "other" it halved the false positives at the same recall, dev reviews
    (benchmarks/probes/opposite_words.py: 0.37 against 0.77, 0.33 against 0.53)."""
    lab, opp = label.strip(), opposite.strip()
    stem = re.sub(r"[^a-z]", "", lab.lower())[:4]
    negated = re.match(r"(?i)\s*(non|not|no|without)\b[\s-]*(an?\s+|the\s+)?(.*)$", opp)
    if len(stem) == 4 and negated and stem in re.sub(r"[^a-z]", "", negated.group(3).lower()):
        return "other"      # the label negated: non-food, not an animal, without food
    return opp


class TwoHop(BaseModel):
    """Answer `first_question`, then `second_question` with `{answer}` replaced by that answer."""

    plan: Literal["two_hop"]
    first_question: Text
    second_question: Text


class Pairs(BaseModel):
    """Label every record, then list the pairs of record ids whose labels are both in `keep`."""

    plan: Literal["pairs"]
    instruction: Text
    labels: Labels
    keep: list[Label] = Field(min_length=1, max_length=12)
    id_prefix: Annotated[str, Field(max_length=20)] = ""


class CodeInstead(BaseModel):
    """No plan fits: write code instead."""

    plan: Literal["code"]


Plan = Annotated[RetrieveRead | LabelCount | TwoHop | Pairs | CodeInstead,
                 Field(discriminator="plan")]
PLAN = TypeAdapter(Plan)

PLAN_SYSTEM = """You plan how to answer a query about a context that is too large to read at \
once. The context is stored as the variable `context` in a Python REPL. Choose ONE plan and fill \
its fields; the runtime runs it with a small language model reading each piece, then you answer \
from its results.

Plans (reply with one JSON object):
- {{"plan": "retrieve_read", "question": "...", "keywords": [...]}}: find the pieces of the \
context that answer `question` (a full question, in the query's words) and read them. \
`keywords`: 2-5 plain words or short phrases the passage itself probably uses for what the \
question is about, which need not be the query's own words (for "the kiln stopped heating": \
"element", "thermocouple"), or [] when unsure.
- {{"plan": "label_count", "label": "...", "opposite": "...", "group_by": "..."}}: judge \
every record (line or entry) as `label` or `opposite`, then count them with code. For how many \
/ which is most or least common / compare groups, when the judgement is not written in the \
record. `label`: one word for what the query counts, as said of one record (e.g. "cracked"); \
`opposite`: one word for a record that is not that (e.g. "intact"); `group_by`: the name of \
the record field the query groups or filters by (e.g. "Kiln", "Glaze"), or "" for none. \
Examples: "Which kiln's firings most often came out cracked?" -> {{"plan": "label_count", \
"label": "cracked", "opposite": "intact", "group_by": "Kiln"}}; "How many of the seed trays \
sprouted?" -> {{"plan": "label_count", "label": "sprouted", "opposite": "bare", \
"group_by": ""}}.
- {{"plan": "two_hop", "first_question": "...", "second_question": "... {{answer}} ..."}}: \
answer the first question, then the second with {{answer}} replaced by the first answer.
- {{"plan": "pairs", "instruction": "...", "labels": [...], "keep": [...], "id_prefix": "..."}}: \
label every record, then list the pairs of ids whose records have a label in `keep`; \
`id_prefix` is the text before each record's id (e.g. "Kiln:"), or "" to use record numbers.
- {{"plan": "code"}}: none fits (e.g. a question about the context itself, such as how many \
lines it has, or exact text search); you will write Python code instead."""

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
# search instead (judge_agg dev seed 0).
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
    messages = [{"role": "system", "content": PLAN_SYSTEM.format()},
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


def plan_schema() -> dict[str, Any]:
    """The plans' JSON schema with its references inlined (grammar converters and small
    models both do better without $ref)."""
    raw = PLAN.json_schema()
    defs = raw.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()
                    if k not in ("discriminator", "title", "description")}
        if isinstance(node, list):
            return [inline(x) for x in node]
        return node
    return inline(raw)


# What a query that needs a label on every record asks for: a count, a most / least, a
# comparison or pairs. Without one of these words, a labelling plan is a misread of the query
# (a 1.5B root answered "what code opens the bike shed?" with label_count over 119 records).
_AGGREGATE = re.compile(
    r"\b(how many|how much|count|counts|counting|number of|numbers of|most|least|fewest|fewer|"
    r"more(?! than one)|less|majority|minority|proportion|percentage|share|ratio|average|total|"
    r"compare|comparison|pairs?|largest|smallest|biggest|highest|lowest|frequent|common)\b",
    re.I)


# A quantity the text states is a lookup, not a count of records: "within how many days",
# "how many words may a cover text have at most", "for at least how long". These phrases are
# taken out before the aggregate test (a 1.5B root read "how many days" in a licence as a count
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
    most / least, comparison or pairs), a retrieval of the query itself."""
    if isinstance(plan, LabelCount | Pairs) and not asks_aggregate(query):
        return RetrieveRead(plan="retrieve_read", question=query[:300], keywords=[])
    return plan


def read_plan(text: str, query: str) -> Any:
    """The plan in the root's reply, fitted to the query. A labelling plan that is not even
    valid (one label for both sides: "combination" / "combination") for a query that asks for
    no aggregate is the same misreading `fits` corrects, so it becomes the retrieval too instead
    of a fall-back to code."""
    try:
        return fits(parse(text), query)
    except ValueError:
        m = re.search(r'"plan"\s*:\s*"(label_count|pairs)"', text)
        if m and not asks_aggregate(query):
            return RetrieveRead(plan="retrieve_read", question=query[:300], keywords=[])
        raise


def parse(text: str) -> Any:
    """The plan in the root's reply (ValueError when there is none)."""
    t = text.strip()
    m = re.search(r"\{.*\}", t, re.S)
    if not m:
        raise ValueError("no JSON object in the reply")
    value = json.loads(m.group())
    if isinstance(value, dict) and set(value) == {"choice"}:
        value = value["choice"]
    try:
        return PLAN.validate_python(value)
    except ValidationError as e:
        raise ValueError(f"not a valid plan: {e.errors(include_url=False)[:2]}") from None


# ------------------------------------------------------------------ plans as REPL code
_PRELUDE = '''
plan_read = []      # (piece, reader's answer) of every read: the sources of a retrieval's answer

def _plan_text(c):
    if isinstance(c, str):
        return c
    return json.dumps(c, ensure_ascii=False, default=str, indent=1)

def _plan_records(c):
    if isinstance(c, list):
        return [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str)
                for x in c]
    if isinstance(c, dict):
        return [f"{k}: {v}" for k, v in c.items()]
    blocks = [b.strip() for b in re.split(r"\\n\\s*\\n", c) if b.strip()]
    lines = [x for x in c.splitlines() if x.strip()]
    # entries separated by blank lines, when most of them span several lines
    if len(blocks) >= 3 and len(lines) >= 1.5 * len(blocks):
        return _plan_body(blocks)
    return _plan_body(lines)

def _plan_body(items):
    # a title or header before records that name the same fields is not a record: labelled,
    # a judge_agg header was one more review in every count
    global plan_preamble
    shapes = [tuple(re.findall(r"(?:^|[|;])\\s*([A-Za-z][\\w ]{0,30}?)\\s*[:=]", x))
              for x in items]
    common, n = (collections.Counter(shapes).most_common(1) or [((), 0)])[0]
    k = 0
    if common and n >= 0.8 * len(items):
        while k < min(3, len(items)) and shapes[k] != common:
            k += 1
    plan_preamble = items[:k]
    if k:
        print(f"({k} leading line(s) not in the records' form, left out: {items[0][:80]!r})")
    return items[k:]

def _plan_add(*bounds):
    out = {"calls": 0, "tokens": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    for b in bounds:
        for k in ("calls", "tokens", "input_tokens", "output_tokens"):
            out[k] += b.get(k, 0)
        out["cost_usd"] = None if out["cost_usd"] is None or b["cost_usd"] is None \\
            else out["cost_usd"] + b["cost_usd"]
    return out

def _plan_unsaid(words, labels, records):
    # the query's condition words neither label says (same first 5 letters) and not in most
    # records (field names and record nouns: "Review", "Site")
    stems = {w[:5] for x in labels for w in re.findall(r"[a-z]+", x.lower())}
    common = collections.Counter(w[:5] for x in records
                                 for w in set(re.findall(r"[a-z]+", x.lower())))
    out = [w for w in words if w[:5] not in stems and common[w[:5]] < 0.8 * len(records)]
    # one word more than the labels say is most often a synonym or an alternative the labels
    # stand for ("food" for "a food or a drink"); several are a condition the labels lost
    return out if len(out) >= _PLAN_UNSAID_MIN else []

_PLAN_GUESS = ("Write one short sentence, in plain everyday words, that a document answering "
               "this question might contain (invent the details): ")
_PLAN_K, _PLAN_BEFORE, _PLAN_AFTER = 6, 300, 1500
# what one reader reads: about 300 tokens. Given a whole widened window (~900 tokens of a
# licence) the 1.5B replied "none" for the sentence that held the answer, and given the hit's
# own passage it was right on 7 of 8 dev lookups (issue 34, dev probe 2026-12-06)
_PLAN_PIECE = 320

def _plan_can_search():
    try:
        search("probe", k=1)       # no model call; fails without the search extra
        return True
    except Exception:
        return False

def _plan_searched(question, keywords):
    # the passages search() ranks first for a sentence the sub-model writes as a made-up answer
    # (HyDE: an answer's words are closer to the passage's than the question's are) and the
    # keywords the question does not already say; each widened, since a passage often starts a
    # section whose facts come later
    guess = llm_query(_PLAN_GUESS + question, max_tokens=60)
    guess = "" if guess.startswith("Error:") else guess
    new = [w for w in keywords if w.lower() not in question.lower()]
    # a guess with no word search() can use ("1": the question said "answer with the number
    # only") finds nothing; the question itself then
    hits = search(" ".join([guess, *new]).strip() or question, k=_PLAN_K) or \
        search(question, k=_PLAN_K)
    spans = {}
    for h in hits:
        key = h.get("item")
        spans.setdefault(key, []).append((max(0, h["start"] - _PLAN_BEFORE),
                                          h["end"] + _PLAN_AFTER))
    out = []
    for key, ranges in spans.items():
        for a, b in sorted(ranges):   # overlapping windows merged, in text order
            if out and out[-1][0] == key and a <= out[-1][2]:
                out[-1][2] = max(out[-1][2], b)
            else:
                out.append([key, a, b])
    windows = [(context if key is None else _plan_text(context[key]))[a:b] for key, a, b in out]
    return [p for w in windows for p in chunk(w, _PLAN_PIECE)]     # each a short read

def _plan_chunks(keywords):
    pieces = chunk(_plan_text(context))
    if keywords:
        hit = [p for p in pieces if any(re.search(re.escape(k), p, re.I) for k in keywords)]
        pieces = hit or pieces
    return pieces

def _plan_field(rec, name):
    m = re.search(r"(?<!\\w)" + re.escape(name) + r"\\s*[:=]\\s*([^|\\n;]+)", rec, re.I)
    return m.group(1).strip().rstrip(".,") if m else None

def _plan_by_group(name, labels):
    # the judgements counted per value of one record field, the way a grouped question asks
    global record_groups, group_counts
    record_groups = [_plan_field(x, name) for x in records]
    missing = sum(g is None for g in record_groups)
    group_counts = {}
    for g, x in zip(record_groups, record_labels):
        if g is not None:
            group_counts.setdefault(g, collections.Counter())[x] += 1
    if not group_counts:
        print(f"no record has a field {name!r}: no counts by group")
        return
    counted = labels[-1]          # LabelCount.labels: the opposite first, the counted last
    ranked = sorted(group_counts, key=lambda g: -group_counts[g][counted])
    print(f"by {name} ({' / '.join(labels)}):")
    for g in ranked:
        print(f"  {g}: " + ", ".join(f"{group_counts[g][x]} {x}" for x in labels))
    print(f"most {counted}: {ranked[0]} ({group_counts[ranked[0]][counted]}) | fewest "
          f"{counted}: {ranked[-1]} ({group_counts[ranked[-1]][counted]})")
    if missing:
        print(f"({missing} records have no field {name!r})")

# a reader's "no answer here" in its own words ("The text does not specify a limit ...")
# ("The license steward of this licence is none.")
_PLAN_NONE = re.compile(r"(?i)(^|\\W)none$|text (does not|doesn't|did not) (say|state|specify|"
                        r"mention|provide|give|include|contain)|not (specified|stated|mentioned)"
                        r"( in the text)?$|\\bno (information|mention)\\b")

# every part: asked "who ... and what ...", the 1.5B answered with a name alone
_PLAN_READ = (" Answer every part of the question from the text in one short sentence, "
              "or reply 'none' if the text does not say.")

def _plan_retrieve(question, keywords, dry):
    # with search(): a made-up answer, a search, and one read of each hit; without: every
    # chunk (or those holding a keyword) filtered by the question, then the relevant ones read
    searched = _plan_can_search()
    if dry:
        if searched:
            window = "x" * (_PLAN_BEFORE + _PLAN_AFTER + 1200)      # a widened passage, at most
            pieces = chunk(window, _PLAN_PIECE) * _PLAN_K
            return _plan_add(llm_map(_PLAN_GUESS, [question], dry_run=True, max_tokens=60),
                             llm_map(question + _PLAN_READ, pieces, dry_run=True))
        cand = _plan_chunks(keywords)
        return _plan_add(llm_filter(question, cand, dry_run=True),
                         llm_map(question + _PLAN_READ, cand, dry_run=True))
    cand = _plan_searched(question, keywords) if searched else _plan_chunks(keywords)
    hits = cand if searched else llm_filter(question, cand)
    answers = llm_map(question + _PLAN_READ, hits) if hits else []
    found = [a for a in answers if a and not _PLAN_NONE.search(a.strip(" .'\\""))]
    plan_read.extend((h, a) for h, a in zip(hits, answers) if a in found)
    how = "found by search()" if searched else "checked"
    print(f"{len(cand)} pieces {how}, {len(hits)} read; answers: {found}")
    return found
'''


# Words of a query that frame the aggregate or the answer, not the condition one record must
# meet: what is left of a query without them (and without proper names, which name groups) is
# what a leaf has to judge.
_FRAME = frozenset("""
how many much which what who whose whom most least fewest fewer often frequently number numbers
count counted counting total share proportion percentage ratio these those them their here there
record records entry entries item items line lines one ones text texts all each every any among
between answer reply name names only just give tell list write word words please with without
more less than greater compare comparison average majority minority times time say says said
get gets got gotten receive receives received trail trails lead leads ahead behind beat beats
exceed exceeds describe describes described define defines defined mention mentions
mentioned concern concerns refer refers express expresses
reviews messages notes tickets comments posts emails documents rows reports sentences entries
definitions descriptions responses replies questions answers statements passages paragraphs
glosses gloss reviewers writers authors
the and for are was were been being has have had does did doing not nor but from into onto over
under about above below after before again also you your our its it's they them then this that
some such same other own very can could would should will shall may might must
""".split())


def condition_words(query: str) -> list[str]:
    """The query's words that say what a record must be to count (its content words, minus the
    aggregate frame, the answer instruction and capitalised names), lowercased."""
    out: list[str] = []
    for m in re.finditer(r"[A-Za-z][A-Za-z'-]+", query):
        w = m.group().strip("'-")
        low = w.lower().removesuffix("'s")
        if len(low) < 3 or low in _FRAME or low in out:
            continue
        if w[0].isupper() and m.start() > 0:      # a name (a group's value), not a condition
            continue
        out.append(low)
    return out


QUERY_LEAF = 'Does the text below match this description: "{condition}"? Answer yes or no.'
UNSAID_MIN = 2       # unsaid condition words that make the leaves judge the query's own words


def condition_phrase(query: str) -> str:
    """The query's condition in its own words: its first sentence from its first condition
    word on ("How many of the notes say the pump leaked?" -> "pump leaked")."""
    first = re.split(r"(?<=[?.!])\s", query.strip(), maxsplit=1)[0].rstrip("?.! ")
    words = condition_words(first)
    if not words:
        return first
    m = re.search(r"(?i)\b" + re.escape(words[0]), first)
    start = m.start() if m else 0
    # keep the little words just before it ("about a", "not") that carry its sense
    head = first[:start].split()
    while head and head[-1].lower() in ("a", "an", "the", "about", "not", "no"):
        start = first.rfind(head.pop(), 0, start)
    return first[start:].strip()


def plan_code(plan: Any, dry: bool, query: str = "") -> str:
    """The REPL code of a plan; `dry`: it prints its bound as JSON instead of running.
    `query`: the run's query, whose condition a labelling plan's leaves judge when the plan's
    two labels do not say all of it (the leaf question is then built from the query's words)."""
    r = repr
    if isinstance(plan, RetrieveRead):
        body = f"plan_answers = _plan_retrieve({r(plan.question)}, {r(plan.keywords)}, {dry})"
        out = "plan_answers"
    elif isinstance(plan, TwoHop):
        if dry:   # the second question's key is unknown yet: bound it by the first's length
            body = (f"_b1 = _plan_retrieve({r(plan.first_question)}, [], True)\n"
                    f"plan_bound = _plan_add(_b1, _b1)")
            out = "plan_bound"
        else:
            body = (f"first_answers = _plan_retrieve({r(plan.first_question)}, [], False)\n"
                    "first_answer = collections.Counter(first_answers).most_common(1)[0][0] "
                    "if first_answers else None\n"
                    "print('first answer:', first_answer)\n"
                    f"plan_answers = _plan_retrieve({r(plan.second_question)}.replace("
                    "'{answer}', str(first_answer)), [], False) if first_answer else []")
            out = "plan_answers"
    elif isinstance(plan, LabelCount | Pairs):
        # a pairs plan's instruction is about the whole job ("label every record, then list
        # the pairs ..."), not a question one record can answer: its leaves get the sides too,
        # named as label_count names them, the query's own side last: the 1.5B lists that side
        # first (["complaint", "praise"]), and asked "complaint or praise?" it called nearly
        # every review a complaint (dev probe: 25 of 40 right; "praise or complaint?" 40 of 40)
        question = leaf_question(plan.labels if isinstance(plan, LabelCount)
                                 else plan.labels[::-1])
        body = f"records = _plan_records(context)\nplan_labels = {r(plan.labels)}\n"
        words = condition_words(query) if isinstance(plan, LabelCount) else []
        if words:
            # a root that turned "complain they were billed the wrong amount" into the labels
            # complain / satisfied counted every complaint: when the labels leave words of the
            # query's condition unsaid (words most records carry, such as field names, aside),
            # each leaf judges the query itself, yes or no, mapped back onto the plan's labels
            body += (
                f"_PLAN_UNSAID_MIN = {UNSAID_MIN}\n"
                f"_plan_w = _plan_unsaid({r(words)}, plan_labels, records)\n"
                f"_plan_q = {r(QUERY_LEAF.format(condition=condition_phrase(query)[:300]))}"
                " if _plan_w else "
                f"{r(question)}\n"
                "if _plan_w:\n"
                "    print(f'the labels leave the query\\'s words {_plan_w} unsaid: each record "
                "is judged against the query itself')\n"
                "_plan_y = llm_map(_plan_q, records, labels=['no', 'yes'] if _plan_w else "
                f"plan_labels{', dry_run=True' if dry else ''})\n")
            body += ("record_labels = _plan_y if not _plan_w or isinstance(_plan_y, dict) else "
                     "[None if x is None else plan_labels[x == 'yes'] for x in _plan_y]")
        else:
            body += (f"record_labels = llm_map({r(question)}, records, labels=plan_labels"
                     f"{', dry_run=True' if dry else ''})")
        out = "record_labels"
        if not dry and isinstance(plan, LabelCount):
            body += (
                "\nlabel_counts = collections.Counter(x for x in record_labels if x)\n"
                "print(f'{len(records)} records labelled; counts:')\n"
                "for _l in plan_labels:\n    print(f'  {_l}: {label_counts[_l]}')\n"
                "print('unlabelled:', sum(x is None for x in record_labels))")
            out = "label_counts"
            if plan.group_by.strip():
                body += f"\n_plan_by_group({r(plan.group_by.strip())}, plan_labels)"
        if not dry and isinstance(plan, Pairs):
            prefix = plan.id_prefix.strip()
            # a record without the prefix has no id (its number would be taken for a real one)
            ident = (f"(re.search(re.escape({r(prefix)}) + r'[\\s:#=]*(\\w[\\w-]*)', _rec) or "
                     "[None, None])[1]" if prefix else "str(_i + 1)")
            body += (
                f"\nrecord_ids = [{ident} for _i, _rec in enumerate(records)]\n"
                f"_keep = {r(plan.keep)}\n"
                "kept_ids = sorted({i for i, x in zip(record_ids, record_labels) "
                "if i is not None and x in _keep}, "
                "key=lambda x: (not x.isdecimal(), int(x) if x.isdecimal() else 0, x))\n"
                "plan_pairs = pairs(kept_ids)\n"
                "id_counts, id_unlabelled = {}, collections.Counter()\n"
                "for _plan_i, _plan_x in zip(record_ids, record_labels):\n"
                "    if _plan_i is not None:\n"
                "        id_counts.setdefault(_plan_i, collections.Counter()).update("
                "[_plan_x] if _plan_x else [])\n"
                "        id_unlabelled[_plan_i] += _plan_x is None\n"
                "print(f'{len(id_counts)} ids; records per label:')\n"
                "for _plan_i in sorted(id_counts, key=lambda x: (not x.isdecimal(), "
                "int(x) if x.isdecimal() else 0, x))[:100]:\n"
                "    print(f'  {_plan_i}: ' + ', '.join(f'{_l} {id_counts[_plan_i][_l]}' "
                "for _l in plan_labels))\n"
                "print(f'{len(records)} records, {len(kept_ids)} ids with a label in "
                "{_keep}: {kept_ids[:100]}')\n"
                "print(f'{len(plan_pairs)} pairs:', plan_pairs[:200])")
            out = "plan_pairs"
    else:
        raise ValueError(f"no code for plan {plan!r}")
    # the plan's helpers leave the REPL; its results stay
    tidy = ("for _n in [n for n in globals() if n.startswith(('_plan', '_PLAN', '_b1', "
            "'_keep', '_ranked', '_l', 'plan_bound'))]:\n    del globals()[_n]\ndel _n")
    if dry:
        return f"{_PRELUDE}\n{body}\nprint(json.dumps({out}))\n{tidy}"
    return f"{_PRELUDE}\n{body}\n{tidy}"


def leaf_question(labels: list[str]) -> str:
    """The per-record question of a labelling plan, written from its sides: it names every
    side, so it does not lead (asked "is this a complaint?", the 1.5B says yes to every
    review; asked which of two sides fits, it was right on 37 of 40, dev split)."""
    *head, last = labels
    return f"Which fits the text better: {', '.join(head)} or {last}?"


def describe(plan: Any) -> str:
    return json.dumps(plan.model_dump(), ensure_ascii=False)


# ------------------------------------------------------------------ the planned step
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
        noun = "pieces read" if isinstance(plan, RetrieveRead | TwoHop) else "records judged"
        st.partial = "; ".join(p.describe(noun) for p in cut)
        st.limit = cut[-1].limit
    env.tracer.emit("plan", id=ev, phase="end", parent=turn.id, depth=run.depth,
                    bound=bound, error=cell.error, **({"partial": st.partial} if cut else {}))
    turn.end(comp, blocks=2)
    if cell.error:
        return _note(run, f"it failed: {cell.error[-300:]}")
    output = (cell.stdout or "").strip() or "(nothing)"
    shown = output[:env.max_output_chars]
    names = ", ".join(n for n in cell.variables if not n.startswith("_")
                      and n in ("plan_answers", "first_answer", "records", "record_labels",
                                "label_counts", "record_groups", "group_counts", "record_ids",
                                "kept_ids", "plan_pairs", "id_counts", "plan_read"))
    _preface(run, RESULTS.format(plan=describe(plan), calls=bound["calls"],
                                 tokens=bound["tokens"], output=shown, names=names),
             replace_start=True)
    from recursa.core.guards import plain_digits
    st.seen.append(plain_digits(output))
    if isinstance(plan, LabelCount) and await _answer_by_count(run, plan):
        return True
    if isinstance(plan, Pairs) and await _answer_by_pairs(run, plan):
        return True
    return await _answer(run, shown, sourced=isinstance(plan, RetrieveRead | TwoHop))


async def _answer_by_count(run: Run, plan: LabelCount) -> bool:
    """After a labelling plan: the root chooses which count answers the query, the REPL
    computes it; a number or name it gives is the run's final answer."""
    def code(reply: str) -> tuple[str, dict[str, Any]] | None:
        op = parse_count_choice(reply)
        return (count_code(op, run.query, plan.label), {"count_op": op}) if op else None
    return await _computed_answer(
        run, count_messages(run.query, plan.labels, plan.group_by.strip()),
        CountChoice.model_json_schema(), COUNT_MAX_TOKENS, code,
        lambda cell: scalar_answer(last_value(cell)), count_choice=True)


async def _answer_by_pairs(run: Run, plan: Pairs) -> bool:
    """After a pairs plan: the root writes the condition on each id of a pair as bounds on its
    label counts, the REPL builds the pairs from the per-id counts."""
    def code(reply: str) -> tuple[str, dict[str, Any]] | None:
        rule = parse_pair_rule(reply, plan.labels)
        return (pair_code(rule), {"pair_rule": rule.model_dump()}) if rule else None
    return await _computed_answer(
        run, pair_messages(run.query, plan.labels), pair_schema(plan.labels), PAIR_MAX_TOKENS,
        code, committed, pair_rule=True)


async def _computed_answer(run: Run, messages: list[Message], schema: dict[str, Any],
                           max_tokens: int, code_for: Any, to_answer: Any,
                           **mark: Any) -> bool:
    """One typed root call (constrained by `schema` where the client takes one), turned into REPL
    code by `code_for(reply)` (with what the trace keeps of the choice); what `to_answer(cell)`
    reads from the cell (its printed value, or what it committed) is the run's final answer. A
    reply that does not parse, a value the labels cannot give (None) or an error leaves the
    answer to the plain call."""
    env, st = run.env, run.st
    if env.output is not None or env.sources:
        return False
    turn = run.rec.turn(turn=st.turns + 1, plan_answer=True, **mark)
    options = {**env.root_options, "temperature": 0.0, "max_tokens": max_tokens}
    from recursa.models.registry import structured_output
    if structured_output(env.root_client) == "json_schema":
        options["json_schema"] = schema
    try:
        comp = await env.dispatcher.call_model(env.root_client, messages, role="root",
                                               subcall=False, options=options,
                                               force=_at_limit(env))
    except (ModelError, BudgetExceeded) as e:
        turn.fail(str(e))
        return False
    st.turns += 1
    turn.replied(comp)
    made = code_for(comp.text)
    if made is None:
        turn.end(comp, blocks=0, plan_answer=None)
        return False
    code, seen = made
    cell = await _cell(run, turn, 0, code)
    answer = None if cell.error else to_answer(cell)
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
    try:
        comp = await env.dispatcher.call_model(env.root_client, messages, role="root",
                                               subcall=False, options=options,
                                               force=_at_limit(env))
    except (ModelError, BudgetExceeded) as e:
        turn.fail(str(e))
        return False
    st.turns += 1
    turn.replied(comp)
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
    return (f"_plan_f = {final!r}\n"
            "_plan_n = lambda s: ' '.join(re.findall(r'\\w+', str(s).lower()))\n"
            "_plan_m = [p for p, a in plan_read if _plan_n(a) and (f' {_plan_n(a)} ' in "
            "f' {_plan_n(_plan_f)} ' or f' {_plan_n(_plan_f)} ' in f' {_plan_n(a)} ')]\n"
            "answer = {'content': _plan_f, 'ready': True, "
            "'sources': _plan_m or [p for p, _ in plan_read]}\n"
            "print(len(answer['sources']), 'sources')\n"
            "del _plan_f, _plan_n, _plan_m")


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
