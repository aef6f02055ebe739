"""Explicit contracts: a client declares what it can do, and providers / sandbox kinds come from
registries another package adds to through entry points, without touching recursa.

The third-party package here is real as far as Python's packaging goes: a module and a
`.dist-info` directory (METADATA + entry_points.txt) on sys.path, which is what `pip install`
leaves; importlib.metadata finds its entry points as it would an installed wheel's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from recursa import RLM
from recursa.base.types import Capabilities, Completion, ModelClient, Pricing, Usage
from recursa.core.budget import Budget, Ledger
from recursa.core.dispatch import Dispatcher
from recursa.core.preflight import PreflightError, acheck, target_of_client
from recursa.models import make_client
from recursa.models.declared import UndeclaredClient, declared
from recursa.models.registry import PROVIDERS, provider
from recursa.obs.trace import Tracer
from recursa.sandbox.kinds import KINDS

SRC = Path(__file__).resolve().parents[1] / "src"

PLUGIN = '''
"""recursa-theirs: a model provider and a sandbox kind shipped outside recursa."""
import os

from recursa.models.registry import Provider
from recursa.base.types import Capabilities, Completion, Pricing, Usage


class TheirClient:
    """Answers every turn with code that commits the context's length and the model name."""

    def __init__(self, model, *, name, **options):
        self.name, self.model, self.options = name, model, options
        self.capabilities = Capabilities(context_window=4096, pricing=Pricing(per_call=0.001))

    async def complete(self, messages, **options):
        code = f"FINAL(str(len(context)) + ' chars, said {self.model}')"
        return Completion(text=f"```repl\\n{code}\\n```", cost_usd=0.001, model=self.model,
                          usage=Usage(input_tokens=10, output_tokens=5))

    async def aclose(self):
        pass


provider = Provider("theirs", TheirClient, "a third-party test provider", endpoint=False)


def make_box(**options):
    from recursa.sandbox.inprocess import InProcessSandbox
    mark = os.environ.get("RECURSA_THEIRS_MARK")
    if mark:
        with open(mark, "a") as f:
            f.write("box\\n")
    return InProcessSandbox(**options)
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`recursa-theirs` installed on sys.path: a module and its dist-info entry points."""
    root = tmp_path / "site"
    (root / "recursa_theirs").mkdir(parents=True)
    (root / "recursa_theirs" / "__init__.py").write_text(PLUGIN)
    info = root / "recursa_theirs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recursa-theirs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [recursa.providers]
        theirs = recursa_theirs:provider

        [recursa.sandboxes]
        mybox = recursa_theirs:make_box
        """))
    monkeypatch.syspath_prepend(str(root))
    PROVIDERS.refresh()
    KINDS.refresh()
    yield root
    PROVIDERS.refresh()
    KINDS.refresh()
    sys.modules.pop("recursa_theirs", None)


# ---------------------------------------------------------------- third-party providers
def test_an_entry_point_provider_is_a_model_spec_for_make_client_and_rlm(plugin_dir: Path):
    client = make_client("theirs:x", temperature=0)
    assert type(client).__name__ == "TheirClient" and client.name == "theirs:x"
    assert client.options == {"temperature": 0}         # the caller's options reach it
    res = RLM(model="theirs:x", sandbox="inprocess", max_cost_usd=1.0).completion(
        "How long is it?", context="abcdef")
    assert res.status == "final" and res.answer == "6 chars, said x"
    assert res.cost_usd == pytest.approx(0.001)          # priced by its declaration
    assert provider("THEIRS") is not None                # prefixes are case-insensitive
    box = RLM(model="theirs:y", sandbox="mybox").completion("How long?", context="abc")
    assert box.answer == "3 chars, said y"


def test_sandbox_kinds_from_packages_are_options_and_unknown_ones_are_plain_words(
        plugin_dir: Path, capsys: pytest.CaptureFixture[str]):
    import argparse

    from recursa.frontend.options import RLMOptions
    parser = argparse.ArgumentParser()
    RLMOptions.add_to(parser)
    assert parser.parse_args(["--sandbox", "mybox"]).sandbox == "mybox"
    with pytest.raises(SystemExit):
        parser.parse_args(["--sandbox", "nobox"])
    err = capsys.readouterr().err
    assert "unknown sandbox kind 'nobox'" in err and "daytona, mybox" in err


def test_an_entry_point_provider_works_from_the_command_line(plugin_dir: Path, tmp_path: Path):
    ctx = tmp_path / "doc.txt"
    ctx.write_text("x" * 42)
    mark = tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(plugin_dir)]),
           "RECURSA_THEIRS_MARK": str(mark)}
    p = subprocess.run([sys.executable, "-m", "recursa.cli", "run", "How long?", "--context",
                        str(ctx), "--model", "theirs:big", "--sandbox", "mybox",
                        "--max-cost", "0.5"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "42 chars, said big"
    assert mark.read_text() == "box\n"                   # the plugin's sandbox ran the code


def test_plugins_are_read_only_when_a_name_is_not_recursas_own(plugin_dir: Path):
    code = ("import sys\nfrom recursa.models import make_client\n"
            "from recursa.sandbox import make_sandbox\n"
            "make_client('replay:'), make_sandbox('inprocess')\n"
            "print('recursa_theirs' in sys.modules)\n"
            "make_client('theirs:x')\nprint('recursa_theirs' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(plugin_dir)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, check=True).stdout.split()
    assert out == ["False", "True"]


def test_an_unknown_prefix_lists_the_installed_ones(plugin_dir: Path):
    with pytest.raises(ValueError, match=r"unknown prefix 'nope'.*local:, replay:, theirs:"):
        make_client("nope:x")


def test_a_broken_plugin_is_named_in_the_error(plugin_dir: Path):
    (plugin_dir / "recursa_theirs-0.1.dist-info" / "entry_points.txt").write_text(
        "[recursa.providers]\nbroken = recursa_theirs:no_such_thing\n")
    PROVIDERS.refresh()
    with pytest.raises(ValueError, match=r"model provider 'broken'.*recursa-theirs.*cannot be "
                                         r"loaded"):
        make_client("broken:x")


# ---------------------------------------------------------------- declared capabilities
class Plain:
    """A client that declares nothing beyond the defaults: no window, no streaming, no tools,
    no price. Its `astream` must never be called: it does not declare streaming."""

    name = "plain:m"

    def __init__(self) -> None:
        self.capabilities = Capabilities()
        self.calls = 0

    async def complete(self, messages: list[Any], **options: Any) -> Completion:
        self.calls += 1
        return Completion(text="ok", usage=Usage(input_tokens=1, output_tokens=1))

    async def astream(self, messages: list[Any], on_delta: Any, **options: Any) -> Completion:
        raise AssertionError("astream called on a client that does not declare streaming")

    async def aclose(self) -> None:
        pass


def test_a_client_without_streaming_is_called_with_complete_even_when_deltas_are_wanted():
    client = Plain()
    disp = Dispatcher(ledger=Ledger(Budget()), tracer=Tracer([]), sub_client=client,
                      clients={})
    pieces: list[str] = []
    comp = asyncio.run(disp.call_model(client, [{"role": "user", "content": "hi"}],
                                       role="sub", subcall=True,
                                       on_delta=lambda p, o: pieces.append(p)))
    assert comp.text == "ok" and client.calls == 1 and pieces == []


def test_a_client_without_a_price_is_refused_a_cost_cap_in_plain_words():
    target = target_of_client(Plain())
    assert target.price is None and target.endpoint is None
    with pytest.raises(PreflightError, match="knows no price for plain:m"):
        asyncio.run(acheck([target], max_cost_usd=1.0, sandbox="inprocess"))
    priced = Plain()
    priced.capabilities = Capabilities(pricing=Pricing(reported=True))
    asyncio.run(acheck([target_of_client(priced)], max_cost_usd=1.0, sandbox="inprocess"))


def test_a_client_without_tools_gets_the_text_protocol_and_no_window_means_no_compaction():
    from recursa.base.types import context_window
    from recursa.core.combinators import window_of
    assert context_window(Plain()) is None and window_of(Plain()) > 0
    assert isinstance(Plain(), ModelClient)


def test_an_old_style_client_is_read_once_at_the_door_with_a_deprecation_warning():
    class Old:
        name = "old:m"
        context_window = 2048
        supports_tools = True

        def estimate_cost(self, i: int, o: int) -> float:
            return 0.5

        async def complete(self, messages: list[Any], **options: Any) -> Completion:
            return Completion(text="ok")

        async def astream(self, messages: list[Any], on_delta: Any,
                          **options: Any) -> Completion:
            on_delta("ok", 0)
            return Completion(text="ok")

        async def aclose(self) -> None:
            pass

    with pytest.warns(DeprecationWarning, match="Old declares no `capabilities`"):
        c = declared(Old())
    assert isinstance(c, UndeclaredClient) and isinstance(c, ModelClient)
    caps = c.capabilities
    assert (caps.context_window, caps.tools, caps.streaming) == (2048, True, True)
    from recursa.models.pricing import estimate, status
    assert estimate(caps.pricing, 10, 10) == 0.5 and status(caps.pricing) == "known"
    assert declared(c) is c                                 # declared once
    with pytest.raises(TypeError, match="not a model client: it has no complete"):
        declared(type("NoClient", (), {"name": "x", "aclose": None})())


def test_cache_identity_of_recursas_clients_keeps_its_shape(tmp_path: Path):
    # response-cache keys depend on it: the declaration gives what the attributes gave
    c = make_client("local:" + str(tmp_path / "m.gguf"), default_options={"seed": 1})
    assert c.capabilities.identity == {"name": f"local:{tmp_path / 'm.gguf'}",
                                       "model": str(tmp_path / "m.gguf"), "base_url": None,
                                       "defaults": {"seed": 1}}
    assert c.capabilities.context_window == 8192 and c.capabilities.structured == "json_schema"
    assert json.dumps(c.capabilities.identity)
