"""A real third-party program against a real `recursa serve` process: Simon Willison's `llm`
CLI (PyPI `llm`, in the dev extra), configured through its documented
`extra-openai-models.yaml` to use the server as an OpenAI-compatible model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import recursa_serve

pytestmark = pytest.mark.slow

KEY = "llm-cli-test-key"


def llm_binary() -> str | None:
    beside = Path(sys.executable).with_name("llm")   # installed into the same venv
    return os.environ.get("RECURSA_TEST_LLM") or (str(beside) if beside.exists() else None) \
        or shutil.which("llm")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`recursa serve` (the real command) with the test-only scripted model."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"cycle": [
        "```repl\nprint('looking')\n```",
        "```repl\nFINAL('context has ' + str(len(context)) + ' chars')\n```"]}))
    with recursa_serve("--model", f"replay-file:{script}", "--sandbox", "inprocess",
                       "--api-key", KEY, "--log-level", "warning", start_timeout=20) as (base, _):
        yield base, tmp_path


def run_llm(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = llm_binary()
    assert exe is not None
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    return subprocess.run([exe, *args], env=env, input=stdin, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(llm_binary() is None, reason="the `llm` CLI is not installed (dev extra)")
def test_llm_cli_uses_recursa_serve(served: tuple[str, Path]) -> None:
    base, tmp = served
    home = tmp / "llm-home"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: recursa\n  model_name: recursa\n  api_base: "{base}/v1"\n'
        "  api_key_name: recursa\n")
    assert run_llm(home, "keys", "set", "recursa", "--value", KEY).returncode == 0

    # Streaming (llm's default): progress chunks must not disturb it.
    r = run_llm(home, "-m", "recursa", "How many characters?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "context has 20 chars"

    # Non-streaming, with a document as the system prompt: it is the RLM's context, as is.
    doc = "\n".join(str(i) for i in range(1, 501))
    r = run_llm(home, "-m", "recursa", "--no-stream", "-s", doc, "What is the sum?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"context has {len(doc)} chars"

    logged = json.loads(run_llm(home, "logs", "-n", "1", "--json").stdout)[0]
    assert logged["input_tokens"] > 0 and logged["output_tokens"] > 0

    # The wrong key is refused, and llm says so.
    assert run_llm(home, "keys", "set", "recursa", "--value", "wrong").returncode == 0
    r = run_llm(home, "-m", "recursa", "--no-stream", "hi")
    assert r.returncode != 0
    assert "Incorrect API key" in r.stderr + r.stdout
