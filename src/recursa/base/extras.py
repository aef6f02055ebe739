"""MissingExtra: the one error recursa raises when an optional extra is not installed."""

from __future__ import annotations

from recursa.base.types import RecursaError


class MissingExtra(RecursaError, ImportError):
    """`what` needs the optional extra `extra`; the message gives the pip command.

    Also an ImportError, so code that guards an optional import with `except ImportError`
    keeps working."""

    def __init__(self, extra: str, what: str, *, module: str | None = None,
                 detail: str | None = None):
        self.extra = extra
        self.install = f"pip install 'recursa[{extra}]'"
        needs = f"the {module!r} package" if module else f"the {extra!r} extra"
        msg = f"{what} needs {needs}: {self.install}"
        super().__init__(msg + (f" ({detail})" if detail else ""), name=module)
