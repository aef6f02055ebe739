"""The provider kit as a plugin meets it. docs/providers.md shows a plugin's two files: the
example adapter (`recursa_theirs/client.py`: `TheirWire` and its `build`) and its test file
(`tests/test_conformance.py`: a fake of its wire and a `ProviderConformance` class). Both are
run here as written on that page: in this process, the provider registered through the public
`register_provider`; and as an installed plugin (its entry point found by importlib.metadata)
in a pytest of its own. One adapter file plus one registration passes the suite unchanged.
And the kit stays out of `import recursa`: only tests that import the kit load pytest."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recursa.models import register_provider
from recursa.models.registry import PROVIDERS, Provider
from recursa.testing.wire import WireFake

DOCS = Path(__file__).resolve().parent.parent / "docs" / "providers.md"
ADAPTER, TESTS = "recursa_theirs/client.py", "tests/test_conformance.py of recursa-theirs"


def docs_block(first_line: str) -> str:
    """The one ```python block of docs/providers.md that starts with `# first_line`."""
    blocks = re.findall(rf"```python\n(# {re.escape(first_line)}\n.*?)```", DOCS.read_text(),
                        re.S)
    assert len(blocks) == 1, f"docs/providers.md has {len(blocks)} blocks '# {first_line}'"
    return blocks[0]


def docs_module(first_line: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(docs_block(first_line), str(DOCS), "exec"), module.__dict__)
    return module


PLUGIN_TESTS = docs_module(TESTS, "test_conformance")


class TestTheDocsExample(PLUGIN_TESTS.TestTheirProvider):
    """The docs' test class over the docs' adapter, registered as its entry point would."""

    @pytest.fixture(autouse=True)
    def _registered(self) -> Iterator[None]:
        adapter = docs_module(ADAPTER, "recursa_theirs.client")
        register_provider(Provider("theirs", adapter.build, example="their-model-1"),
                          replace=True)
        yield
        PROVIDERS.unregister("theirs")


@pytest.mark.slow     # ~3 s: a pytest of its own that imports recursa and runs the 10 checks
def test_the_docs_plugin_passes_the_kit_installed_in_a_pytest_of_its_own(tmp_path) -> None:
    site = tmp_path / "site"
    (site / "recursa_theirs").mkdir(parents=True)
    (site / "recursa_theirs" / "client.py").write_text(docs_block(ADAPTER))
    (site / "recursa_theirs" / "__init__.py").write_text(
        "from recursa.models.providers import Provider\n"
        "provider = Provider('theirs', 'recursa_theirs.client:build', example='their-model-1')\n")
    info = site / "recursa_theirs-0.1.dist-info"      # what `pip install` would leave
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recursa-theirs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[recursa.providers]\ntheirs = recursa_theirs:provider\n")
    plugin = tmp_path / "recursa-theirs"
    (plugin / "tests").mkdir(parents=True)
    (plugin / "tests" / "test_conformance.py").write_text(docs_block(TESTS))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:asyncio", "-p", "no:cacheprovider",
         "-p", "no:xdist", "tests/test_conformance.py"],
        cwd=plugin, env={**_env(), "PYTHONPATH": str(site)}, capture_output=True,
        text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert re.search(r"\b9 passed, 1 skipped\b", out.stdout), out.stdout[-2000:]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}


def test_an_unknown_path_gets_a_404_naming_it_and_the_remedy() -> None:
    async def ask() -> Any:
        async with next(WireFake().http_clients()) as http:
            return await http.post("http://provider.test/v1/elsewhere", json={})

    r = asyncio.run(ask())
    assert r.status_code == 404 and "no fake wire serves /v1/elsewhere" in r.text


def test_importing_recursa_imports_no_pytest() -> None:
    """`import recursa` (and its public names, and the fake wire) loads no pytest: only the
    kit's suite module imports it, and nothing in recursa imports that."""
    code = ("import recursa, recursa.testing.wire\nfrom recursa import RLM\n"
            "RLM(model='replay:x', sandbox='inprocess')\n")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, timeout=120, check=True)
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
              if line.startswith("import time:")}
    assert "recursa.testing.wire" in loaded and "recursa.core.loop" in loaded   # (they ran)
    assert not {m for m in loaded if m.split(".")[0] in ("pytest", "_pytest")}
