"""Scripted root models for the benchmarks: each reply is a fixed two-turn program, so both
libraries run the same code against the same server. Turn 1 writes code, turn 2 finalizes.

Requests are told apart by markers the benchmarks put in their prompts:
  * a sub-call's prompt starts with "SUBQ"              -> the reply is "ok";
  * a top-level run's query contains "ROOTQ-<program>-<args>";
  * anything else is a child RLM's root turn (its context starts with "CHILDQ").
The turn number is 1 + the number of assistant messages that already hold a ```repl block.
`dialect` names the batch functions: recursa's llm_batch / rlm_batch or the reference's
llm_query_batched / rlm_query_batched.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

NAMES = {"recursa": {"llm_batch": "llm_batch", "rlm_batch": "rlm_batch"},
         "rlms": {"llm_batch": "llm_query_batched", "rlm_batch": "rlm_query_batched"}}

_ROOTQ = re.compile(r"ROOTQ-([a-z0-9]+)((?:-[0-9]+)*)")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _repl(code: str) -> str:
    return f"Here is the next step.\n```repl\n{code}\n```\n"


def _final(expr: str) -> str:
    return _repl(f'answer["content"] = {expr}\nanswer["ready"] = True')


class Scripted:
    """Callable responder with counters the orchestrator can read (`stats`)."""

    def __init__(self, dialect: str = "recursa"):
        self.n = NAMES[dialect]
        self.lock = threading.Lock()
        self.counts = {"root": 0, "child": 0, "sub": 0}
        self.sub_times: list[float] = []

    def stats(self) -> dict[str, Any]:
        with self.lock:
            times = sorted(self.sub_times)
            self.sub_times = []
            counts = dict(self.counts)
            self.counts = {k: 0 for k in self.counts}
        return {"counts": counts, "sub_reply_times": times}

    def __call__(self, req: dict[str, Any]) -> str:
        msgs = req.get("messages") or []
        texts = [(m.get("role"), _text(m.get("content"))) for m in msgs]
        last = texts[-1][1] if texts else ""
        if last.startswith("SUBQ"):
            with self.lock:
                self.counts["sub"] += 1
                self.sub_times.append(time.monotonic())
            return "ok"
        turn = 1 + sum(1 for r, t in texts if r == "assistant" and "```repl" in t)
        m = None
        for r, t in texts:
            if r == "user":
                m = _ROOTQ.search(t)
                if m:
                    break
        with self.lock:
            self.counts["root" if m else "child"] += 1
        # what the REPL showed this run so far: user messages after the first assistant turn
        after = "\n".join(t for i, (r, t) in enumerate(texts)
                          if r == "user" and any(rr == "assistant" for rr, _ in texts[:i]))
        if m is None:
            return self.child(turn, after)
        prog = m.group(1)
        args = [int(a) for a in m.group(2).split("-") if a]
        return getattr(self, "prog_" + prog)(turn, args, after)

    # ------------------------------------------------------------ programs
    def prog_overhead(self, turn: int, args: list[int], seen: str) -> str:
        if turn == 1:
            return _repl("x = len(context)\nprint(x)")
        return _final("str(x)")

    def prog_tag(self, turn: int, args: list[int], seen: str) -> str:
        """Concurrent runs: each run's REPL output must carry its own tag and no other."""
        k = args[0]
        if turn == 1:
            return _repl(f"tag = {k}\nprint('tag-' + str(tag) + '-end')")
        tags = set(re.findall(r"tag-(\d+)-end", seen))
        if tags != {str(k)}:
            return _final(repr(f"crosstalk: run {k} saw tags {sorted(tags)}"))
        return _final("'run-' + str(tag)")

    def prog_tagbatch(self, turn: int, args: list[int], seen: str) -> str:
        """prog_tag with n sub-calls in one batch in turn 1 (bench_sandbox_start)."""
        k, n = args
        if turn == 1:
            return _repl(f"tag = {k}\nr = {self.n['llm_batch']}([f'SUBQ {{i}}' for i in "
                         f"range({n})])\nprint('tag-' + str(tag) + '-end', "
                         "sum(x == 'ok' for x in r))")
        tags = set(re.findall(r"tag-(\d+)-end", seen))
        if tags != {str(k)} or f"-end {n}" not in seen:
            return _final(repr(f"wrong: run {k} saw tags {sorted(tags)}"))
        return _final("'run-' + str(tag)")

    def prog_needle(self, turn: int, args: list[int], seen: str) -> str:
        if turn == 1:
            return _repl("import re\nm = re.search(r'secret code is ([A-Z]+-[0-9]+)', context)\n"
                         "print(m.group(1) if m else 'not found')")
        return _final("m.group(1) if m else 'not found'")

    def prog_batch(self, turn: int, args: list[int], seen: str) -> str:
        n = args[0]
        if turn == 1:
            return _repl(f"r = {self.n['llm_batch']}([f'SUBQ {{i}}' for i in range({n})])\n"
                         "print(sum(x == 'ok' for x in r))")
        return _final("str(sum(x == 'ok' for x in r))")

    def prog_tree(self, turn: int, args: list[int], seen: str) -> str:
        k, m = args
        if turn == 1:
            return _repl(f"res = {self.n['rlm_batch']}([f'CHILDQ {{i}} {m}' for i in range({k})])"
                         "\nprint(res)")
        return _final("'|'.join(str(x) for x in res)")

    def child(self, turn: int, seen: str) -> str:
        """A child RLM whose context is 'CHILDQ <i> <m>': m sub-calls in one batch. Turn 1
        prints the child's own tag; turn 2 checks in the REPL that the output this child was
        shown carried that tag and no other (cross-talk between parallel children)."""
        if turn == 1:
            return _repl("parts = str(context).split()\n"
                         f"r = {self.n['llm_batch']}([f'SUBQ {{parts[1]}} {{j}}' "
                         "for j in range(int(parts[2]))])\n"
                         "print('child-' + parts[1] + '-end', sum(x == 'ok' for x in r))")
        tags = sorted(set(re.findall(r"child-(\d+)-end", seen)))
        return _final(f"('C' + parts[1] + ':' + str(sum(x == 'ok' for x in r))) "
                      f"if {tags!r} == [parts[1]] else 'crosstalk: child ' + parts[1] + "
                      f"{' saw ' + str(tags)!r}")
