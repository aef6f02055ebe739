"""The one options layer (recursa.frontend.options): every front end takes the same model, endpoint,
limit and sandbox options with the same names, defaults and help; old spellings still work."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from recursa.cli import build_parser
from recursa.frontend.options import LIMITS, OPTIONS, OptionError, RLMOptions, options_table

FRONT_ENDS = {"run": ["run"], "bench run": ["bench", "run"], "ablate": ["ablate"],
              "serve": ["serve"], "mcp": ["mcp"]}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def subparser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def visible(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS}


def test_every_front_end_has_the_same_shared_options() -> None:
    root = build_parser()
    for name, path in FRONT_ENDS.items():
        acts = visible(subparser(root, path))
        for o in OPTIONS:
            a = acts.get(o.flags[0])
            assert a is not None, f"{name} lacks {o.flags[0]}"
            assert a.dest == o.dest and a.help == o.help, (name, o.flags[0])
            assert a.default == o.kw.get("default"), (name, o.flags[0], a.default)


def test_old_spellings_are_hidden_aliases() -> None:
    p = build_parser()
    a = p.parse_args(["run", "q", "--concurrency", "5", "--max-cost-usd", "0.5"])
    assert a.subcall_concurrency == 5 and a.max_cost_usd == 0.5
    a = p.parse_args(["bench", "run", "--task", "sniah", "--out", "x", "--seed-start", "3",
                      "--concurrency", "2", "--length", "4k"])
    assert a.seed == 3 and a.concurrency == 2 and a.subcall_concurrency == 32
    assert a.lengths == "4k"
    a = p.parse_args(["bench", "run", "--task", "sniah", "--out", "x"])
    assert a.seed == 0 and a.concurrency == 4 and a.lengths == "8k"
    a = p.parse_args(["ablate", "--env", "oolong", "--length", "40", "--concurrency", "7",
                      "--subcall-concurrency", "9"])
    assert a.lengths == "40" and a.concurrency == 7 and a.subcall_concurrency == 9
    help_text = subparser(p, ["bench", "run"]).format_help()
    assert "--seed-start" not in help_text and "--parallel" in help_text


def test_bounds_are_checked_while_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    p = build_parser()
    for args, msg in ((["--max-iterations", "0"], "must be at least 1, got 0"),
                      (["--max-seconds", "0"], "must be more than 0, got 0"),
                      (["--max-depth", "two"], "expected a whole number, got 'two'"),
                      (["--max-output-chars", "10"], "must be at least 256"),
                      (["--price", "1/x"], "expected IN/OUT")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(["mcp", *args])
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_rlm_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    p = build_parser()
    monkeypatch.setenv("MY_KEY", "secret")
    a = p.parse_args(["run", "q", "--model", "openai:m", "--base-url", "http://h/v1",
                      "--api-key-env", "MY_KEY", "--max-cost", "0.5", "--max-iterations", "4",
                      "--temperature", "0", "--max-answer-tokens", "300", "--price", "1/2",
                      "--price", "openai:other=3/4"])
    kw = RLMOptions.from_args(a).rlm_kwargs()
    assert kw["api_key"] == "secret" and kw["base_url"] == "http://h/v1"
    assert kw["max_cost_usd"] == 0.5 and kw["max_iterations"] == 4
    assert "max_tokens" not in kw and set(LIMITS) >= {k for k in kw if k.startswith("max_")
                                                       and k != "max_output_chars"}
    assert kw["model_options"] == {"max_tokens": 300, "temperature": 0.0}
    assert kw["prices"] == {"openai:m": (1.0, 2.0), "openai:other": (3.0, 4.0)}
    assert "cache" not in kw                       # the library's default unless asked
    assert RLMOptions(cache=True).rlm_kwargs()["cache"] is True
    assert p.parse_args(["run", "q", "--cache"]).cache is True
    assert p.parse_args(["run", "q", "--cache", "c.db"]).cache == "c.db"
    with pytest.raises(OptionError, match="--n-ctx"):
        RLMOptions(model="openai:m", n_ctx=4096).rlm_kwargs()
    assert RLMOptions(model="local:x", n_ctx=4096).client_options() == {"n_ctx": 4096}
    with pytest.raises(OptionError, match="--price IN/OUT prices --model"):
        RLMOptions(prices=[(None, 1.0, 1.0)]).price_table()
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(OptionError, match="MY_KEY: that environment variable is not set"):
        RLMOptions(api_key_env="MY_KEY").rlm_kwargs()


def test_options_travel_as_json_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "secret")
    opts = RLMOptions(model="openai:m", api_key_env="MY_KEY", prices=[(None, 1.0, 2.0)],
                      max_seconds=5.0)
    text = json.dumps(opts.to_dict())
    assert "secret" not in text
    back = RLMOptions.from_dict(json.loads(text))
    assert back == opts and back.rlm_kwargs()["api_key"] == "secret"


def test_build_makes_the_rlm() -> None:
    rlm = RLMOptions(model="replay:", max_iterations=3, subcall_concurrency=5).build(
        trace_path="t.jsonl")
    assert rlm.budget.max_iterations == 3 and rlm.concurrency == 5
    assert str(rlm.trace_path) == "t.jsonl"


def test_docs_table_is_the_options_table() -> None:
    assert options_table() in DOCS.read_text()


def test_mcp_server_and_server_cli_do_not_import_each_other() -> None:
    code = ("import sys, recursa.server.mcp_server; "
            "assert 'recursa.server.cli' not in sys.modules, 'circle'; "
            "import recursa.server.cli; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    out = subprocess.run([sys.executable, "-m", "recursa.server.mcp_server", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--subcall-concurrency" in out.stdout


def test_a_missing_extra_is_one_error_type_with_the_pip_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from recursa.base.extras import MissingExtra
    from recursa.cli import main
    e = MissingExtra("serve", "recursa serve", module="uvicorn")
    assert isinstance(e, ImportError) and e.name == "uvicorn"
    assert str(e) == "recursa serve needs the 'uvicorn' package: pip install 'recursa[serve]'"
    # `recursa serve` without the extra: exit 2 with the command to run
    for mod in [m for m in sys.modules if m == "starlette" or m.startswith("starlette.")
                or m == "recursa.server.openai_app"]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "starlette", None)
    assert main(["serve", "--model", "replay:"]) == 2
    assert "pip install 'recursa[serve]'" in capsys.readouterr().err
    # the Ray executor and the remote sandboxes say it the same way
    from recursa.bench import executors
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtra, match=r"pip install 'recursa\[ray\]'"):
        executors._require_ray()
