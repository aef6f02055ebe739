"""Shared fixtures and collection rules for the whole suite.

Helpers that tests import live in modules of their own (helpers_*.py, openai_testserver.py,
provider_fakes.py, ...): a test module never imports another test module.

`make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`: every test
marked `model` joins one group, so they run one after another on one worker and share its
llama-server (never two at once on a 2-core machine), while the other worker runs the rest.
"""

from __future__ import annotations

import pytest

QWEN = "qwen2.5-coder-1.5b"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("model") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("model"))


@pytest.fixture(scope="session")
def qwen() -> str:
    """The default local model's client spec; fails (not skips) when it is not fetched, since
    `make test` fetches it and CI must not pass without the real model."""
    from recursa.models.fetch import is_fetched
    if not is_fetched(QWEN):
        pytest.fail(f"the local model is not fetched: run `recursa models fetch {QWEN}` "
                    "(make test does this)")
    return f"local:{QWEN}"
