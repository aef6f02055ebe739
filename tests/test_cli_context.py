"""`--context` as a new user gives it to `recursa run`, `chat` and `batch`: several times, as a
pipe (`<(cmd)`, a named FIFO, stdin), or not at all. A real subprocess and a scripted model."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BIN = [sys.executable, "-m", "recursa.cli"]


def script(tmp_path: Path, replies: list[str]) -> str:
    p = tmp_path / "script.json"
    p.write_text(json.dumps(replies))
    return f"replay-file:{p}"


def run(args: list[str], stdin: bytes | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(BIN + args, input=stdin, capture_output=True, timeout=60, cwd=cwd)

# the model answers with what it was given: the context's keys and values
SHOW = ["```repl\nimport json\nFINAL(json.dumps(context, sort_keys=True))\n```"]


def shown(p: subprocess.CompletedProcess[bytes]) -> object:
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    a = tmp_path / "a.txt"
    a.write_text("alpha text\n")
    b = tmp_path / "notes.md"
    b.write_text("the launch is on Tuesday\n")
    d = tmp_path / "docs"
    d.mkdir()
    (d / "x.txt").write_text("in the folder\n")
    return a, b, d


def test_several_contexts_load_as_one_dict_each_under_its_name(tmp_path: Path):
    a, b, d = files(tmp_path)
    model = script(tmp_path, SHOW)
    p = run(["run", "q", "--context", str(a), "-c", str(b), "--context", str(d), "--model",
             model, "--sandbox", "inprocess", "-q"])
    assert shown(p) == {"a.txt": "alpha text\n", "notes.md": "the launch is on Tuesday\n",
                        "docs": {"x.txt": "in the folder\n"}}
    # two files of one name keep the paths they were given by; one file twice is refused
    other = tmp_path / "sub"
    other.mkdir()
    (other / "a.txt").write_text("another alpha\n")
    p = run(["run", "q", "-c", "a.txt", "-c", "sub/a.txt", "--model", model,
             "--sandbox", "inprocess", "-q"], cwd=tmp_path)
    assert shown(p) == {"a.txt": "alpha text\n", "sub/a.txt": "another alpha\n"}
    p = run(["run", "q", "-c", "a.txt", "-c", "./a.txt", "--model", model, "-q"], cwd=tmp_path)
    assert p.returncode == 2 and "--context ./a.txt: given twice" in p.stderr.decode()


def test_a_source_in_one_of_several_contexts_names_its_file(tmp_path: Path):
    a, b, d = files(tmp_path)
    model = script(tmp_path, ["```repl\nFINAL('Tuesday', sources=['the launch is on "
                              "Tuesday'])\n```"])
    p = run(["run", "When is the launch?", "-c", str(a), "-c", str(b), "-c", str(d),
             "--model", model, "--sandbox", "inprocess", "--sources", "-q"])
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert out.startswith("Tuesday\n") and "[1] notes.md" in out, out
    assert "NOT FOUND" not in out


def test_a_process_substitution_and_stdin_are_contexts(tmp_path: Path):
    if shutil.which("bash") is None:
        pytest.skip("needs bash for <(cmd)")
    a, _, _ = files(tmp_path)
    model = script(tmp_path, SHOW)
    cmd = " ".join([*map(shlex.quote, BIN), "run", "q", "--context", "<(printf 'from a pipe')",
                    "--model", shlex.quote(model), "--sandbox", "inprocess", "-q"])
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=60)
    assert shown(p) == "from a pipe"
    # with stdin and a file: one dict, the pipe and stdin under names of their own
    cmd = " ".join([*map(shlex.quote, BIN), "run", "q", "-c", "-", "-c", "<(printf 'piped')",
                    "-c", shlex.quote(str(a)), "--model", shlex.quote(model), "--sandbox",
                    "inprocess", "-q"])
    p = subprocess.run(["bash", "-c", cmd], input=b"from stdin", capture_output=True,
                       timeout=60)
    assert shown(p) == {"stdin": "from stdin", "pipe-2": "piped", "a.txt": "alpha text\n"}


def _fifo(path: Path, data: bytes) -> threading.Thread:
    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as f:      # blocks until the reader opens it
            f.write(data)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def test_a_named_fifo_is_read_once_but_one_inside_a_folder_is_still_skipped(tmp_path: Path):
    model = script(tmp_path, SHOW)
    writer = _fifo(tmp_path / "feed.csv", b"name,n\nx,1\n")
    p = run(["run", "q", "-c", str(tmp_path / "feed.csv"), "-c", "-", "--model", model,
             "--sandbox", "inprocess", "-q"], stdin=b"typed")
    writer.join(5)
    got = shown(p)
    assert isinstance(got, dict) and got["stdin"] == "typed" and "x,1" in got["feed.csv"]
    # a folder walk never opens a FIFO (issue 35): no writer, and the run does not block
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "real.txt").write_text("real text\n")
    os.mkfifo(folder / "trap")
    p = run(["run", "q", "-c", str(folder), "--model", model, "--sandbox", "inprocess", "-q"])
    assert shown(p) == {"real.txt": "real text\n"}


def test_a_pipe_over_the_document_cap_is_refused_naming_the_cap(tmp_path: Path, monkeypatch,
                                                                capsys):
    from recursa.cli import main
    from recursa.documents import limits
    monkeypatch.setattr(limits, "MAX_DOCUMENT_BYTES", 1000)
    model = script(tmp_path, SHOW)
    writer = _fifo(tmp_path / "big", b"x" * 5000)
    code = main(["run", "q", "-c", str(tmp_path / "big"), "--model", model, "-q"])
    writer.join(5)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "came through it, over the limit for one document" in err
    assert "MAX_DOCUMENT_BYTES" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y" * 5000)))
    assert main(["run", "q", "-c", "-", "--model", model, "-q"]) == 2
    assert "--context -: more than" in " ".join(capsys.readouterr().err.split())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y" * 999)))
    assert main(["run", "q", "-c", "-", "--model", model, "-q",
                 "--sandbox", "inprocess"]) == 0
    assert capsys.readouterr().out.strip() == json.dumps("y" * 999)


def test_no_context_names_the_flag_not_the_library_argument(tmp_path: Path):
    p = run(["run", "What is X?", "--model", script(tmp_path, SHOW)])
    err = " ".join(p.stderr.decode().split())
    assert p.returncode == 2
    assert "--context FILE" in err and "--context -" in err and "context=" not in err
    assert p.stdout == b""


def test_two_paths_after_one_context_flag_say_to_repeat_it(tmp_path: Path):
    a, b, d = files(tmp_path)
    model = script(tmp_path, SHOW)
    for args in (["--context", str(a), str(b), "What is X?"],       # b taken as the question
                 ["What is X?", "--context", str(a), str(b), str(d)]):
        p = run(["run", *args, "--model", model])
        err = " ".join(p.stderr.decode().split())
        assert p.returncode == 2 and p.stdout == b""
        assert err.startswith("usage: recursa run"), err       # run's usage, not the top level
        want = f"--context {a} --context {b}" + (f" --context {d}" if str(d) in args else "")
        assert f"--context takes one path; repeat it: {want}" in err, err
    p = run(["chat", "--context", str(a), str(b), "--model", model])       # chat the same
    err = " ".join(p.stderr.decode().split())
    assert p.returncode == 2 and err.startswith("usage: recursa chat"), err
    assert f"repeat it: --context {a} --context {b}" in err
    # a leftover that is not a path stays argparse's own error
    p = run(["run", "What is X?", "--context", str(a), "stray-word", "--model", model])
    err = p.stderr.decode()
    assert p.returncode == 2 and "unrecognized arguments: stray-word" in err
    assert "repeat it" not in err


def test_chat_takes_several_contexts_and_refuses_stdin_as_one(tmp_path: Path):
    a, b, _ = files(tmp_path)
    model = script(tmp_path, ["```repl\nFINAL(' '.join(sorted(context)))\n```"])
    p = subprocess.run(BIN + ["chat", "-c", str(a), "-c", str(b), "--model", model,
                              "--sandbox", "inprocess", "--trace", str(tmp_path / "t.jsonl")],
                       input=b"which files?\n",
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().splitlines()[0] == "a.txt notes.md"
    p = subprocess.run(BIN + ["chat", "-c", "-", "--model", model], input=b"q\n",
                       capture_output=True, timeout=60)
    err = " ".join(p.stderr.decode().split())
    assert p.returncode == 2 and "reads its questions from stdin" in err


def test_batch_queries_over_several_contexts(tmp_path: Path):
    a, b, _ = files(tmp_path)
    qs = tmp_path / "qs.txt"
    qs.write_text("first?\nsecond?\n")
    out = tmp_path / "rows.jsonl"
    model = script(tmp_path, ["```repl\nFINAL(' '.join(sorted(context)))\n```"] * 2)
    p = subprocess.run(BIN + ["batch", "--queries", str(qs), "--context", str(a), "--context",
                              str(b), "--out", str(out), "--model", model, "--sandbox",
                              "inprocess", "-q", "--concurrency", "1"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["a.txt notes.md"] * 2
