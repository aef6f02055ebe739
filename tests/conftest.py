"""Shared fixtures and collection rules for the whole suite.

Helpers that tests import live in modules of their own (helpers_*.py, openai_testserver.py,
provider_fakes.py, ...): a test module never imports another test module.

`make test` runs the model tests in one pytest process (so two llama-servers never compete for a
2-core machine) and the rest beside it on two pytest-xdist workers.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# The suite never reads or writes the settings file of whoever runs it (a default model,
# aliases and stored keys in ~/.config/recursa/config.toml would change what tests resolve):
# it gets an empty config directory of its own, which the commands it starts inherit.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="recursa-test-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], ignore_errors=True)

QWEN = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="session")
def qwen() -> str:
    """The default local model's client spec; fails (not skips) when it is not fetched, since
    `make test` fetches it and CI must not pass without the real model."""
    from recursa.models.fetch import is_fetched
    if not is_fetched(QWEN):
        pytest.fail(f"the local model is not fetched: run `recursa models fetch {QWEN}` "
                    "(make test does this)")
    return f"local:{QWEN}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that load the machine on purpose (`busy_core`: the demo on one core with a busy
    loop beside it) run last in their process: `make test` runs the model tests beside the
    others, and a busy loop starving those of a core made their Ctrl-C timings fail."""
    items.sort(key=lambda item: item.get_closest_marker("busy_core") is not None)
