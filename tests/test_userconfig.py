"""The user's settings file (recursa.models.userconfig): written 0600, keys refused from a file
others can read, aliases and the default model resolved for `recursa run` (through the one
`resolve_model`), the environment winning over the file, and the `models default`, `aliases`
and `keys` commands. Each test has its own XDG_CONFIG_HOME; no real model server."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from openai_testserver import OpenAITestServer
from recursa.cli import main
from recursa.models import make_client, resolve_model
from recursa.models.userconfig import (
    ConfigError,
    UserConfig,
    config_path,
    load,
    save,
)

SECRET = "sk-stored-5d1e0c77-do-not-show"
FINAL = "```repl\nFINAL('from the ' + 'scripted server')\n```"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    for name in ("RECURSA_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY",
                 "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_is_written_0600_and_reads_back_whatever_the_text(home):
    os.umask(0o022)
    tricky = 'a "quoted" \\ back\nslash\ttab \x7f é 😀'
    cfg = UserConfig(default_model="ollama:llama3.2", aliases={"fast": "openai:gpt-5-mini",
                                                               "odd.name": tricky},
                     keys={"openai": SECRET})
    path = save(cfg)
    assert path == config_path() == home / "cfg" / "recursa" / "config.toml"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert tomllib.loads(path.read_text())["aliases"]["odd.name"] == tricky
    back = load(keys=True)
    assert back.aliases == cfg.aliases and back.keys == cfg.keys
    assert back.default_model == "ollama:llama3.2" and back.key_names == ("openai",)
    assert SECRET not in repr(back) and SECRET not in str(back)
    path.chmod(0o644)                   # an older file others could read: rewritten private
    save(back)
    assert mode(path) == 0o600
    assert not list(path.parent.glob(".*tmp"))             # no temporary file left behind


def test_keys_are_refused_from_a_file_others_can_read(home, capsys):
    path = save(UserConfig(aliases={"fast": "openai:gpt-5-mini"}, keys={"openai": SECRET}))
    path.chmod(0o644)
    with pytest.raises(ConfigError) as ei:
        load(keys=True)
    msg = str(ei.value)
    assert str(path) in msg and f"chmod 600 {path}" in msg and "0644" in msg
    assert SECRET not in msg
    assert load().aliases == {"fast": "openai:gpt-5-mini"}      # the rest is still read
    with pytest.raises(ConfigError, match="chmod 600"):
        make_client("openai:gpt-5-mini")                        # the key is not used
    ctx = home / "doc.txt"
    ctx.write_text("text")
    assert main(["run", "q", "--context", str(ctx), "--model", "fast"]) == 2
    err = capsys.readouterr().err
    assert "chmod 600" in err and SECRET not in err
    path.chmod(0o600)
    client = make_client("openai:gpt-5-mini")
    assert SECRET not in repr(client)


def test_a_malformed_file_is_an_error_naming_it(home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("default_model = ollama:llama3.2\n")       # not quoted: not TOML
    with pytest.raises(ConfigError, match=f"{path}: not a valid TOML file"):
        resolve_model(None)
    path.write_text("[aliases]\nfast = 3\n")
    with pytest.raises(ConfigError, match=r"\[aliases\] must be a table"):
        resolve_model("fast")


async def test_a_stored_key_is_used_and_the_variable_wins_over_it(home, monkeypatch):
    save(UserConfig(keys={"openrouter": SECRET, "openai": SECRET}))
    with OpenAITestServer() as srv:
        clients = [make_client("openrouter:m", base_url=srv.base_url),
                   make_client("openai:m", base_url=srv.base_url)]   # a server of one's own
        monkeypatch.setenv("OPENROUTER_API_KEY", "sk-from-the-env")
        clients.append(make_client("openrouter:m", base_url=srv.base_url))
        for c in clients:
            await c.complete([{"role": "user", "content": "hi"}])
            await c.aclose()
            assert SECRET not in repr(c)
        sent = [h["authorization"] for h in srv.headers]
    # the stored OpenRouter key goes to OpenRouter's client; the OpenAI key only ever to
    # api.openai.com, never to a base_url elsewhere; the variable wins over the file
    assert sent == [f"Bearer {SECRET}", "Bearer EMPTY", "Bearer sk-from-the-env"]


def test_the_default_model_comes_from_the_environment_then_the_file_then_the_keys(
        home, monkeypatch):
    assert resolve_model(None)[0] == "local:qwen2.5-coder-1.5b"
    save(UserConfig(keys={"anthropic": SECRET}))
    assert resolve_model(None)[0] == "anthropic:claude-sonnet-4-5"     # a stored key
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert resolve_model(None)[0] == "openai:gpt-5-mini"               # the variable first
    save(UserConfig(default_model="mine", aliases={"mine": "ollama:llama3.2"}))
    spec, why = resolve_model(None)
    assert spec == "ollama:llama3.2" and str(config_path()) in why
    monkeypatch.setenv("RECURSA_MODEL", "lmstudio:other")
    assert resolve_model(None) == ("lmstudio:other", "RECURSA_MODEL is set")
    assert resolve_model("mine") == ("ollama:llama3.2", "")           # named: no default
    assert resolve_model("openai:gpt-5") == ("openai:gpt-5", "")
    with pytest.raises(ValueError, match="no alias of that name"):
        make_client("nothing-of-that-name")


def test_run_resolves_the_default_and_aliases_and_the_variable_wins(home, monkeypatch, capsys):
    ctx = home / "doc.txt"
    ctx.write_text("some text")
    args = ["run", "Who answers?", "--context", str(ctx), "--sandbox", "inprocess", "-q"]
    with OpenAITestServer(responder=lambda _: FINAL) as srv:
        monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{srv.port}")
        assert main(["aliases", "set", "mine", "ollama:llama3.2"]) == 0
        assert main(["models", "default", "mine"]) == 0
        capsys.readouterr()
        assert main(args[:-1]) == 0                             # no --model: the default
        out = capsys.readouterr()
        assert out.out.strip() == "from the scripted server"
        assert "using ollama:llama3.2" in out.err
        assert main([*args, "--model", "mine"]) == 0            # an alias named
        monkeypatch.setenv("RECURSA_MODEL", "ollama:from-env")
        assert main(args) == 0                                  # the variable wins
        models = [r["model"] for r in srv.requests]
    assert models == ["llama3.2", "llama3.2", "from-env"]


def test_models_default_and_aliases_commands(home, capsys):
    assert main(["models", "default"]) == 0
    assert capsys.readouterr().out.strip() == "local:qwen2.5-coder-1.5b"
    assert main(["aliases", "set", "fast", "openai:gpt-5-mini"]) == 0
    assert main(["models", "default", "fast"]) == 0
    assert main(["models", "default"]) == 0
    assert capsys.readouterr().out.strip() == "openai:gpt-5-mini"
    assert main(["aliases", "list"]) == 0
    assert capsys.readouterr().out == "fast = openai:gpt-5-mini\n"
    for bad, why in ((["aliases", "set", "a:b", "openai:x"], "no ':'"),
                     (["aliases", "set", "faster", "fast"], "not a model spec"),
                     (["aliases", "set", "x", "nope:m"], "unknown prefix 'nope'"),
                     (["aliases", "remove", "nothing"], "no alias 'nothing'"),
                     (["models", "default", "unknown-name"], "no alias of that name")):
        assert main(bad) == 2, bad
        assert why in capsys.readouterr().err, bad
    assert main(["models", "default", "--unset"]) == 0
    assert main(["aliases", "remove", "fast"]) == 0
    assert load() == UserConfig()
    assert mode(config_path()) == 0o600


def test_keys_set_reads_stdin_and_nothing_ever_prints_a_key(home, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET + "\n"))
    assert main(["keys", "set", "openai"]) == 0
    assert load(keys=True).keys == {"openai": SECRET} and mode(config_path()) == 0o600
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert main(["keys", "list"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("openai") and "OPENAI_API_KEY is set" in out.out
    assert main(["models", "list", "--timeout", "0.2"]) == 0
    out2 = capsys.readouterr()
    assert SECRET not in out.out + out.err + out2.out + out2.err
    with pytest.raises(SystemExit) as ei:                   # never a key on the command line
        main(["keys", "set", "openai", SECRET])
    assert ei.value.code == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["keys", "set", "anthropic"]) == 2
    assert main(["keys", "set", "ollama"]) == 2             # it takes no key
    assert "recursa reads no key for it" in capsys.readouterr().err
    assert main(["keys", "remove", "openai"]) == 0
    assert load().key_names == ()


def scripted_models(home: Path) -> dict[str, str]:
    """Two scripted models (replay-file:) saying which one answered; the settings file makes
    one the default (through an alias) and names the other `other`."""
    specs = {}
    for name in ("default", "other"):
        script = home / f"{name}.json"
        script.write_text(json.dumps({"cycle": [f"```repl\nFINAL('from the {name} model')\n```"]}))
        specs[name] = f"replay-file:{script}"
    save(UserConfig(default_model="mine", aliases={"mine": specs["default"],
                                                   "other": specs["other"]}))
    return specs


def test_models_list_marks_the_default_model_and_the_aliases(home, capsys):
    save(UserConfig(default_model="tiny", aliases={"tiny": "local:smollm2-135m",
                                                   "small": "local:smollm2-135m",
                                                   "fast": "openai:gpt-5-mini"}))
    assert main(["models", "list", "--timeout", "0.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("smollm2-135m "))
    assert row.endswith("(default; aliases: small, tiny)"), row
    other = next(line for line in lines if line.startswith("qwen2.5-coder-1.5b "))
    assert "default" not in other and "aliases" not in other
    assert f"default model: local:smollm2-135m  (the default model set in {config_path()})" \
        in lines
    assert lines[-3:] == ["  fast = openai:gpt-5-mini", "  small = local:smollm2-135m",
                          "  tiny = local:smollm2-135m"]


def test_chat_uses_the_default_model_and_an_alias(home):
    scripted_models(home)
    ctx = home / "doc.txt"
    ctx.write_text("some text")
    env = {k: v for k, v in os.environ.items() if k != "RECURSA_MODEL"}
    for extra, said in (([], "from the default model"), (["--model", "other"],
                                                        "from the other model")):
        p = subprocess.run([sys.executable, "-m", "recursa.cli", "chat", "--context", str(ctx),
                            "--sandbox", "inprocess", *extra], input="Who answers?\n",
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == said, (p.stdout, p.stderr)


def test_serve_uses_the_default_model_and_an_alias(home):
    import httpx

    from serve_process import recursa_serve
    scripted_models(home)
    for extra, said in (([], "from the default model"), (["--model", "other"],
                                                        "from the other model")):
        with recursa_serve(*extra, "--sandbox", "inprocess", "--api-key", "k",
                           "--log-level", "warning") as (base, proc):
            r = httpx.post(base + "/v1/chat/completions", timeout=60,
                           headers={"authorization": "Bearer k"},
                           json={"model": "recursa",
                                 "messages": [{"role": "user", "content": "Who answers?"}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == said
