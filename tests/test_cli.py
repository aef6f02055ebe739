"""`recursa run` as a user runs it: a real subprocess, a scripted model from a JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = [sys.executable, "-m", "recursa.cli"]


def script(tmp_path: Path, replies: list[str]) -> str:
    p = tmp_path / "script.json"
    p.write_text(json.dumps(replies))
    return f"replay-file:{p}"


def run(args: list[str], stdin: bytes | None = None, env: dict | None = None):
    return subprocess.run(BIN + args, input=stdin, capture_output=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_run_prints_answer_on_stdout_and_summary_on_stderr(tmp_path: Path):
    ctx = tmp_path / "doc.txt"
    ctx.write_text("the magic word is xylophone\n" * 100)
    model = script(tmp_path, ["```repl\nimport re\nw = re.search(r'is (\\w+)', context)"
                              ".group(1)\nFINAL(w)\n```"])
    trace = tmp_path / "t.jsonl"
    p = run(["run", "What is the magic word?", "--context", str(ctx), "--model", model,
             "--trace", str(trace)])
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "xylophone"
    err = p.stderr.decode()
    assert "status final" in err and "turns 1" in err
    assert trace.exists() and trace.stat().st_size > 0


def test_context_from_stdin(tmp_path: Path):
    model = script(tmp_path, ["```repl\nFINAL(str(len(context)))\n```"])
    p = run(["run", "How long?", "--context", "-", "--model", model, "-q"], stdin=b"abcdef")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "6"


def test_missing_context_file_is_a_clear_error(tmp_path: Path):
    model = script(tmp_path, ["x"])
    p = run(["run", "q", "--context", str(tmp_path / "nope.txt"), "--model", model])
    assert p.returncode == 2
    assert "does not exist" in p.stderr.decode()
    assert p.stdout.decode() == ""


def test_binary_context_and_bad_model_spec(tmp_path: Path):
    b = tmp_path / "x.bin"
    b.write_bytes(b"\x00\x01\x02binary")
    model = script(tmp_path, ["x"])
    p = run(["run", "q", "--context", str(b), "--model", model])
    assert p.returncode == 2 and "binary" in p.stderr.decode()
    p = run(["run", "q", "--context", str(b), "--model", "gpt-5"])
    assert p.returncode == 2 and "prefix" in p.stderr.decode()


def test_failed_run_exits_nonzero_and_keeps_trace(tmp_path: Path):
    # the script runs out after one turn: the model "fails" on the second call
    model = script(tmp_path, ['```repl\nanswer["content"] = "half"\n```'])
    trace = tmp_path / "t.jsonl"
    p = run(["run", "q", "--context", "-", "--model", model, "--trace", str(trace), "-q"],
            stdin=b"data")
    assert p.returncode == 1
    assert "run failed" in p.stderr.decode()
    assert p.stdout.decode().strip() == "half"      # the partial answer is not lost
    assert trace.stat().st_size > 0


def test_no_model_and_no_keys_picks_local_model_and_says_so(tmp_path: Path):
    env = {k: "" for k in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    p = run(["run", "q", "--context", str(tmp_path / "missing.txt")], env=env)
    assert "using local:qwen2.5-coder-1.5b" in p.stderr.decode()


def test_a_missing_local_model_file_fails_before_any_work(tmp_path: Path):
    ctx = tmp_path / "c.txt"
    ctx.write_text("data")
    p = run(["run", "q", "--context", str(ctx), "--model", f"local:{tmp_path}/absent.gguf"])
    assert p.returncode == 2 and "no such model file" in p.stderr.decode()


# ---------------------------------------------------------------- output contracts
FINAL_SCRIPT = ["```repl\nFINAL('forty-two')\n```"]


def test_json_prints_the_result_on_stdout_and_nothing_else(tmp_path: Path):
    p = run(["run", "q", "--context", "-", "--model", script(tmp_path, FINAL_SCRIPT), "--json",
             "--sandbox", "inprocess"], stdin=b"data")
    assert p.returncode == 0, p.stderr.decode()
    res = json.loads(p.stdout)                    # the whole of stdout is one JSON document
    assert res["answer"] == "forty-two" and res["status"] == "final" and res["turns"] == 1
    assert "forty-two" not in p.stderr.decode().replace("FINAL('forty-two')", "")


def test_quiet_prints_only_the_answer(tmp_path: Path):
    p = run(["run", "q", "--context", "-", "--model", script(tmp_path, FINAL_SCRIPT), "-q",
             "--sandbox", "inprocess"], stdin=b"data")
    assert p.returncode == 0
    assert p.stdout.decode() == "forty-two\n" and p.stderr.decode() == ""


def test_events_jsonl_writes_only_json_lines_on_stderr(tmp_path: Path):
    p = run(["run", "q", "--context", "-", "--model", script(tmp_path, FINAL_SCRIPT),
             "--events", "jsonl", "--sandbox", "inprocess"], stdin=b"data")
    assert p.returncode == 0 and p.stdout.decode() == "forty-two\n"
    events = [json.loads(line) for line in p.stderr.decode().splitlines()]
    assert events[0]["kind"] == "run" and events[-1]["kind"] == "run"
    assert events[-1]["phase"] == "end"
    # notices and errors keep the contract too: the default-model notice, then the failure
    env = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "", "HTTPS_PROXY": "",
           "https_proxy": ""}
    ctx = tmp_path / "c.txt"
    ctx.write_text("x")
    p = run(["run", "q", "--context", str(ctx), "--events", "jsonl", "--base-url",
             f"http://127.0.0.1:{closed_port()}/v1"], env=env)
    assert p.returncode == 2
    lines = [json.loads(line) for line in p.stderr.decode().splitlines()]
    assert [x["kind"] for x in lines] == ["notice", "error"]
    assert "no --model given" in lines[0]["message"]
    assert "cannot reach" in lines[1]["message"]


def closed_port() -> int:
    import socket
    with socket.socket() as s:       # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_version():
    p = run(["--version"])
    assert p.returncode == 0 and p.stdout.decode().startswith("recursa ")


def test_run_does_not_import_the_other_commands_modules():
    """`recursa run` builds only its own command (start-up time); the full parser, as
    `build_parser()` makes it, still has every command."""
    code = ("import sys\n"
            "from recursa.cli import build_parser\n"
            "p = build_parser(['run', 'q'])\n"
            "assert p.parse_args(['run', 'q', '-q']).quiet\n"
            "print(sorted(m for m in sys.modules if m.startswith(('recursa.bench', "
            "'recursa.envs', 'recursa.server', 'recursa.obs.viewer', 'recursa.chat'))))\n"
            "full = build_parser()\n"
            "print(full.parse_args(['bench', 'list']).cmd)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[]", "bench"]


def test_a_plain_run_imports_only_what_it_uses(tmp_path: Path):
    """`recursa run` over a text file, without a response cache, tools or combinator calls,
    loads none of the modules only other runs need (start-up time: docs/performance.md)."""
    ctx = tmp_path / "doc.txt"
    ctx.write_text("the magic word is xylophone\n")
    model = script(tmp_path, ["```repl\nFINAL('ok')\n```"])
    code = ("import sys\n"
            "from recursa.cli import main\n"
            f"sys.argv = ['recursa', 'run', 'q', '-c', {str(ctx)!r}, '--model', {model!r}, "
            "'--sandbox', 'inprocess', '-q']\n"
            "code = main()\n"
            "print(sorted(m for m in sys.modules if m.startswith(("
            "'recursa.documents.build', 'recursa.documents.describe', "
            "'recursa.documents.formats', 'recursa.models.cache', 'recursa.models.fetch', "
            "'recursa.core.tools', 'recursa.core.combinators', 'recursa.sandbox.session', "
            "'sqlite3', 'tarfile', 'html', 'ctypes', 'statistics'))))\n"
            "sys.exit(code)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["ok", "[]"]


def test_version_and_help_import_no_command_and_no_dependency():
    code = ("import sys, contextlib, io\n"
            "from recursa.cli import main\n"
            "for argv in (['--version'], ['--help']):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        main(argv)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('recursa.', 'pydantic', "
            "'httpx', 'rich'))))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['recursa.cli']"


def test_the_command_table_matches_what_the_modules_register():
    """COMMANDS lists every command with its module and help line: `recursa --help` (built
    from the table alone) reads as the full parser's, and naming a command builds it in full
    from the module the table names."""
    from recursa.cli import COMMANDS, build_parser
    full = build_parser()
    lean = build_parser(["--help"])
    assert lean.format_help() == full.format_help()
    for name in COMMANDS:
        one = build_parser([name])
        sub = next(a for a in one._actions if a.dest == "cmd")
        built = sub.choices[name]
        assert built.format_help() == next(
            a for a in full._actions if a.dest == "cmd").choices[name].format_help(), name
    run = build_parser(["-q", "run"])   # options before the command: still `run`
    assert run.parse_args(["run", "q", "-q"]).fn.__name__ == "cmd_run"


def test_bad_option_values_are_plain_words(tmp_path: Path):
    p = run(["run", "q", "--max-iterations", "0"])
    err = p.stderr.decode()
    assert p.returncode == 2
    assert "--max-iterations: must be at least 1, got 0" in err
    assert "pydantic" not in err and "http" not in err
    p = run(["run", "q", "--price", "cheap"])
    assert p.returncode == 2 and "expected IN/OUT" in p.stderr.decode()


def test_a_missing_key_names_the_cli_option_not_a_python_argument(tmp_path: Path):
    env = {"OPENAI_API_KEY": ""}
    p = run(["run", "q", "--context", "-", "--model", "openai:gpt-5-mini"], stdin=b"x", env=env)
    err = p.stderr.decode()
    assert p.returncode == 2
    assert "OPENAI_API_KEY" in err and "--api-key-env NAME" in err and "api_key=" not in err
    p = run(["run", "q", "--context", "-", "--model", "openai:m", "--base-url",
             "http://127.0.0.1:9/v1", "--api-key-env", "RECURSA_NO_SUCH_VAR"], stdin=b"x")
    assert p.returncode == 2 and "RECURSA_NO_SUCH_VAR: that environment variable is not set" \
        in p.stderr.decode()


# ---------------------------------------------------------------- exit statuses
def test_exit_status_says_how_the_run_ended(tmp_path: Path):
    from recursa.cli import EXIT_CODES
    assert EXIT_CODES == {"final": 0, "error": 1, "extracted": 3, "limit": 4}
    base = ["run", "q", "--context", "-", "--sandbox", "inprocess", "--json"]
    partial = {"cycle": ['```repl\nanswer["content"] = "partial"\n```']}
    cases = [(FINAL_SCRIPT, [], "final", 0),
             (partial, ["--max-iterations", "1"], "extracted", 3),
             (partial, ["--max-tokens", "100"], "limit", 4),
             (['```repl\nanswer["content"] = "half"\n```'], [], "error", 1)]   # script runs out
    for replies, extra, status, code in cases:
        p = run([*base, "--model", script(tmp_path, replies), *extra], stdin=b"data")
        assert json.loads(p.stdout)["status"] == status, p.stderr.decode()
        assert p.returncode == code, (status, p.stderr.decode())


# ---------------------------------------------------------------- traces
def test_trace_refuses_an_existing_file_unless_append_and_view_picks_a_run(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    for query in ("first question", "second question"):
        p = run(["run", query, "--context", "-", "--model", script(tmp_path, FINAL_SCRIPT), "-q",
                 "--sandbox", "inprocess", "--trace", str(trace), "--append"], stdin=b"data")
        assert p.returncode == 0, p.stderr.decode()
    size = trace.stat().st_size
    p = run(["run", "third", "--context", "-", "--model", script(tmp_path, FINAL_SCRIPT),
             "--sandbox", "inprocess", "--trace", str(trace)], stdin=b"data")
    assert p.returncode == 2 and "pass --append" in p.stderr.decode()
    assert trace.stat().st_size == size and p.stdout.decode() == ""

    p = run(["view", str(trace), "--runs"])
    lines = p.stdout.decode().splitlines()
    assert p.returncode == 0 and len(lines) == 2
    assert "first question" in lines[0] and "second question" in lines[1]
    first_id = lines[0].split()[1]

    p = run(["view", str(trace), "-o", str(tmp_path / "last.html")])
    assert p.returncode == 0 and "holds 2 runs" in p.stderr.decode()
    assert "second question" in (tmp_path / "last.html").read_text()
    for which in ("1", first_id):
        out = tmp_path / f"pick-{which}.html"
        p = run(["view", str(trace), "--run", which, "-o", str(out)])
        assert p.returncode == 0, p.stderr.decode()
        page = out.read_text()
        assert "first question" in page and "second question" not in page
    p = run(["view", str(trace), "--run", "3"])
    assert p.returncode == 2 and "holds 2" in p.stderr.decode()


# ---------------------------------------------------------------- typed answers
def test_schema_prints_the_validated_json_and_fails_when_never_met(tmp_path: Path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                  "required": ["n"]}))
    good = ['```repl\nanswer["content"] = \'{"n": 42}\'\nanswer["ready"] = True\n```']
    base = ["run", "q", "--context", "-", "--sandbox", "inprocess", "--schema", str(schema)]
    p = run([*base, "--model", script(tmp_path, good)], stdin=b"data")
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout) == {"n": 42}
    bad = {"cycle": ['```repl\nanswer["content"] = "no number"\nanswer["ready"] = True\n```']}
    p = run([*base, "--model", script(tmp_path, bad), "--max-iterations", "2"], stdin=b"data")
    assert p.returncode == 1
    assert "does not match --schema" in p.stderr.decode()
    schema.write_text("[1, 2]")
    p = run([*base, "--model", script(tmp_path, good)], stdin=b"data")
    assert p.returncode == 2 and "a JSON schema is an object" in p.stderr.decode()


def test_python_dash_m_recursa_is_the_command_line():
    p = subprocess.run([sys.executable, "-m", "recursa", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    from recursa import __version__
    assert __version__ in p.stdout
    bad = subprocess.run([sys.executable, "-m", "recursa", "no-such-command"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no-such-command" in bad.stderr


def _started(trace: Path, text: str, timeout: float = 30.0) -> None:
    import time
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if trace.exists() and text in trace.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the trace in {timeout} s")


def test_a_run_stopped_by_sigterm_or_a_closed_terminal_ends_its_trace_and_prints_its_draft(
        tmp_path: Path):
    """SIGTERM and SIGHUP (the terminal closed) stop a run as Ctrl-C does: the trace gets the
    run's final and end events, and the draft answer is printed."""
    import signal
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        model = script(tmp_path, ['```repl\nanswer["content"] = "a draft"\n```',
                                  '```repl\nimport time\ntime.sleep(60)\n```'])
        trace = tmp_path / f"t{sig}.jsonl"
        p = subprocess.Popen(BIN + ["run", "q", "--context", "-", "--model", model,
                                    "--trace", str(trace), "--sandbox", "local"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdin is not None
        p.stdin.write(b"some context")
        p.stdin.close()
        _started(trace, "time.sleep")       # the second cell is running
        p.send_signal(sig)
        p.stdin = None       # written and closed above
        out, err = p.communicate(timeout=30)
        assert p.returncode == status, err.decode()
        assert out.decode().strip() == "a draft"
        assert signal.Signals(sig).name in err.decode()
        kinds = [json.loads(x)["kind"] for x in trace.read_text().splitlines()]
        assert "final" in kinds and kinds[-1] == "run"


def test_without_a_terminal_a_long_run_prints_a_status_line_every_few_seconds(tmp_path: Path):
    model = script(tmp_path, ['```repl\nimport time\ntime.sleep(7)\nFINAL("done")\n```'])
    p = run(["run", "q", "--context", "-", "--model", model], stdin=b"x")
    assert p.returncode == 0, p.stderr.decode()
    beats = [x for x in p.stderr.decode().splitlines() if x.startswith("turn 1 ")]
    assert len(beats) >= 1, p.stderr.decode()     # a heartbeat while the cell ran


def on_a_terminal(args: list[str], stdin: bytes) -> tuple[int, str, str]:
    """`recursa ARGS` with stdout a pseudo-terminal, as a user's is: (status, stdout, stderr)."""
    import pty
    main_fd, sub_fd = pty.openpty()
    p = subprocess.run(BIN + args, input=stdin, stdout=sub_fd, stderr=subprocess.PIPE,
                       timeout=60)
    os.close(sub_fd)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(main_fd)
    return p.returncode, out.decode().replace("\r\n", "\n").strip(), p.stderr.decode()


def test_an_answer_with_escape_sequences_prints_inert_on_a_terminal(tmp_path: Path):
    """A model's answer, and an unfound quote of `--sources`, with an OSC 52 clipboard write
    and cursor moves reach a terminal as visible text; --raw (or a pipe) keeps its characters."""
    evil = "ok\x1b]52;c;ZXZpbA==\x07\x1b[2A\x1b[2Kdone"
    shown = "ok\\x1b]52;c;ZXZpbA==\\x07\\x1b[2A\\x1b[2Kdone"
    model = script(tmp_path, [f"```repl\nFINAL({evil!r}, sources=[{evil!r}])\n```"] * 2)
    quote = "Sources:\n[1] NOT FOUND in the context\n    "
    for raw, want in ((False, shown), (True, evil)):
        status, text, err = on_a_terminal(
            ["run", "q", "--context", "-", "--model", model, "-q", "--sandbox", "inprocess",
             "--sources", *(["--raw"] if raw else [])], stdin=b"x")
        assert status == 0, err
        assert text == f"{want}\n\n{quote}{want}", (raw, text)
    piped = run(["run", "q", "--context", "-", "--model", model, "-q", "--sandbox", "inprocess"],
                stdin=b"x")
    assert piped.stdout.decode().strip() == evil       # a pipe gets what the model wrote


def test_json_on_a_terminal_escapes_c1_controls_and_keeps_the_value(tmp_path: Path):
    """U+009B is a whole CSI to some terminals and JSON leaves it raw: `--json` and `--schema`
    write it (and DEL) as a \\u escape on a terminal, the same JSON value."""
    answer = "a\x9b2Ab\x7f"
    model = script(tmp_path, [f"```repl\nFINAL({answer!r})\n```"] * 2)
    status, text, err = on_a_terminal(["run", "q", "--context", "-", "--model", model, "-q",
                                       "--sandbox", "inprocess", "--json"], stdin=b"x")
    assert status == 0, err
    assert "\x9b" not in text and "\x7f" not in text and "a\\u009b2Ab\\u007f" in text
    assert json.loads(text)["answer"] == answer
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "string"}}}))
    content = json.dumps({"n": answer})
    model = script(tmp_path, [f"```repl\nanswer['content'] = {content!r}\n"
                              "answer['ready'] = True\n```"] * 2)
    status, text, err = on_a_terminal(["run", "q", "--context", "-", "--model", model, "-q",
                                       "--sandbox", "inprocess", "--schema", str(schema)],
                                      stdin=b"x")
    assert status == 0, err
    assert text == '{"n": "a\\u009b2Ab\\u007f"}' and json.loads(text) == {"n": answer}


def test_inert_keeps_newlines_and_tabs_and_shows_every_other_control():
    from recursa.obs.terminal import inert
    assert inert("a\tb\nc\x1b[31m\x9b\x7f") == "a\tb\nc\\x1b[31m\\x9b\\x7f"


def test_notices_on_stderr_show_escape_sequences_as_text(capsys):
    """`run`'s notes and errors may quote a provider's reply or a model's text: as rich text
    they are inert, as JSON lines they are JSON (which escapes them)."""
    from recursa.frontend.console import Notices
    evil = "x\x1b]52;c;ZXZpbA==\x07\x9b2Ky"
    for jsonl in (False, True):
        notes = Notices(jsonl=jsonl, quiet=False)
        notes.info(f"i {evil}")
        notes.warn(f"w {evil}")
        notes.error(f"run failed: {evil}")
        notes.close()
        err = capsys.readouterr().err
        assert "\x1b" not in err and "\x07" not in err and "\x9b" not in err, (jsonl, err)
        if jsonl:
            assert [json.loads(x)["message"][-len(evil):] for x in err.splitlines()] == [evil] * 3
        else:
            assert err.count("x\\x1b]52;c;ZXZpbA==\\x07\\x9b2Ky") == 3, err


def test_inert_json_escapes_del_and_c1_and_keeps_the_value():
    from recursa.obs.terminal import inert_json
    value = {"k\x85": ["caf\u00e9 \x9b1m", "\\\x9b", "\x1b\x7f\xa0"]}
    text = inert_json(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value and not any("\x7f" <= c <= "\x9f" for c in text)
    assert "caf\u00e9" in text        # other characters stay readable


# ---------------------------------------------------------------- --cache and the question
def _query_of(trace: Path) -> str:
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    return next(e["data"]["query"] for e in events
                if e["kind"] == "run" and e.get("phase") == "start")


def test_cache_before_the_question_leaves_the_question_a_question(tmp_path: Path):
    """`--cache` takes an optional PATH: before the question it used to take the question as
    its file. Both orders now ask the question, with the cache on."""
    ctx = tmp_path / "c.txt"
    ctx.write_text("data")
    model = script(tmp_path, FINAL_SCRIPT)
    default = tmp_path / "default.sqlite"
    base = ["--context", str(ctx), "--model", model, "--sandbox", "inprocess", "-q",
            "--temperature", "0"]
    env = {"RECURSA_RESPONSE_CACHE": str(default)}
    for i, order in enumerate((["--cache", "What is X?"], ["What is X?", "--cache"])):
        trace = tmp_path / f"t{i}.jsonl"
        p = run(["run", *order, *base, "--trace", str(trace)], env=env)
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout.decode() == "forty-two\n" and _query_of(trace) == "What is X?"
        assert default.exists() and not (tmp_path / "What is X?").exists()
    # a file: --cache=PATH, in either place
    for order in (["--cache=" + str(tmp_path / "mine.sqlite"), "What is X?"],
                  ["What is X?", "--cache", str(tmp_path / "mine.sqlite")]):
        p = run(["run", *order, *base], env=env)
        assert p.returncode == 0, p.stderr.decode()
        assert (tmp_path / "mine.sqlite").exists()
    # a word that could be a file or a question: an error naming both readings, nothing run
    p = run(["run", "--cache", "summary", *base], env=env)
    err = " ".join(p.stderr.decode().split())
    assert p.returncode == 2 and p.stdout == b""
    assert "--cache took 'summary' as its cache file" in err and "--cache=PATH" in err
    assert not (tmp_path / "summary").exists()
    # batch asks QUERY of every context the same way
    out = tmp_path / "rows.jsonl"
    p = run(["batch", "--cache", "What is X?", "--contexts", str(ctx), "--out", str(out),
             "--model", model, "--sandbox", "inprocess", "-q"], env=env)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(out.read_text())["query"] == "What is X?"


# ---------------------------------------------------------------- cost, live and at the end
def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`recursa` with stderr on a pseudo-terminal (the live view draws there): status,
    stdout, everything written to the terminal."""
    import pty
    import threading
    main_fd, sub_fd = pty.openpty()
    p = subprocess.Popen(BIN + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=sub_fd, env={**os.environ, "COLUMNS": "200", **env})
    os.close(sub_fd)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:        # the other end closed
                return
            if not chunk:
                return
            chunks.append(chunk)
    reader = threading.Thread(target=read)
    reader.start()
    out, _ = p.communicate(b"some data", timeout=60)
    reader.join(10)
    os.close(main_fd)
    return p.returncode, out.decode(), b"".join(chunks).decode()


def test_an_unpriced_model_shows_cost_unknown_live_and_at_the_end(tmp_path: Path):
    """The live line and the end line agree: `cost ?` for a model without a price (it used to
    show $0.0000 while running), dollars in both for a priced one."""
    import re
    import time

    from openai_testserver import OpenAITestServer

    def slow_final(request: dict) -> str:
        time.sleep(0.6)          # the live view draws while the first call is out
        return "```repl\nFINAL('done')\n```"
    with OpenAITestServer(slow_final) as srv:
        base = ["run", "q", "--context", "-", "--model", "openai:unpriced", "--base-url",
                srv.base_url, "--sandbox", "inprocess"]
        for price, want in (([], "cost ?"), (["--price", "1/2"], "cost $")):
            code, out, term = _on_a_terminal(base + price, {"OPENAI_API_KEY": "test-key"})
            assert code == 0 and out == "done\n", term
            live = [x for x in re.split(r"[\r\n]", term) if "running" in x]
            end = next(x for x in term.splitlines() if "status final" in x)
            assert live and all("cost …" in x or want in x for x in live), live
            assert sum(want in x for x in live) >= 2, live   # while the call was out, and after
            assert want in end, end
            if not price:
                assert "$0.0000" not in term and "--price IN/OUT" in term
            else:
                assert re.search(r"cost \$0\.\d{4}", end) and "cost ?" not in term
