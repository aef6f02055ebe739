"""The viewer page without a browser: self-contained, safely embedded, CLI, live server."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from recursa.cli import main
from recursa.demos.synthetic import demo_run, write_synthetic_trace
from recursa.obs.trace import JsonlSink, Tracer
from recursa.obs.viewer import embed_json, render_html, write_html
from recursa.obs.viewer.live import LiveServer, read_from

HOSTILE = "</script><script>alert('x')</script><!-- <img src=https://evil.example/x.png>"


def small_trace(path: Path, text: str = "hello", run_id: str = "r") -> None:
    tr = Tracer([JsonlSink(path)], run_id=run_id)
    run = tr.emit("run", phase="start", query="q " + text, model="m")
    turn = tr.emit("turn", phase="start", parent=run, turn=1)
    tr.emit("turn", id=turn, phase="end", parent=run, text=text,
            usage={"input_tokens": 5, "output_tokens": 1}, cost_usd=0.0)
    tr.emit("final", parent=run, answer=text, status="final", ready=True)
    tr.emit("run", id=run, phase="end", status="final")
    tr.close()


def test_page_is_self_contained(tmp_path: Path):
    p = tmp_path / "run.jsonl"
    demo_run(p, context_size=20_000)
    html = write_html(p).read_text()
    assert (tmp_path / "run.html").exists()
    # nothing is fetched: no external src/href, no stylesheet links, no script src
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"<link\b", html, re.I)
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)
    assert "@import" not in html and "url(http" not in html
    # a CSP that forbids every network request
    assert "default-src 'none'" in html and "connect-src" not in html
    # the run is inside
    assert "llm_batch" in html and "How many refund tickets" in html


def test_hostile_text_cannot_close_the_data_script(tmp_path: Path):
    p = tmp_path / "run.jsonl"
    small_trace(p, HOSTILE)
    html = write_html(p, tmp_path / "out.html").read_text()
    # exactly the page's own three scripts, however the trace text tries to end them
    assert html.lower().count("</script") == 3
    assert html.lower().count("<script") == 3
    assert "<!--" not in html and "evil.example" in html   # present, but only as escaped data
    data = re.search(r'<script type="application/json" id="recursa-data">(.*?)</script>', html,
                     re.S).group(1)
    events = json.loads(data)
    assert any(e["data"].get("text") == HOSTILE for e in events)


def test_embed_json_round_trips():
    value = {"a": "</script>&<!--\u2028\u2029 ünï", "b": [1, 2.5, None]}
    text = embed_json(value)
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == value


def test_render_html_from_events_only_embeds_the_given_run(tmp_path: Path):
    p = tmp_path / "run.jsonl"
    small_trace(p, "first-run", "r1")
    small_trace(p, "second-run", "r2")     # appended by a second run
    html = write_html(p).read_text()
    assert "second-run" in html and "first-run" not in html
    assert "first-run" in render_html([{"kind": "run", "id": "x", "data": {"query": "first-run"}}])


def test_cli_view_writes_the_page(tmp_path: Path, capsys):
    p = tmp_path / "run.jsonl"
    small_trace(p)
    out = tmp_path / "sub" / "page.html"
    assert main(["view", str(p), "-o", str(out)]) == 0
    assert out.exists() and "recursa-data" in out.read_text()
    err = capsys.readouterr().err
    assert "5 events" in err and "final" in err
    assert main(["view", str(tmp_path / "missing.jsonl")]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["view", str(empty)]) == 2


def test_cli_reports_unfinished_and_torn(tmp_path: Path, capsys):
    p = tmp_path / "run.jsonl"
    write_synthetic_trace(p, events=300, finish=False)
    with open(p, "a") as f:
        f.write('{"kind": "turn", "id": "abc", "pha')
    assert main(["view", str(p)]) == 0
    err = capsys.readouterr().err
    assert "unfinished" in err and "torn" in err


def test_ten_thousand_events_write_quickly(tmp_path: Path):
    import time
    p = tmp_path / "big.jsonl"
    write_synthetic_trace(p, events=10_000)
    t0 = time.perf_counter()
    out = write_html(p)
    assert time.perf_counter() - t0 < 5.0
    assert out.stat().st_size < 3 * p.stat().st_size


# ------------------------------------------------------------------ live
def test_read_from_returns_only_complete_lines(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    assert read_from(p, 0) == (0, [])                     # not written yet
    p.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    off, evs = read_from(p, 0)
    assert evs == [{"a": 1}, {"b": 2}] and off == len('{"a": 1}\n{"b": 2}\n')
    assert read_from(p, off) == (off, [])                 # the torn line waits
    with open(p, "a") as f:
        f.write('3}\nnot json\n')
    off2, evs = read_from(p, off)
    assert evs == [{"c": 3}] and off2 == p.stat().st_size
    p.write_text('{"z": 0}\n')                            # rewritten: start again
    assert read_from(p, off2) == (9, [{"z": 0}])


def test_live_server_serves_page_and_growing_trace(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    server = LiveServer(p).start()
    try:
        assert server.url.startswith("http://127.0.0.1:") and f"?key={server.key}" in server.url
        page = urllib.request.urlopen(server.url, timeout=5).read().decode()
        assert '"live":true' in page and "connect-src 'self'" in page
        got = json.load(urllib.request.urlopen(server.events_url(0), timeout=5))
        assert got == {"offset": 0, "events": []}
        small_trace(p)
        got = json.load(urllib.request.urlopen(server.events_url(0), timeout=5))
        assert [e["kind"] for e in got["events"]][:2] == ["header", "run"]
        again = json.load(urllib.request.urlopen(server.events_url(got["offset"]), timeout=5))
        assert again == {"offset": got["offset"], "events": []}
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.base + "../etc/passwd", timeout=5)
    finally:
        server.close()


def test_live_server_refuses_a_foreign_host_a_foreign_origin_and_no_key(tmp_path: Path):
    """The trace holds prompts and answers: a web page the user visits (DNS rebinding names
    its own host; a cross-origin fetch sends its Origin) or another local user without the
    printed key gets nothing."""
    import http.client
    p = tmp_path / "t.jsonl"
    small_trace(p)
    server = LiveServer(p).start()
    port = server.httpd.server_address[1]
    ok_events = f"/events?key={server.key}&offset=0"

    def get(path: str, **headers: str) -> tuple[int, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    try:
        assert get(ok_events)[0] == 200
        assert get(ok_events, Host=f"localhost:{port}")[0] == 200
        assert get(ok_events, Origin=f"http://127.0.0.1:{port}")[0] == 200     # its own page
        status, body = get(ok_events, Host=f"attacker.example:{port}")
        assert status == 403 and b"DNS rebinding" in body and b"query" not in body
        status, body = get(ok_events, Origin="https://attacker.example")
        assert status == 403 and b"Origin" in body
        for path in ("/events?offset=0", "/?key=wrong", "/", f"/events?key={server.key}x"):
            status, body = get(path)
            assert status == 403 and b"key it printed" in body, path
    finally:
        server.close()
