"""Does the 1.5B in code mode attach a source that verifies, when asked to (RLM(sources=True))?

A probe, not a test: in three real runs (2026-12-02) and every make test since, it committed the
right answer with answer['ready'] = True and no sources, and sent the same commit again after the
hold showed it FINAL(answer['content'], sources=[pieces[0]]) (docs/sources.md). It ran in make test
as a non-strict xfail, which could not fail and cost 74 s a run on a machine half as fast.

Run 2026-12-06 (a loaded machine, load average ~15): answer 'KEEP', status extracted, 3 turns,
312 s, no sources: the 1.5B did not commit the password at all this time.

The root's first turn (the search and a sub-call) is scripted, as the 1.5B itself wrote it in a
real run; the model writes every turn after it, including the commit.

Usage: python benchmarks/probes/code_mode_sources.py   (needs the fetched local 1.5B)
"""
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from recursa import RLM
from recursa.base.types import Completion, Message
from recursa.models import make_client

MODEL = "local:qwen2.5-coder-1.5b"
NOTES = [f"Note {i}: the team reviewed ticket {1000 + i} and closed it without changes."
         for i in range(30)]
NOTES[17] = "Note 17: the wifi password of the Oslo office is fjord-2291, changed in March."
# the 1.5B's own first search on this input (from a real run of it)
SEARCH = """```repl
# search for the query's most specific words (names, rare terms) ignoring case
hits = [m.start() for m in re.finditer("wifi", context, re.IGNORECASE)]
print(len(hits))
pieces = [context[max(0, i - 500):i + 4000] for i in hits[:5]]
# the text first, then the query itself
found = llm_batch([p + "\\n\\nWhat is the wifi password of the Oslo office? Answer from the text above, or reply 'none'." for p in pieces])
print(found)
```"""


class FirstTurnScripted:
    """A root client whose first reply is scripted; every later one is the real model's."""

    def __init__(self, real: Any, first: str):
        self.real, self.first, self.replies = real, first, 0
        self.name = real.name
        self.context_window = getattr(real, "context_window", None)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        self.replies += 1
        if self.replies == 1:
            return Completion(text=self.first, model="scripted")
        return await self.real.complete(messages, **options)

    async def aclose(self) -> None:
        await self.real.aclose()


def main() -> None:
    real = make_client(MODEL)
    root = FirstTurnScripted(real, SEARCH)
    try:
        res = RLM(model=root, sub_model=real, sources=True, max_iterations=3,
                  max_output_chars=2000, preflight=False,
                  model_options={"temperature": 0.0, "max_tokens": 200},
                  sub_model_options={"temperature": 0.0, "max_tokens": 60}).completion(
            "What is the wifi password of the Oslo office?", context="\n".join(NOTES))
    finally:
        asyncio.run(root.aclose())
    found = [s for s in res.sources if s.found]
    at_line = any(s.location is not None and s.location.line == 18
                  and "fjord-2291" in (s.text or "") for s in found)
    print(f"answer {res.answer!r}, status {res.status}, turns {res.turns}, "
          f"{res.elapsed_s:.1f} s, sources {len(res.sources)}, verified {len(found)}, "
          f"at the password's line: {at_line}")


if __name__ == "__main__":
    main()
