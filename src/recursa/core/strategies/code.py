"""The code mode: nothing before the turns; the root writes code each turn (the engine's turn,
recursa.core.loop, with its guards and compaction)."""

from __future__ import annotations

from recursa.core.strategies import Run


class CodeMode:
    name = "code"

    async def begin(self, run: Run) -> bool:
        return False


CODE = CodeMode()
