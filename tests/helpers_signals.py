"""Signals for tests that press Ctrl-C on a child process."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """A child's SIGINT back to its default (run between fork and exec): a test run started in
    the background of a non-interactive shell inherits SIGINT ignored, and a child that ignores
    it never sees the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
