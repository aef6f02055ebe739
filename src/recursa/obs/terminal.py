"""Model-written text made inert before it reaches a terminal.

An answer, a reply streamed into the live view or a chat turn is written by a model that read
untrusted input: escape sequences in it would act on the user's terminal (an OSC 52 write to the
clipboard, cursor moves that hide lines, a changed window title). `inert(text)` keeps newlines
and tabs and shows every other control character (C0, DEL, C1) as a visible escape (`\\x1b`), so
nothing is lost and nothing acts. `recursa run --raw` writes the answer's bytes as they are, for
pipes that want them.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def inert(text: str) -> str:
    """`text` with every control character but newline and tab shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
