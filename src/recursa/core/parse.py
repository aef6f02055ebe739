"""Extracting code from model replies and formatting cell output for the model."""

from __future__ import annotations

import ast
import io
import re
import tokenize

from recursa.base.locks import AST_LOCK  # one lock for every ast.parse in this process
from recursa.base.types import Cell


def parse_python(code: str) -> ast.Module:
    """ast.parse under AST_LOCK."""
    with AST_LOCK:
        return ast.parse(code)

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S)


# After a closing fence, a line like the system prompt's worked example ("Output: ...",
# "Turn 3:") is the model writing the REPL's output itself instead of waiting for it.
_IMAGINED = re.compile(r"\n[ \t]*```[ \t]*\n\s*(?:Output|OUTPUT|Turn \d+)\s*:")


# The same, as stop strings for a client that takes them: the reply ends at the made-up output
# instead of generating it (a 1.5B writes ~250 tokens of it, ~25 s here, in some turns).
IMAGINED_STOPS = tuple(f"```{gap}{word}" for gap in ("\n", "\n\n")
                       for word in ("Output:", "OUTPUT:", "Turn "))


def close_fence(text: str) -> str:
    """`text` with a code block that a stop string left open closed again, so the history the
    model reads next shows its cell as it wrote it."""
    if text.count("```") % 2 == 1 and _FENCE.search(text) is not None:
        return text.rstrip("\n") + "\n```"
    return text


def cut_imagined(text: str) -> str | None:
    """The reply up to the end of the first code block the model followed with output it made
    up (and then, often, a made-up next turn that commits a guess); None when there is none."""
    m = _IMAGINED.search(text)
    if m is None:
        return None
    end = text.index("```", m.start())
    return text[:end + 3]


def code_blocks(text: str) -> list[str]:
    """The ```repl blocks of a reply, in order; else its ```python / ```py blocks; else its bare
    ``` blocks (small models often drop the language name).

    An unterminated last fence still counts (models often stop mid-fence at their output cap).
    """
    blocks: dict[str, list[str]] = {"repl": [], "python": [], "": []}
    for m in _FENCE.finditer(text):
        lang = m.group(1).lower()
        body = m.group(2)
        if lang == "repl":
            blocks["repl"].append(body)
        elif lang in ("python", "py", "python3"):
            blocks["python"].append(body)
        elif lang == "":
            blocks[""].append(body)
    chosen = blocks["repl"] or blocks["python"] or blocks[""]
    return [b for b in chosen if b.strip()]


_FINAL_LINE = re.compile(r"^[ \t>*`]*(FINAL(?:_VAR)?\(.*\))[ \t*`.]*$", re.M)
_FINAL_MARK = re.compile(r"^[ \t>#*_-]*final[ \t]+answer[ \t*_]*[:\uff1a]", re.I | re.M)
_ANSWER_MARK = re.compile(r"^[ \t>#*_-]*answer[ \t*_]*[:\uff1a]", re.I | re.M)
PROSE_ANSWER_CHARS = 200    # a reply without code at most this long may be an answer


def outside_fences(text: str) -> str:
    """The reply with its fenced blocks (of any language) removed."""
    return _FENCE.sub("\n", text)


def final_line(text: str) -> str | None:
    """The last line outside any fence that is only a `FINAL(...)` or `FINAL_VAR(...)` call
    (a mention inside a sentence does not count)."""
    found = _FINAL_LINE.findall(outside_fences(text))
    return found[-1].strip() if found else None


def final_literal(call: str) -> str:
    """What a `FINAL(...)` line commits when it is not valid Python (`FINAL(March 2023)`): the
    text between the parentheses, without surrounding quotes."""
    inner = call[call.index("(") + 1:call.rindex(")")] if "(" in call else call
    return _clean(inner)


def _clean(answer: str) -> str:
    answer = answer.strip()
    for _ in range(3):
        stripped = answer.strip(" \t\n*`")
        if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "\"'":
            stripped = stripped[1:-1]
        if stripped == answer:
            break
        answer = stripped
    return answer.strip()


def prose_answer(text: str) -> tuple[bool, str] | None:
    """An answer stated in a reply that holds no code, or None.

    `(True, X)` for an explicit "Final answer: X" (at the start of a line); `(False, X)` for
    "Answer: X", or for a whole reply of at most PROSE_ANSWER_CHARS characters that does not end
    in "?" or ":" (a question, or an announcement of code to come) and does not mention FINAL
    or answer[...] (it talks about code).
    """
    body = outside_fences(text).strip()
    for mark, explicit in ((_FINAL_MARK, True), (_ANSWER_MARK, False)):
        hits = list(mark.finditer(body))
        if hits:
            answer = _clean(body[hits[-1].end():])
            return (explicit, answer) if answer else None
    if (body and len(body) <= PROSE_ANSWER_CHARS and not body.rstrip("*` ").endswith(("?", ":"))
            and "FINAL" not in body and "answer[" not in body):   # talk about code, not answers
        answer = _clean(body)
        return (False, answer) if answer else None
    return None


def answer_text(reply: str) -> str | None:
    """The answer a last-turn reply gives, as clean text (no fence, no FINAL(...) around it), or
    None when it gives none: a reply that is only code computing something is not an answer.

    In order: an "Final answer: X" / "Answer: X" line outside the fences; a lone `FINAL(...)`
    line; a reply without fences, whole; a fenced block that commits a literal
    (`FINAL("x")`, `answer["content"] = "x"`) or is one (small models answer in code: `29785`,
    `Paris`, `March 2023`)."""
    body = outside_fences(reply).strip()
    for mark in (_FINAL_MARK, _ANSWER_MARK):
        hits = list(mark.finditer(body))
        if hits and _clean(body[hits[-1].end():]):
            return _clean(body[hits[-1].end():])
    line = final_line(reply)
    if line is not None:
        try:
            parse_python(line)
        except SyntaxError:         # FINAL(March 2023)
            return final_literal(line) or None
        return _committed_literal(line)     # FINAL("Lyon"); FINAL(x) names no answer
    if not code_blocks(reply):
        return _clean(body) or None
    for block in reversed(code_blocks(reply)):
        value = _committed_literal(block)
        if value is not None:
            return value
    return None


def _committed_literal(code: str) -> str | None:
    """The literal a cell commits or is: FINAL(<literal>), answer["content"] = <literal>, a
    lone literal or name; None for code that computes its answer (or is not an answer)."""
    try:
        tree = parse_python(code.strip())
    except SyntaxError:
        text = code.strip()     # `March 2023`: not Python, plainly the answer
        return _clean(text) if text and "\n" not in text and len(text) <= PROSE_ANSWER_CHARS \
            else None
    for node in reversed(tree.body):
        value = node.value if isinstance(node, ast.Expr | ast.Assign) else None
        if isinstance(node, ast.Expr) and isinstance(value, ast.Call) and \
                isinstance(value.func, ast.Name) and value.func.id == "FINAL" and value.args:
            value = value.args[0]
        elif isinstance(node, ast.Assign) and not _is_answer_content(node.targets[0]):
            continue
        elif isinstance(node, ast.Expr) and len(tree.body) == 1 and isinstance(value, ast.Name):
            return value.id
        if isinstance(value, ast.Constant) and value.value is not None:
            return _clean(str(value.value))
    return None


def _is_answer_content(target: ast.expr) -> bool:
    return (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
            and target.value.id == "answer" and isinstance(target.slice, ast.Constant)
            and target.slice.value == "content")


def normalize_code(blocks: list[str]) -> str:
    """A turn's code as a string of Python tokens, without comments, blank lines or the spaces
    between tokens, to tell a repeated cell; code that does not tokenize has its whitespace
    runs made one space instead."""
    out = []
    for block in blocks:
        try:
            toks = [t.string if t.string.strip() else tokenize.tok_name[t.type]
                    for t in tokenize.generate_tokens(io.StringIO(block).readline)
                    if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER)]
            out.append(" ".join(toks))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            out.append(" ".join(block.split()))
    return "\n".join(out)


def cap(text: str, limit: int, total: int | None = None) -> str:
    """Cut `text` to `limit` characters with a marker saying how much was cut."""
    total = len(text) if total is None else max(total, len(text))
    if total <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {total - limit:,} of {total:,} characters not shown]"


def format_cell(cell: Cell, limit: int) -> str:
    """Everything one cell produced, as the model will read it, within `limit` characters."""
    parts: list[tuple[str, str, int]] = []
    if cell.stdout_chars or cell.stdout:
        parts.append(("", cell.stdout, cell.stdout_chars))
    if cell.stderr_chars or cell.stderr:
        parts.append(("[stderr]\n", cell.stderr, cell.stderr_chars))
    if cell.value is not None:
        parts.append(("[value] ", cell.value, len(cell.value)))
    if cell.error:
        parts.append(("[error]\n", cell.error, len(cell.error)))
    if not parts:
        return "[no output]"
    # Errors and values are short and matter most: give them their room, the rest shares.
    out: list[str] = []
    budget = limit
    for label, text, total in parts:
        share = max(200, budget // max(1, len(parts) - len(out)))
        chunk = label + cap(text, share, total)
        out.append(chunk)
        budget = max(0, budget - len(chunk))
    return "\n".join(out)
