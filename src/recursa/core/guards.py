"""What small models get wrong, handled by the loop the same way for every task (design note 10):
a cell sent again, an answer stated in prose, an answer with a number (or words) typed in that no
output ever showed.

Each guard is a function of the run's state (recursa.core.state): it updates the state, records what
it did in the turn's end event (`extra`) and returns a `Nudge`: the message to send the model
instead of the plain feedback, and the harness code the loop must run in the REPL (a held
commit is turned back into a draft there too). No guard calls back into the loop.
"""

from __future__ import annotations

import re
from typing import Any

from recursa.core import prompts
from recursa.core.compaction import abridge
from recursa.core.output import OutputInvalid, OutputSpec
from recursa.core.parse import cap, prose_answer
from recursa.core.state import Nudge, RunState

_NUMBER = re.compile(r"(?<![\d.])\d[\d,]*\d(?![\d])")
_WORD = re.compile(r"[a-z][a-z'-]{3,}")
_STOP = frozenset("""that this with from were have been which their there they them then than
what when where will would could should about into over also only some such more most very
your yours answer final none unknown found because after before other these those while""".split())


def plain_digits(text: str) -> str:
    """`text` with thousands separators inside numbers dropped (42,733 -> 42733)."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def repeated(st: RunState, extra: dict[str, Any]) -> str:
    """The reminder for a turn whose code is the last code that ran: it is not run again."""
    extra["repeat_of"] = st.last_turn
    st.log.append(f"Turn {st.turns}: sent turn {st.last_turn}'s code again (not run).")
    what = prompts.REPEATED_FAILED if st.last_failed else prompts.REPEATED_OK
    return prompts.REPEATED.format(turn=st.last_turn, what=what.format(
        output=cap(st.last_shown, 600)),
        todo=prompts.TODO_FAILED if st.last_failed else prompts.TODO_OK)


def prose(st: RunState, text: str, extra: dict[str, Any]) -> Nudge:
    """A reply without code that states an answer, once some code has run (design note 10):
    "Final answer: X" commits X; a short reply, or "Answer: X", becomes the draft
    answer["content"] (unless code already built a different draft), and the same draft stated
    again commits it. The nudge's text None: the plain NO_CODE message.
    """
    st.log.append(f"Turn {st.turns} replied without code: {abridge(text.strip(), 200)}")
    found = prose_answer(text) if st.cells_run else None   # before any output: a guess
    if found is None:
        return Nudge()
    explicit, answer = found
    if explicit or answer == st.prose_draft:
        st.final = answer
        extra["prose_answer"] = {"kind": "final", "content": answer}
        return Nudge()
    current = str(st.answer.get("content") or "")
    if current and current != st.prose_draft:
        return Nudge()        # code built a draft: a sentence does not replace it
    st.prose_draft = answer
    st.answer = {"content": answer, "ready": False}
    extra["prose_answer"] = {"kind": "draft", "content": answer}
    return Nudge(prompts.DRAFT.format(draft=answer), repl=f"answer[{'content'!r}] = {answer!r}")


def hold_ungrounded(st: RunState, source: str, ran_code: bool,
                    extra: dict[str, Any]) -> Nudge | None:
    """The first commit whose answer holds what was typed in by hand but never shown (see
    `ungrounded`; `source` is the code or text that committed it) is held once: it stays the
    draft, and the returned nudge (after the turn's output when `ran_code`) asks for the
    evidence. None when nothing is held; a second commit is accepted whatever it is."""
    if st.final is not None and not st.final.strip():    # never a right answer: every time
        extra["held"] = {"answer": st.final, "empty": True}
        return _unready(st, ran_code, prompts.EMPTY_ANSWER)
    if st.final is None or st.held:
        return None
    number = ungrounded(st, st.final, source)
    if not number:
        return None
    st.held = True
    extra["held"] = {"answer": st.final, "number": number}
    return _unready(st, ran_code, prompts.UNGROUNDED.format(number=number))


# variables that usually hold the text a small model read (the worked example's `pieces` first)
_PASSAGE_VARS = ("pieces", "piece", "snippets", "snippet", "chunks", "chunk", "passages",
                 "passage", "matches", "lines", "hits_text", "text")


def hold_unsourced(st: RunState, ran_code: bool, extra: dict[str, Any]) -> Nudge | None:
    """With sources asked for (RLM(sources=True)): the first commit that gives none is held
    once, and the model is shown the line that commits it with sources (naming a variable it
    has that likely holds what it read). A second commit is accepted either way."""
    if st.final is None or not st.final.strip() or st.answer.get("sources") or \
            st.sources_asked:
        return None
    st.sources_asked = True
    extra["held"] = {"answer": st.final, "sources": "none given"}
    name = next((v for v in _PASSAGE_VARS if v in st.variables), None)
    passage = "context[start:end]" if name is None else \
        f"{name}[0]" if name.endswith("s") else name
    return _unready(st, ran_code, prompts.NO_SOURCES.format(passage=passage))


def to_structure(st: RunState, spec: OutputSpec) -> str | None:
    """A commit written as plain text (not JSON at all) that does not match the output schema:
    the loop first gives it to one sub-call that fills the schema from it
    (`OutputSpec.structuring_request`). None: nothing to structure."""
    if st.final is None or not st.final.strip() or spec.looks_structured(st.final):
        return None
    try:
        spec.parse(st.final)
    except OutputInvalid:
        return st.final
    return None


def structured(st: RunState, filled: str, extra: dict[str, Any]) -> None:
    """The schema filled from the plain-text commit (by `to_structure`'s sub-call) is the
    commit now."""
    extra["structured"] = {"from": st.final}
    st.final = filled


def hold_invalid(st: RunState, spec: OutputSpec, ran_code: bool,
                 extra: dict[str, Any]) -> Nudge | None:
    """A commit that does not match the run's output schema is held, every time: it stays the
    draft and the validation error goes back to the model. None when the commit is valid."""
    if st.final is None:
        return None
    try:
        spec.parse(st.final)
    except OutputInvalid as e:
        extra["held"] = {"answer": st.final, "invalid": str(e)}
        return _unready(st, ran_code, prompts.INVALID_OUTPUT.format(
            errors=e, example=spec.commit_example()))
    return None


def _unready(st: RunState, ran_code: bool, note: str) -> Nudge:
    """Turn the commit back into a draft (the nudge's code does it in the REPL too); the
    message, after the turn's output when code ran."""
    # the draft keeps the sources the commit gave (recursa.core.sources), in the REPL too
    st.answer = {**st.answer, "content": st.final, "ready": False}
    st.final = None
    st.last_code = None     # sending the same commit again confirms it
    return Nudge(f"{st.last_shown}\n\n{note}" if ran_code else note,
                 repl=f"answer = {{**(answer if isinstance(answer, dict) else {{}}), "
                 f"'content': {st.answer['content']!r}, 'ready': False}}")


def ungrounded(st: RunState, answer: str, source: str) -> str | None:
    """What the model wrote into its answer by hand (it is in the code or text that committed
    it) but no output ever showed: a number of three or more digits that neither an output nor
    the query holds, or, for an answer typed whole as a literal, content words of which not one
    appears in any output (the query's own words do not count as evidence)."""
    seen = "\n".join(st.seen)
    for m in _NUMBER.finditer(answer):
        number = plain_digits(m.group())
        if len(number) < 3 or m.group() not in source:
            continue
        if not re.search(rf"(?<!\d){re.escape(number)}(?!\d)", seen):
            return m.group()
    if answer.strip() not in source:     # computed by code, not typed: not a guess
        return None
    outputs = "\n".join(st.seen[1:]).lower()          # st.seen[0] is the first user message
    asked = set(_WORD.findall(st.first_user.lower()))
    words = [w for w in dict.fromkeys(_WORD.findall(answer.lower()))
             if w not in _STOP and w not in asked]
    if len(words) >= 2 and not any(re.search(rf"\b{w}\b", outputs) for w in words):
        return ", ".join(repr(w) for w in words[:3])
    return None
