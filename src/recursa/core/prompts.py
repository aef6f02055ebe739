"""The root model's system prompt, the first user message and the nudges of the loop."""

from __future__ import annotations

SYSTEM = """You answer a query about a context that is too large to read at once. The context is \
NOT in this conversation: it is stored in the variable `context` inside a persistent Python REPL. \
You work by writing Python code in ```repl blocks; you see only what your code prints (at most \
{max_output_chars} characters per turn, so print summaries, not whole documents). Variables \
persist between turns.

In the REPL:
- `context`: the data (its type, size and start are in the first message).
- `llm_query(prompt: str) -> str`: ask a language model one question. It sees only the prompt \
(up to about {sub_chars} characters), so put the text it must read into the prompt.
- `llm_batch(prompts: list[str]) -> list[str]`: many llm_query calls in parallel; much faster \
than a loop. A failed call returns a string starting with "Error:".
- `rlm_query(prompt: str, context=None) -> str`, `rlm_batch(prompts, contexts=None)`: hand \
sub-tasks to recursive copies of yourself, each with its own REPL.
{search}{combinators}- `answer`: a dict {{"content": "", "ready": False}}. Build your answer in answer["content"] \
(over several turns if needed); set answer["ready"] = True only when it is final.
- `FINAL(value)` commits the answer and ends the run; `FINAL_VAR("name")` commits the variable \
called `name`. `SHOW_VARS()` lists your variables.
{sources}{tools}
How to work: look at the context (its length, a sample). A question about the context itself \
(how many lines or records, the longest entry) needs code only, e.g. \
`len(context.splitlines())`. Otherwise search it with code (slicing, str.find, re; `re`, \
`json`, `collections` are imported), and use llm_query / llm_batch on the pieces you found when a judgement needs \
reading (pieces of at most about {chunk} characters). Search for the query's most specific \
words (names, rare terms) ignoring case; if a search finds nothing, try other words. Print what \
you find. Every number or name in your answer must come from output you have seen: never guess. Never send the same code twice \
(its output will not change). Never assign to `context`. As soon as the output answers the \
query, commit it with FINAL(...) in a ```repl block.

{example}{tips}"""

EXAMPLE = """Example of a whole run (another task). Query: "In which city was the Ada meeting held?"
Turn 1:
```repl
print(len(context))
print(context[:300])
```
Output: 184023, then the start of some meeting notes.
Turn 2:
```repl
import re
# the query's rarest word alone: a longer phrase may be worded differently in the text
hits = [m.start() for m in re.finditer("ada", context, re.IGNORECASE)]
print(len(hits))
pieces = [context[max(0, i - 500):i + 4000] for i in hits[:5]]
# the text first, then the query itself
found = llm_batch([p + "\\n\\nIn which city was the Ada meeting held? Answer from the text \
above, or reply 'none'." for p in pieces])
print(found)
```
Output: 3, then ['Lyon', 'none', 'Lyon']
Turn 3:
```repl
FINAL("Lyon")
```
"""

# RLM(sources=True) / --sources: the answer carries the passages it rests on (recursa.core.sources)
SOURCES = """- Sources: commit with `FINAL(value, sources=[passage, ...])`, or set \
`answer["sources"] = [passage, ...]` next to answer["content"]. A passage is text of `context` \
your answer rests on (the piece you read, e.g. `pieces[0]`, or a search() hit). They are checked \
against the context and shown with the answer.
"""

NO_SOURCES = """Not committed yet: give the passages of `context` your answer rests on \
(the text you read that shows the answer; it is kept as a draft in answer["content"]). Commit it \
with them:
```repl
FINAL(answer["content"], sources=[{passage}])
```"""

# the worked example's last turn when sources are asked for
EXAMPLE_FINAL = 'FINAL("Lyon")'
EXAMPLE_FINAL_SOURCES = 'FINAL("Lyon", sources=[pieces[0]])'

# search() is answered on the host (recursa/core/search_host.py) when the `search` extra is installed
SEARCH = """- `search(query, k=5)`: the k passages closest to the query by meaning and by \
words, best first: [{"text", "start", "end", ...}], text being context[start:end]. It finds text \
worded unlike the query.
"""

COMBINATORS = """- `llm_map(instruction, items, labels=None, output=None)`: llm_query on every item, in \
parallel; `labels=[...]` makes each answer one of the labels, `output="number"` a number. \
`llm_filter(question, items)`: the items answered yes. `llm_reduce(instruction, items)`: one \
answer from all. `chunk(text)`: pieces that fit one call. `pairs(items, labels, keep=[...])`: \
pairs of the items whose label is in keep (no model call). `dry_run=True`: calls and tokens, \
without running.
"""

FIRST_USER = """Query: {query}

The context in the REPL variable `context`:
{description}

Start by writing code to explore `context`. Do not answer before you have looked at it."""

NO_CODE = """Your reply had no ```repl code block, so nothing ran. Write code in a ```repl block; \
to finish, set answer["content"] and answer["ready"] = True (or call FINAL(...)) in code."""

CONTINUE = """The query: {query}
Write the next ```repl block, building on the output above. When you know the answer, set \
answer["content"] and answer["ready"] = True, or call FINAL(...)."""

REPEATED = """You sent the same code as in turn {turn}, so it was not run again. {what}

Do not send it again. {todo}"""

REPEATED_OK = "It printed:\n{output}"
REPEATED_FAILED = "It failed:\n{output}"
TODO_OK = ("Use that output: search `context` with new code, call llm_query / llm_batch on the "
           "pieces you found, or, if the output already answers the query, write a ```repl block "
           "that calls FINAL with the answer.")
TODO_FAILED = "Fix the error and send corrected code."

DRAFT = """Your reply had no ```repl block, so I took it as your draft answer: \
answer["content"] = {draft!r}. If it is correct, commit it:
```repl
FINAL(answer["content"])
```
If it is not, write code to find the answer."""

UNGROUNDED = """Not committed yet: your answer contains {number}, which none of the outputs \
so far shows, so it may be a guess (it is kept as a draft in answer["content"]). Find the \
evidence with code first: search `context` for the query's most specific words or names \
(ignoring case), print what you find, and read long pieces with llm_query. Only if you are sure, \
commit the same answer again."""

EMPTY_ANSWER = """Not committed: the answer is empty. Print the values your code computed to see \
where it went wrong (a search or a filter that matched nothing?), fix it, and commit a \
non-empty answer."""

COMPACTED = """[Turns {first}-{last} were removed from this conversation to fit the model's context \
window. What they did:]
{items}

Variables in the REPL: {variables}.{history}
Continue from the turns below; do not redo work that is already done."""

COMPACTED_HISTORY = (" The full earlier conversation is in the REPL variable `{name}`, a list of "
                     "{{\"role\", \"content\"}} dicts.")

LAST_TURN = """The run has reached its limit ({limit}): no more code will run. Reply now with your \
best final answer to the query as plain text, using what you have found so far. Query: {query}"""

LAST_TURN_OUTPUT = "\nThe answer must be JSON matching the schema you were given."

INVALID_OUTPUT = """Not committed: the answer does not match the required JSON schema:
{errors}
Fix it and commit a JSON value that matches the schema: {example}."""

# the allowed tools of the run's MCP servers, as REPL functions (recursa.core.mcp_tools)
REPL_TOOLS = """- Tools of MCP servers, called from code like any function (each returns the tool's \
result: a str, list or dict; a failed call raises; help(name) shows its arguments):
{lines}
"""

TOOLS_LINE = "- Your sub-models (llm_query, llm_batch) can use these tools, which you cannot call " \
             "yourself: {names}. Ask them in plain words to use the tools.\n"


def system_prompt(*, context_type: str, max_output_chars: int, sub_chars: int = 100_000,
                  tips: str | None = None, tool_names: list[str] | None = None,
                  template: str | None = None, example: bool = True,
                  search: bool = False, sources: bool = False,
                  repl_tools: list[str] | None = None) -> str:
    """The root's system prompt; `example=False` leaves the worked example out (to ablate it:
    it was written on dev tasks, and a small model may copy it onto unrelated questions).
    The built-in prompt names nothing of this run's context (that is in the first user message),
    so runs with the same settings share it whole and a local server's prompt cache reads it
    once: the context's size in the system prompt made ~1,000 tokens of it new in every run.
    `context_type` is still given to a custom `template`.
    `sources=True` adds the rule and the example's commit with sources (recursa.core.sources).
    `repl_tools`: one line per MCP tool the REPL holds (signature: summary)."""
    tools = TOOLS_LINE.format(names=", ".join(tool_names)) if tool_names else ""
    if repl_tools:
        tools = REPL_TOOLS.format(lines="\n".join(f"  - {line}" for line in repl_tools)) + tools
    tips_s = f"\n<tips>\n{tips.strip()}\n</tips>\n" if tips else ""
    return (template or SYSTEM).format(context_type=context_type,
                                       max_output_chars=max_output_chars, sub_chars=sub_chars,
                                       chunk=max(1000, min(20_000, sub_chars // 2)),
                                       tools=tools, tips=tips_s, combinators=COMBINATORS,
                                       search=SEARCH if search else "",
                                       sources=SOURCES if sources else "",
                                       example=(_example_with_sources() if sources else EXAMPLE)
                                       if example else "")


def _example_with_sources() -> str:
    assert EXAMPLE_FINAL in EXAMPLE, "the worked example's commit changed: update EXAMPLE_FINAL"
    return EXAMPLE.replace(EXAMPLE_FINAL, EXAMPLE_FINAL_SOURCES)
