"""The front ends' stderr: the rich console for notes and errors, and `Notices`, what a command
says besides its answer in the shape the user chose (rich text, JSON lines or errors only).

rich is imported on first use: `run -q`, `--json` and `--events jsonl` never import it.
"""

from __future__ import annotations

import functools
import json
import sys

from recursa.obs.terminal import inert

# mypy reads this constant as typing's; at run time typing and logging are not imported for it
TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any

    from rich.console import Console


@functools.cache
def stderr_console() -> Console:
    """The console for notes and errors on stderr (errors stay one line). Made on first use:
    `run -q`, `--json` and `--events jsonl` print no rich text and so never import rich."""
    from rich.console import Console
    return Console(stderr=True, highlight=False, soft_wrap=True)


def escape(text: str) -> str:
    """`text` with rich markup made literal."""
    from rich.markup import escape as rich_escape
    return rich_escape(text)


class Notices:
    """Everything `run` says on stderr besides the event view, in the chosen shape: rich text,
    JSON lines (--events jsonl: stderr stays pure JSON), or nothing but errors (-q). Rich text
    is made inert: an error may quote a provider's reply or a model's text."""

    def __init__(self, *, jsonl: bool, quiet: bool):
        self.jsonl, self.quiet = jsonl, quiet
        self._handler: logging.Handler | None = None
        import logging
        self._words = FlagWords()
        logging.getLogger(FlagWords.LOGGER).addFilter(self._words)
        if jsonl:    # log warnings (no bwrap, ...) as JSON lines too
            self._handler = logging.StreamHandler(sys.stderr)
            self._handler.setFormatter(_json_log_formatter())
            self._handler.setLevel(logging.WARNING)
            logging.getLogger().addHandler(self._handler)

    def close(self) -> None:
        import logging
        logging.getLogger(FlagWords.LOGGER).removeFilter(self._words)
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler = None

    def _json(self, kind: str, **data: Any) -> None:
        sys.stderr.write(json.dumps({"kind": kind, **data}) + "\n")
        sys.stderr.flush()

    def info(self, message: str) -> None:
        if self.jsonl:
            self._json("notice", message=message)
        elif not self.quiet:
            stderr_console().print(f"[dim]{escape(inert(message))}[/]")

    def warn(self, message: str) -> None:
        if self.jsonl:
            self._json("notice", level="warning", message=message)
        elif not self.quiet:
            stderr_console().print(f"[yellow]{escape(inert(message))}[/]")

    def error(self, message: str) -> None:
        if self.jsonl:
            self._json("error", message=message)
        else:
            stderr_console().print(f"[red]error:[/] {escape(inert(message))}")


class FlagWords:
    """A logging filter that says the library's advice in the command line's words: the
    models layer's warnings name RLM arguments (`cache_nondeterministic=True`), which a CLI user
    gives as flags. It rewrites a record's text only; it never drops one."""

    LOGGER = "recursa.models"     # where the cache logs "not cached" (recursa.models.cache)
    WORDS = (("pass cache_nondeterministic=True", "pass --cache-nondeterministic"),
             ("temperature=0", "--temperature 0"))

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        said = text
        for library, flag in self.WORDS:
            said = said.replace(library, flag)
        if said != text:
            record.msg, record.args = said, None
        return True


def _json_log_formatter() -> logging.Formatter:
    import logging

    class JsonLogFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return json.dumps({"kind": "log", "level": record.levelname.lower(),
                               "logger": record.name, "message": record.getMessage()})

    return JsonLogFormatter()
