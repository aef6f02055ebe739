"""The real local model (Qwen2.5-Coder-1.5B) attaches a source that verifies, when asked to.

To keep this short, the root's first turn (the search and a sub-call) is scripted, as the 1.5B
itself wrote it in a real run (the worked example's second turn); the model writes every turn
after it, including the commit, which is what this tests: RLM(sources=True)'s rule, example and
held commit make it pass the piece it read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import helpers_documents as hd
from recursa import RLM
from recursa.base.types import Completion, Message
from recursa.models import make_client
from recursa.models.fetch import is_fetched

pytestmark = [pytest.mark.model, pytest.mark.slow]
MODEL = "local:qwen2.5-coder-1.5b"

NOTES = [f"Note {i}: the team reviewed ticket {1000 + i} and closed it without changes."
         for i in range(30)]
NOTES[17] = "Note 17: the wifi password of the Oslo office is fjord-2291, changed in March."
# the 1.5B's own first search on this input (from a real run of it): the worked example's
SEARCH = """```repl
# search for the query's most specific words (names, rare terms) ignoring case
hits = [m.start() for m in re.finditer("wifi", context, re.IGNORECASE)]
print(len(hits))
pieces = [context[max(0, i - 500):i + 4000] for i in hits[:5]]
# the text first, then the query itself
found = llm_batch([p + "\\n\\nWhat is the wifi password of the Oslo office? Answer from the text above, or reply 'none'." for p in pieces])
print(found)
```"""


@pytest.fixture(scope="module", autouse=True)
def need_model():
    if not is_fetched("qwen2.5-coder-1.5b"):
        pytest.fail("the local model is not fetched: run `recursa models fetch "
                    "qwen2.5-coder-1.5b` (make test does this)")


class FirstTurnScripted:
    """A root client whose first reply is scripted; every later one is the real model's."""

    def __init__(self, real: Any, first: str):
        self.real, self.first, self.replies = real, first, 0
        self.name = real.name
        self.context_window = getattr(real, "context_window", None) or getattr(real, "n_ctx",
                                                                                None)

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        self.replies += 1
        if self.replies == 1:
            return Completion(text=self.first, model="scripted")
        return await self.real.complete(messages, **options)

    async def aclose(self) -> None:
        await self.real.aclose()


@pytest.mark.xfail(strict=False, reason=(
    "not yet: in three real runs (2026-12-02) the 1.5B committed the right answer with "
    "answer['ready'] = True and no sources, and sent the same commit again after the hold "
    "showed it FINAL(answer['content'], sources=[pieces[0]]); docs/sources.md"))
def test_the_local_model_attaches_a_source_that_verifies(tmp_path: Path):
    real = make_client(MODEL)
    root = FirstTurnScripted(real, SEARCH)
    try:
        res = RLM(model=root, sub_model=real, sources=True, max_iterations=3,
                  max_output_chars=2000, preflight=False,
                  model_options={"temperature": 0.0, "max_tokens": 200},
                  sub_model_options={"temperature": 0.0, "max_tokens": 60},
                  trace_path=tmp_path / "t.jsonl").completion(
            "What is the wifi password of the Oslo office?", context="\n".join(NOTES))
    finally:
        import asyncio
        asyncio.run(root.aclose())
    print(f"answer {res.answer!r}, status {res.status}, turns {res.turns}, "
          f"{res.elapsed_s:.1f} s, sources {[s.model_dump(exclude={'before', 'after'}) for s in res.sources]}")
    assert res.status != "error", res.error
    assert res.sources, f"the model attached no sources (answer {res.answer!r})"
    found = [s for s in res.sources if s.found]
    assert found, [s.quote for s in res.sources]
    # the source points at the evidence: the line with the password (narrowed from the piece)
    assert any(s.location is not None and s.location.line == 18 and "fjord-2291" in (s.text or "")
               for s in found), [(s.text, s.location) for s in found]


def test_the_local_model_in_plan_mode_answers_with_a_source_that_verifies(tmp_path: Path):
    """In plan mode the runtime attaches the passage the readers answered from, so the 1.5B's
    answer carries a source that verifies, located at the password's line (no model turn has to
    write it; idle machine 2026-12-03: 2 root calls, about 40 s)."""
    res = RLM(model=MODEL, strategy="plan", sources=True, max_iterations=3,
              model_options={"temperature": 0.0, "max_tokens": 200},
              sub_model_options={"temperature": 0.0, "max_tokens": 60},
              trace_path=tmp_path / "t.jsonl").completion(
        "What is the wifi password of the Oslo office?", context="\n".join(NOTES))
    assert res.status == "final" and "fjord-2291" in res.answer, (res.status, res.answer)
    found = [s for s in res.sources if s.found]
    assert found and len(found) == len(res.sources), [s.quote for s in res.sources]
    assert any(s.location is not None and s.location.line == 18 and "fjord-2291" in (s.text or "")
               for s in found), [(s.text, s.location) for s in found]


def test_recursa_run_over_a_pdf_answers_with_its_page_as_a_verified_source(tmp_path: Path):
    """The issue's own command, through the real CLI and the local model: `recursa run "..."
    --context report.pdf --strategy plan --sources` answers and names the PDF's page and line
    the answer rests on (idle machine 2026-12-03: about 45 s). Bounded by calls and turns, not
    by wall time: a time limit made this test depend on the CI machine's speed (2026-12-06)."""
    audit = "The audit found 14 unsigned invoices in March."
    t = hd.Texts(paras=[f"Paragraph {i} says nothing of note." for i in range(5)] + [audit],
                 titles=["Cover", "Findings"])
    report = hd.pdf(tmp_path / "report.pdf", t, pages=3)
    p = subprocess.run([sys.executable, "-m", "recursa", "run", "What did the audit find in March?",
                        "--context", str(report), "--model", MODEL, "--strategy", "plan",
                        "--sources", "--max-subcalls", "20", "--max-iterations", "6"],
                       capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    answer, _, listed = p.stdout.partition("Sources:")
    assert "14" in answer, p.stdout
    assert "report.pdf" in listed and "(exact)" in listed and audit in listed, p.stdout
    assert "NOT FOUND" not in listed, p.stdout
