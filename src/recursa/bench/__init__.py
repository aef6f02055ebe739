"""Evaluation suite: offline task generators and scorers (runner and reports live beside them).

    from recursa.bench import get_task
    task = get_task("sniah")
    inst = task.generate(seed=0, length_tokens=32_000)
    task.score("1234567", inst).score
"""

from __future__ import annotations

from .tasks import CHARS_PER_TOKEN, TASKS, Instance, Score, Task, estimate_tokens, get_task

__all__ = ["CHARS_PER_TOKEN", "TASKS", "Instance", "Score", "Task", "estimate_tokens", "get_task"]
