"""The llm-recursa plugin's options through the real `llm` command, in this process: llm's CLI
(click's runner keeps stdout and stderr apart) with the plugin registered in llm's plugin
manager, as llm's own plugin tests do. Scripted models (`replay-file:`) and a real HTTP
OpenAI-compatible server keep every run under a second. tests/test_llm_plugin.py installs the
plugin with pip and runs the `llm` binary (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openai_testserver import OpenAITestServer

llm = pytest.importorskip("llm", reason="the llm package is not installed (dev extra)")
from click.testing import CliRunner, Result  # noqa: E402  (after the skip: click comes with llm)

_PATH = Path(__file__).resolve().parents[1] / "plugins" / "llm-recursa" / "llm_recursa.py"
_spec = importlib.util.spec_from_file_location("llm_recursa_cli_under_test", _PATH)
assert _spec is not None and _spec.loader is not None
plugin = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = plugin      # as an import does: pydantic resolves Options' hints there
_spec.loader.exec_module(plugin)

DESCRIBE = ("```repl\nFINAL(type(context).__name__ + ' of ' + str(len(context)) + ' chars')\n```")


@pytest.fixture(scope="module")
def warm() -> None:
    """What the first test would pay for all: llm's CLI and its installed plugins, the OpenAI
    SDK and a first RLM run (about 4 s here, mostly imports); a run costs ~50 ms after it."""
    import llm.cli  # noqa: F401
    import openai  # noqa: F401
    from llm.plugins import load_plugins

    from recursa import RLM
    load_plugins()
    RLM(model="replay:", sandbox="inprocess").completion("?", "x")


@pytest.fixture
def run_llm(warm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`llm ARGS...` in this process: llm's data, and recursa's settings, in tmp_path."""
    from llm.cli import cli
    from llm.plugins import pm
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for var in ("RECURSA_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY",
                "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "llm-home").mkdir()
    name = "recursa-under-test"
    installed = pm.get_plugin("recursa")       # an installed llm-recursa would answer instead
    if installed is not None:
        pm.unregister(name="recursa")
    pm.register(plugin, name=name)

    def run(*args: str, ok: bool = True) -> Result:
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        if ok:
            assert r.exit_code == 0, r.stderr
        return r
    try:
        yield run
    finally:
        pm.unregister(name=name)
        if installed is not None:
            pm.register(installed, name="recursa")


def script(tmp_path: Path, replies: list[str], name: str = "s.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"cycle": replies}))
    return f"replay-file:{p}"


def last_log(run_llm: Any) -> dict[str, Any]:
    return json.loads(run_llm("logs", "-n", "1", "--json").stdout)[0]


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    p = tmp_path / "report.txt"
    p.write_text("Pump 7 failed at 03:12 after the valve stuck.\n" * 4)
    return p


def test_progress_goes_to_stderr_never_into_the_answer(run_llm, tmp_path: Path, doc: Path) -> None:
    spec = script(tmp_path, ["```repl\nprint(len(context))\n```", DESCRIBE])
    base = ("-m", "recursa", "-o", "model", spec, "-o", "sandbox", "inprocess",
            "How long is it?", "-f", str(doc))
    r = run_llm(*base, "-o", "progress", "true", "-o", "max_iterations", "5")
    assert r.stdout == "str of 184 chars\n"                  # the answer, and nothing else
    assert "turn 1: 1 code block(s)" in r.stderr and "turn 2: 1 code block(s)" in r.stderr
    assert "mode: code (auto: the root is a large model)" in r.stderr
    end = r.stderr.splitlines()[-1]
    assert end.startswith("recursa: status final  turns 2  sub-calls 0  tokens ")
    assert "cost $0.0000" in end          # a scripted model is free; an unpriced one says "cost ?"
    # click's runner gives no terminal: without the option, no progress
    quiet = run_llm(*base)
    assert quiet.stdout == r.stdout and quiet.stderr == ""
    assert run_llm(*base, "-o", "progress", "false").stderr == ""
    # llm's stored default options for the model id apply too
    run_llm("models", "options", "set", "recursa", "progress", "true")
    assert "turn 1: 1 code block(s)" in run_llm(*base).stderr


def test_progress_follows_the_terminal(tmp_path: Path) -> None:
    read_end, write_end = os.openpty()
    with open(write_end, "w") as tty, open(tmp_path / "log", "w") as log:
        assert plugin.wants_progress(None, tty) and not plugin.wants_progress(None, log)
        assert not plugin.wants_progress(False, tty) and plugin.wants_progress(True, log)
    os.close(read_end)


def test_the_status_line_shows_a_maps_progress_and_spend(tmp_path: Path) -> None:
    """The view the plugin shows (recursa run's, for a stream that is not a terminal): a map's
    done/total in the status line it repeats while the run works."""
    from recursa.base.types import Event
    out = tmp_path / "progress.txt"
    with open(out, "w") as stream:
        view = plugin.progress_view(True, stream, {"max_cost_usd": 0.5, "model": "x"})
        view.emit(Event(kind="combinator", phase="start", id="m1", data={"op": "llm_map",
                                                                          "items": 48}))
        view.emit(Event(kind="combinator", phase="update", id="m1",
                        data={"done": 26, "total": 48}))
        assert "llm_map 26/48 done" in view.summary() and "cost $0.0000 / $0.50" in view.summary()
        view.close()
    # the heartbeat thread was joined, not left running
    assert not [t for t in threading.enumerate() if t.name == "recursa-console-heartbeat"]


def test_strategy_route_and_sources_reach_the_run(run_llm, tmp_path: Path, doc: Path) -> None:
    base = ("-m", "recursa", "-o", "sandbox", "inprocess", "-f", str(doc))
    spec = script(tmp_path, [DESCRIBE])
    planned = run_llm(*base, "-o", "model", spec, "-o", "strategy", "plan", "-o", "progress",
                      "true", "Length?")
    assert "mode: plan (asked for)" in planned.stderr

    direct = script(tmp_path, ["It was pump 7."], "direct.json")
    r = run_llm(*base, "-o", "model", direct, "-o", "route", "direct", "Which pump failed?")
    assert r.stdout.strip() == "It was pump 7."
    assert last_log(run_llm)["response_json"]["route"] == "direct"

    quoting = script(tmp_path, ["```repl\nFINAL('Pump 7', sources=['Pump 7 failed at 03:12'])"
                                "\n```"], "quoting.json")
    plain = run_llm(*base, "-o", "model", quoting, "Which pump failed?")
    assert plain.stdout == "Pump 7\n"
    cited = run_llm(*base, "-o", "model", quoting, "-o", "sources", "true", "Which pump?")
    assert cited.stdout.startswith("Pump 7\n\nSources:\n[1] ")
    assert "Pump 7 failed at 03:12" in cited.stdout
    rj = last_log(run_llm)["response_json"]
    assert rj["sources_verified"] is True and rj["sources"][0]["found"] is True


def test_a_price_makes_a_cost_limit_usable(run_llm, tmp_path: Path, doc: Path) -> None:
    """An OpenAI-compatible server recursa knows no price for: -o max_cost is refused in llm's
    terms until -o price gives one, and then the run's cost is counted at that price."""
    reply = "```repl\nFINAL('pump 7')\n```"
    with OpenAITestServer(responder=lambda req: reply) as srv:
        base = ("-m", "recursa", "-o", "model", "openai:test-model", "-o", "base_url",
                srv.base_url, "-o", "sandbox", "inprocess", "Which pump?", "-f", str(doc))
        unpriced = run_llm(*base, "-o", "progress", "true")      # no cost limit: it runs
        assert unpriced.stdout.strip() == "pump 7"
        assert "cost ?" in unpriced.stderr and "give one with -o price IN/OUT" in unpriced.stderr
        base += ("-o", "max_cost", "0.5")
        srv.reset()
        refused = run_llm(*base, ok=False)
        assert refused.exit_code != 0 and srv.request_count == 0
        assert "no price for openai:test-model" in refused.stderr
        assert "-o price IN/OUT" in refused.stderr and "RLM(" not in refused.stderr
        r = run_llm(*base, "-o", "price", "2/8")
        assert r.stdout.strip() == "pump 7"
    log = last_log(run_llm)
    want = (log["input_tokens"] * 2 + log["output_tokens"] * 8) / 1e6
    assert log["response_json"]["cost_usd"] == pytest.approx(want) and want > 0


BAD_VALUES = (("strategy", "fast", "'auto', 'code' or 'plan'"),
              ("route", "sometimes", "'rlm', 'direct' or 'auto'"),
              ("price", "cheap", "expected IN/OUT in USD per 1M tokens, e.g. 0.5/1.5"),
              ("price", "1/-2", "two prices >= 0"),
              ("price", "1/2,", "expected IN/OUT"),
              ("progress", "loud", "valid boolean"),
              ("route_threshold", "0", "greater than or equal to 1"))


def test_bad_option_values_get_clear_errors(run_llm, doc: Path) -> None:
    import pydantic
    for option, value, words in BAD_VALUES:
        with pytest.raises(pydantic.ValidationError, match=option) as e:
            plugin.RecursaModel.Options(**{option: value})
        assert words in str(e.value), (option, str(e.value))
    # as llm shows them (each invocation lists every registered model: ~0.3 s)
    for option, value, words in BAD_VALUES[::3]:
        r = run_llm("-m", "recursa", "hi", "-f", str(doc), "-o", option, value, ok=False)
        assert r.exit_code != 0 and f"Error: {option}\n" in r.stderr and words in r.stderr


def test_recursas_default_model_aliases_and_keys_apply(run_llm, tmp_path: Path,
                                                       doc: Path) -> None:
    """recursa's settings file (recursa models default / aliases / keys) works through llm."""
    default = script(tmp_path, ["```repl\nFINAL('from the default model')\n```"], "d.json")
    aliased = script(tmp_path, ["```repl\nFINAL('from the alias')\n```"], "a.json")
    config = tmp_path / "config" / "recursa" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'default_model = "{default}"\n[aliases]\nmine = "{aliased}"\n'
                      '[keys]\nopenrouter = "sk-from-recursa"\n')
    config.chmod(0o600)
    base = ("-o", "sandbox", "inprocess", "Who answers?", "-f", str(doc))
    assert run_llm("-m", "recursa", *base).stdout.strip() == "from the default model"
    assert run_llm("-m", "recursa", "-o", "model", "mine", *base).stdout.strip() == \
        "from the alias"
    said = run_llm("-m", "recursa", *base, "-o", "progress", "true").stderr
    assert f"no -o model given: using {default} (the default model set in {config})" in said
    # a provider key stored with `recursa keys set` goes to that provider's requests
    with OpenAITestServer(responder=lambda req: "```repl\nFINAL('ok')\n```") as srv:
        r = run_llm("-m", "recursa", "-o", "model", "openrouter:some/model", "-o", "base_url",
                    srv.base_url, *base)
        assert r.stdout.strip() == "ok"
        assert srv.headers[0].get("authorization") == "Bearer sk-from-recursa"


def test_a_key_stored_in_llm_picks_the_default_model(run_llm, tmp_path: Path) -> None:
    from recursa.models import DEFAULT_LOCAL, DEFAULT_OPENAI
    assert plugin.root_spec(None)[0] == DEFAULT_LOCAL
    (tmp_path / "llm-home" / "keys.json").write_text(json.dumps({"openai": "sk-in-llm"}))
    assert plugin.root_spec(None) == (DEFAULT_OPENAI, "a key for openai is stored in llm")
    assert plugin.root_spec("local:smollm2-135m")[0] == "local:smollm2-135m"
