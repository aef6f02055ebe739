"""The seam between the engine and the strategies (recursa.core.strategies)."""

from __future__ import annotations

import asyncio

import pytest

from recursa.core.strategies import strategy_for
from recursa.core.strategy import STRATEGIES


def test_every_chosen_mode_has_a_strategy_and_a_bad_name_is_refused():
    modes = [m for m in STRATEGIES if m != "auto"]      # auto resolves to one of these
    assert {strategy_for(m).name for m in modes} == set(modes)
    with pytest.raises(ValueError, match="no strategy 'auto': code or plan"):
        strategy_for("auto")


def test_the_code_mode_does_nothing_before_the_turns():
    assert asyncio.run(strategy_for("code").begin(object())) is False  # type: ignore[arg-type]
