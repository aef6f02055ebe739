"""Errors met while reading a document; each names the file it is about."""

from __future__ import annotations

from recursa.base.types import ContextError

EXTRA_HINT = "pip install 'recursa[docs]'"


class DocumentError(ContextError):
    """A document cannot be read: corrupt, truncated, encrypted, oversized or unsupported."""


class MissingExtra(DocumentError):
    """The library for a format is not installed; the message names the `docs` extra."""


def need(module: str, what: str, name: str) -> MissingExtra:
    return MissingExtra(f"{name}: reading {what} files needs the Python package {module!r}, "
                        f"part of the optional 'docs' extra: {EXTRA_HINT}")
