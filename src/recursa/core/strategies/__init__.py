"""How the root works, beside the engine: the strategies (the plan mode)."""
