"""Rich display in Jupyter (recursa.obs.notebook): a real notebook executed by nbclient in a real
ipykernel, with a scripted model, and the HTML pieces checked on their own."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from recursa.base.types import Event, Result, RoleUsage, Usage
from recursa.obs.notebook import NotebookProgress, result_html, run_html, viewer_iframe

SCRIPT = [
    "```repl\nhint = llm_query('Say hi')\nprint(hint)\n```",
    "hi there",       # the sub-call (root and sub share one scripted client: calls in order)
    "```repl\nFINAL('the context has ' + str(len(context)) + ' characters')\n```",
]

CELLS = [
    # 1: a run without a trace file: its Result shows the viewer from the events kept live
    f"""from recursa import RLM
from recursa.models import ReplayClient
rlm = RLM(model=ReplayClient({SCRIPT!r}), sandbox="inprocess", preflight=False)
res = rlm.completion("How long is the context?", context="abc" * 100)
res""",
    # 2: a run written to a trace file, read back with recursa.obs.trace.load
    f"""import recursa.obs.trace
rlm2 = RLM(model=ReplayClient({SCRIPT!r}), sandbox="inprocess", preflight=False,
           trace_path="run.jsonl")
res2 = rlm2.completion("And now?", context="xy" * 10)
recursa.obs.trace.load("run.jsonl")""",
    # 3: progress off: no display during the run
    f"""import recursa.obs.notebook
recursa.obs.notebook.show_progress(False)
res3 = RLM(model=ReplayClient({SCRIPT!r}), sandbox="inprocess",
           preflight=False).completion("Quiet?", context="q")
recursa.obs.notebook.show_progress(True)
print(res3.status)""",
    # 4: the async twin, awaited on the kernel's own loop
    f"""res4 = await RLM(model=ReplayClient({SCRIPT!r}), sandbox="inprocess",
                  preflight=False).acompletion("Async?", context="abcd")
res4""",
]


def _html_outputs(cell: dict, output_type: str) -> list[str]:
    return [o["data"]["text/html"] for o in cell["outputs"]
            if o["output_type"] == output_type and "text/html" in o.get("data", {})]


@pytest.mark.slow
def test_notebook_shows_progress_result_and_trace(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    for c in nb.cells:
        errors = [o for o in c["outputs"] if o["output_type"] == "error"]
        assert not errors, errors[0]["traceback"]

    # 1: the progress line, updated in place to the run's end, then the Result with its viewer
    progress = _html_outputs(nb.cells[0], "display_data")
    assert len(progress) == 1, nb.cells[0]["outputs"]
    assert "recursa-progress" in progress[0] and ">final<" in progress[0]
    assert "turns <b>2</b>" in progress[0] and "sub-calls <b>1</b>" in progress[0]
    (result,) = _html_outputs(nb.cells[0], "execute_result")
    assert "recursa-result" in result and ">final<" in result
    assert "the context has 300 characters" in result
    tokens = [re.search(r"tokens <b>([\d,]+)</b>", h).group(1) for h in (progress[0], result)]
    assert tokens[0] == tokens[1] != "0"       # the live count ends where the Result's is
    assert '<iframe class="recursa-viewer" sandbox="allow-scripts"' in result
    srcdoc = html.unescape(re.search(r'srcdoc="([^"]*)"', result).group(1))
    assert "Content-Security-Policy" in srcdoc
    assert "llm_query(\\u0027Say hi\\u0027)" in srcdoc or "llm_query('Say hi')" in srcdoc

    # 2: a trace read back shows its query, answer, totals and viewer
    (trace,) = _html_outputs(nb.cells[1], "execute_result")
    assert "recursa-run" in trace and "And now?" in trace
    assert "the context has 20 characters" in trace and "sub-calls <b>1</b>" in trace
    assert "<iframe" in trace

    # 3: with progress off the run displays nothing
    assert not _html_outputs(nb.cells[2], "display_data")
    assert "final" in "".join(o.get("text", "") for o in nb.cells[2]["outputs"])

    # 4: awaited on the kernel's loop: the same progress line and result
    (progress4,) = _html_outputs(nb.cells[3], "display_data")
    assert ">final<" in progress4 and "Async?" in progress4
    (result4,) = _html_outputs(nb.cells[3], "execute_result")
    assert "the context has 4 characters" in result4 and "<iframe" in result4


def _result(answer: str, **kw: object) -> Result:
    usage = {"root": RoleUsage(calls=2, usage=Usage(input_tokens=1200, output_tokens=34))}
    return Result(answer=answer, status="final", turns=2, subcalls=3, usage=usage,
                  cost_usd=None, elapsed_s=1.25, run_id="nope", **kw)


def test_result_html_escapes_model_text_and_says_what_it_knows() -> None:
    page = result_html(_result("<script>alert(1)</script>", error="x < y"))
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "tokens <b>1,234</b>" in page and "cost <b>unknown</b>" in page
    assert "error: x &lt; y" in page
    assert "<iframe" not in page          # no events known for this run: no viewer
    assert _result("ok")._repr_html_() == result_html(_result("ok"))


def test_viewer_iframe_is_sandboxed_and_quotes_hostile_text() -> None:
    ev = Event(kind="run", id="a", run_id="r", phase="start",
               data={"query": '"><script>parent.x=1</script>'})
    frame = viewer_iframe([ev])
    head, _, _ = frame.partition("srcdoc=")
    assert 'sandbox="allow-scripts"' in head and "allow-same-origin" not in head
    body = frame[frame.index('srcdoc="') + 8:frame.rindex('"></iframe>')]
    assert '"' not in body and "<" not in body     # the whole page is one quoted attribute


def test_progress_sink_keeps_events_for_the_result_and_trace_reader(tmp_path: Path) -> None:
    """Without a kernel the sink cannot display, but it keeps the run's events (a display
    error never fails the run) so the Result's viewer works; a Run read from a trace shows its
    viewer from the file."""
    from recursa.core.rlm import RLM
    from recursa.models import ReplayClient
    from recursa.obs.trace import load

    sink = NotebookProgress()
    rlm = RLM(model=ReplayClient(list(SCRIPT)), sandbox="inprocess", preflight=False,
              sinks=[sink], trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("How long?", context="abcd")
    assert res.status == "final"
    page = result_html(res)
    assert "the context has 4 characters" in page and "<iframe" in page
    run_page = run_html(load(tmp_path / "t.jsonl"))
    assert "How long?" in run_page and "<iframe" in run_page
