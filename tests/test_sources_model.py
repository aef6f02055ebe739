"""The real local model (Qwen2.5-Coder-1.5B) answers with a source that verifies, when asked to.

In plan mode the runtime attaches the passage the readers answered from. Whether the 1.5B in
code mode attaches one itself is a probe, not a test (benchmarks/probes/code_mode_sources.py):
it has not yet, and a test that cannot fail is no test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import helpers_documents as hd
from recursa import RLM
from recursa.models.fetch import is_fetched

pytestmark = [pytest.mark.model, pytest.mark.slow]
MODEL = "local:qwen2.5-coder-1.5b"

NOTES = [f"Note {i}: the team reviewed ticket {1000 + i} and closed it without changes."
         for i in range(30)]
NOTES[17] = "Note 17: the wifi password of the Oslo office is fjord-2291, changed in March."
@pytest.fixture(scope="module", autouse=True)
def need_model():
    if not is_fetched("qwen2.5-coder-1.5b"):
        pytest.fail("the local model is not fetched: run `recursa models fetch "
                    "qwen2.5-coder-1.5b` (make test does this)")


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
