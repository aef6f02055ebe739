"""Model-written text made inert before it reaches a terminal.

An answer, a reply streamed into the live view or a chat turn is written by a model that read
untrusted input: escape sequences in it would act on the user's terminal (an OSC 52 write to the
clipboard, cursor moves that hide lines, a changed window title). `inert(text)` keeps newlines
and tabs and shows every other control character (C0, DEL, C1) as a visible escape (`\\x1b`), so
nothing is lost and nothing acts. `inert_json(text)` does the same for JSON text (`--json`,
`--schema`) without changing the value it encodes. `recursa run --raw` writes the characters as
they are, for pipes that want them.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def inert(text: str) -> str:
    """`text` with every control character but newline and tab shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# JSON escapes C0 itself but leaves DEL and the C1 controls (U+0080-U+009F; U+009B is a whole CSI
# to some terminals) raw. They can only stand inside a JSON string, where no backslash precedes
# them, so each can be rewritten as its \u escape.
_RAW_IN_JSON = re.compile(r"[\x7f-\x9f]")


def inert_json(text: str) -> str:
    """JSON text with DEL and every C1 control written as a `\\u00NN` escape: the same value, and
    nothing in it acts on a terminal (other characters stay as they are, readable)."""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
