"""Files that may hold user data (traces, the response cache, chat history, exports, viewer pages)
are created 0600 in 0700 directories whatever the umask; what the user made keeps its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from helpers_scripted import repl, root_script
from recursa import RLM
from recursa.base.privatefiles import open_private, private_dir, touch_private, write_private_text
from recursa.models.cache import ResponseCache
from recursa.models.replay import ReplayClient
from recursa.obs.trace import JsonlSink, Tracer


def mode(p: str | Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture(params=[0o022, 0o002, 0o000], ids=["umask022", "umask002", "umask000"])
def umask(request):
    """The permissive umasks users run with (022 the usual one): process-wide, restored."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_open_private_new_file_and_every_new_directory(tmp_path, umask):
    target = tmp_path / "a" / "b" / "c" / "f.jsonl"
    with open_private(target, "a") as f:
        f.write("x\n")
    assert mode(target) == 0o600
    for d in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert mode(d) == 0o700, d


def test_existing_directory_and_file_keep_their_modes(tmp_path, umask):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    old = shared / "old.jsonl"
    old.write_text("kept\n")
    os.chmod(old, 0o644)
    with open_private(old, "a") as f:
        f.write("more\n")
    write_private_text(shared / "new.html", "<p>")
    assert mode(shared) == 0o755                       # the user's directory: untouched
    assert mode(old) == 0o644 and old.read_text() == "kept\nmore\n"
    assert mode(shared / "new.html") == 0o600


def test_owner_bits_restored_under_a_umask_that_drops_them(tmp_path):
    old = os.umask(0o277)       # would make a read-only file and an unusable directory
    try:
        touch_private(tmp_path / "d" / "f")
    finally:
        os.umask(old)
    assert mode(tmp_path / "d") == 0o700 and mode(tmp_path / "d" / "f") == 0o600


def test_private_dir_race_with_another_creator(tmp_path):
    d = tmp_path / "x"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    assert private_dir(d) == d and mode(d) == 0o755


def test_trace_sink_and_trace_dir_of_a_real_run(tmp_path, umask):
    sink = JsonlSink(tmp_path / "traces" / "t.jsonl")
    Tracer([sink]).emit("run", phase="point", query="secret context")
    sink.close()
    assert mode(tmp_path / "traces") == 0o700 and mode(tmp_path / "traces" / "t.jsonl") == 0o600

    client = ReplayClient(root_script(repl('FINAL("ok")')))
    rlm = RLM(model=client, sandbox="inprocess", trace_dir=tmp_path / "runs" / "deep")
    res = rlm.completion("q", context="private text")
    assert res.answer == "ok"
    files = list((tmp_path / "runs" / "deep").glob("*.jsonl"))
    assert files and all(mode(f) == 0o600 for f in files)
    assert mode(tmp_path / "runs") == 0o700 and mode(tmp_path / "runs" / "deep") == 0o700


def test_response_cache_file_wal_and_directory(tmp_path, umask):
    path = tmp_path / "cache" / "recursa" / "responses.sqlite"
    cache = ResponseCache(path)
    try:
        conn = cache._conn()
        conn.execute("INSERT INTO responses VALUES ('k', 'm', 0, '{}')")
        made = [p for p in path.parent.iterdir()]
        assert {p.name for p in made} >= {"responses.sqlite", "responses.sqlite-wal"}
        for p in made:
            assert mode(p) == 0o600, p
        assert mode(tmp_path / "cache") == 0o700 and mode(path.parent) == 0o700
    finally:
        cache.close()


def test_response_cache_default_location_under_xdg(tmp_path, umask, monkeypatch):
    monkeypatch.delenv("RECURSA_RESPONSE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = ResponseCache()
    cache.close()
    assert cache.path == tmp_path / "xdg" / "recursa" / "responses.sqlite"
    assert mode(cache.path) == 0o600
    assert mode(tmp_path / "xdg") == 0o700 and mode(tmp_path / "xdg" / "recursa") == 0o700


def test_viewer_page_sft_export_and_bench_rows(tmp_path, umask):
    from recursa.bench.runner import ResultsFile
    from recursa.envs.rollout import write_results
    from recursa.envs.sft import export_sft
    from recursa.obs.viewer import write_html

    client = ReplayClient(root_script(repl('FINAL("ok")')))
    trace = tmp_path / "t.jsonl"
    RLM(model=client, sandbox="inprocess", trace_path=trace).completion("q", context="c")
    page = write_html(trace, tmp_path / "pages" / "run.html")
    assert mode(page) == 0o600 and mode(tmp_path / "pages") == 0o700

    out = tmp_path / "sft" / "data.jsonl"
    export_sft([trace], out, min_reward=0.0)
    assert mode(out) == 0o600 and mode(out.parent) == 0o700

    write_results([], tmp_path / "rollouts" / "r.jsonl")
    assert mode(tmp_path / "rollouts" / "r.jsonl") == 0o600

    rows = ResultsFile(tmp_path / "bench" / "results.jsonl")
    rows.close()
    assert mode(tmp_path / "bench" / "results.jsonl") == 0o600
    assert mode(tmp_path / "bench") == 0o700
