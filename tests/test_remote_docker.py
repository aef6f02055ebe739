"""sandbox="docker": the exact `docker run` argv, staging, clear errors without an engine, and
the sandbox on a real engine (the `needs_docker` tests: dockerd and the image that
scripts/docker-sandbox.sh builds offline; `make test` starts and builds both). The attacks
on the real engine are in test_attack_docker.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from helpers_docker import DEFAULT_IMAGE, IMAGE, containers, docker_sandbox, needs_docker
from helpers_sandbox import Recorder
from helpers_scripted import repl, root_script
from recursa import RLM
from recursa.base.types import ContextPayload, SandboxError
from recursa.models.replay import ReplayClient
from recursa.sandbox.remote import RemoteSandbox, make_remote_sandbox
from recursa.sandbox.remote.docker import (
    DockerLauncher,
    DockerTransport,
    _owner_options,
    _stage,
)


def payload_for(tmp_path: Path) -> ContextPayload:
    path = tmp_path / "context.txt"
    path.write_text("hello", encoding="utf-8")
    raw = path.read_bytes()
    return ContextPayload(path=str(path), kind="text", sha256=hashlib.sha256(raw).hexdigest(),
                          size_bytes=len(raw))


async def handler(kind: str, args: dict) -> str:
    return "x"


def test_run_argv_is_locked_down() -> None:
    d = DockerLauncher("python:3.12-slim", memory_mb=2048, cpus=1.5, pids_limit=64,
                       tmp_mb=128, workspace_mb=512)
    d.stage = "/tmp/recursa-docker-x"
    argv = d.run_argv("recursa-abc-0")
    s = " ".join(argv)
    assert argv[:5] == ["docker", "run", "-i", "--rm", "--name"] and argv[5] == "recursa-abc-0"
    assert "-t" not in argv and "--tty" not in argv          # a TTY would mangle the bytes
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--network", "none") in pairs
    assert "--read-only" in argv
    assert ("--cap-drop", "ALL") in pairs
    assert ("--security-opt", "no-new-privileges") in pairs
    assert ("--pids-limit", "64") in pairs
    assert ("--memory", "2048m") in pairs and ("--memory-swap", "2048m") in pairs
    assert ("--cpus", "1.5") in pairs
    assert ("--user", "65534:65534") in pairs
    assert ("--pull", "never") in pairs
    assert ("--tmpfs", "/tmp:rw,nosuid,nodev,size=128m,mode=1777") in pairs
    # owned by the container's uid: --workdir resets the directory to 0755 root
    assert ("--tmpfs", "/workspace:rw,nosuid,nodev,size=512m,mode=1777,uid=65534,gid=65534") \
        in pairs
    assert ("--workdir", "/workspace") in pairs
    for name in ("worker.py", "supervisor.py", "context"):
        assert ("--mount", f"type=bind,source=/tmp/recursa-docker-x/{name},"
                           f"target=/recursa/{name},readonly") in pairs
    assert argv[-5:] == ["python:3.12-slim", "python3", "-I", "-S", "/recursa/worker.py"]
    # no host environment reaches the container: only these fixed variables
    envs = [b for a, b in pairs if a == "--env"]
    assert envs == ["HOME=/workspace", "TMPDIR=/tmp", "LANG=C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"]
    assert "-v" not in argv and "/var/run/docker.sock" not in s


def test_run_argv_volume_upload_and_limits() -> None:
    d = DockerLauncher("img:1", upload="volume", memory_mb=None, pids_limit=None, user=None,
                       limits='{"cpu": 60}', extra_args=["--runtime", "runsc"])
    d.volume = "recursa-vol"
    argv = d.run_argv("n")
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--mount", "type=volume,source=recursa-vol,target=/recursa,readonly") in pairs
    assert "--memory" not in argv and "--pids-limit" not in argv and "--user" not in argv
    assert ("--tmpfs", "/workspace:rw,nosuid,nodev,size=1024m,mode=1777") in pairs
    assert _owner_options("1000") == ",uid=1000" and _owner_options("nobody:65534") == \
        ",gid=65534"
    assert ("--runtime", "runsc") in pairs
    assert argv[-7:] == ["img:1", "python3", "-I", "-S", "/recursa/worker.py", "--limits",
                         '{"cpu": 60}']
    with pytest.raises(ValueError):
        DockerLauncher(upload="scp")  # type: ignore[arg-type]


def test_transport_names_are_unique_and_tracked() -> None:
    d = DockerLauncher()
    d.stage = "/s"
    t1, t2 = d.transport(), d.transport()
    assert isinstance(t1, DockerTransport) and t1.name != t2.name
    assert t1.argv[t1.argv.index("--name") + 1] == t1.name
    assert d._names == [t1.name, t2.name]


def test_stage_copies_files_readable_for_the_container_user(tmp_path: Path) -> None:
    src = tmp_path / "ctx"
    src.write_text("secret-ish")
    src.chmod(0o600)
    stage = _stage({"context": str(src)})
    try:
        copied = Path(stage) / "context"
        assert copied.read_text() == "secret-ish"
        assert stat.S_IMODE(copied.stat().st_mode) == 0o644
        assert stat.S_IMODE(os.stat(stage).st_mode) == 0o700
    finally:
        shutil.rmtree(stage)


async def test_missing_docker_cli_is_a_clear_error(tmp_path: Path) -> None:
    sb = make_remote_sandbox("docker", docker="no-such-docker-cli")
    with pytest.raises(SandboxError, match="needs the docker CLI.*not on PATH"):
        await sb.start(payload_for(tmp_path), handler)


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The docker CLI pointed at a socket where no engine answers (a real one may run here)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
async def test_cli_without_engine_is_a_clear_error(tmp_path: Path, no_engine: None) -> None:
    from recursa.sandbox.remote import RemoteSandbox

    launcher = DockerLauncher()
    sb = RemoteSandbox(launcher)
    with pytest.raises(SandboxError) as info:
        await asyncio.wait_for(sb.start(payload_for(tmp_path), handler), 60)
    msg = str(info.value)
    assert "no Docker engine answers" in msg and "DOCKER_HOST" in msg
    assert launcher.stage is None   # nothing was staged before the engine check


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
async def test_docker_run_without_engine_reports_the_cli_error(tmp_path: Path,
                                                               no_engine: None) -> None:
    """If the engine goes away after the check, the worker's start fails with docker's own
    words, not a hang."""
    from recursa.sandbox.session import WorkerSession

    d = DockerLauncher()
    d.stage = str(tmp_path)
    session = WorkerSession(d.transport, context_path="/recursa/context", kind="text",
                            handler=handler, start_timeout=60)
    with pytest.raises(SandboxError) as info:
        await session.start()
    msg = str(info.value)
    assert "did not start" in msg
    assert "docker" in msg.lower() and ("daemon" in msg.lower() or "125" in msg), msg


# ------------------------------------------------------------------ on a real engine
def test_the_image_script_builds_the_tag_the_tests_use() -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "docker-sandbox.sh"
    m = re.search(r"IMAGE=\$\{RECURSA_DOCKER_IMAGE:-([^}]+)\}", script.read_text())
    assert m and m.group(1) == DEFAULT_IMAGE


def launcher_of(sb: object) -> DockerLauncher:
    assert isinstance(sb, RemoteSandbox) and isinstance(sb.launcher, DockerLauncher)
    return sb.launcher


@needs_docker
@pytest.mark.parametrize("upload", ["bind", "volume"])
async def test_real_engine_cells_sub_calls_and_cleanup(tmp_path: Path, upload: str) -> None:
    sb = docker_sandbox(upload=upload)
    launcher = launcher_of(sb)
    rec = Recorder()
    await sb.start(payload_for(tmp_path), rec)
    try:
        cell = await sb.run("import os\nprint(len(context), llm_query('hi'), os.getuid(), "
                            "os.getgid(), os.getcwd())\n"
                            "open('out.txt', 'w').write('kept')\n"
                            "open('/tmp/t', 'w').write('ok')", timeout=30, max_output_chars=1000)
        assert cell.error is None, cell.error
        assert cell.stdout.split() == ["5", "LLM[hi]", "65534", "65534", "/workspace"]
        cell = await sb.run("print(open('out.txt').read())", timeout=30, max_output_chars=1000)
        assert cell.stdout.strip() == "kept"      # the workspace is the worker's to write
        assert rec.calls[0][0] == "llm"
        cell = await sb.run("x = llm_batch(['a', 'b'])\nx", timeout=30, max_output_chars=1000)
        assert cell.value == "['LLM[a]', 'LLM[b]']"
        assert len(containers(launcher.id)) == 1          # one incarnation so far
        if upload == "volume":
            assert launcher.volume and launcher.stage is None
    finally:
        await sb.close()
    assert containers(launcher.id) == []
    if upload == "volume":
        r = subprocess.run(["docker", "volume", "ls", "-q", "--filter",
                            f"name=recursa-{launcher.id}"], capture_output=True, text=True)
        assert r.stdout.strip() == ""
    assert launcher.stage is None


@needs_docker
@pytest.mark.slow
async def test_real_engine_restarts_a_timed_out_or_dead_worker(tmp_path: Path) -> None:
    """A busy cell past its timeout and a worker that exits: each time the container is
    removed and a new one started, `context` is there again, the lost variables named."""
    sb = docker_sandbox(interrupt_grace=0.5)
    launcher = launcher_of(sb)
    await sb.start(payload_for(tmp_path), handler)
    try:
        await sb.run("keep = 1", timeout=30, max_output_chars=1000)
        cell = await sb.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                            "while True: pass", timeout=1.0, max_output_chars=1000)
        assert cell.timed_out and cell.restarted and cell.lost_variables == ["keep"]
        cell = await sb.run("print(context)", timeout=30, max_output_chars=1000)
        assert cell.stdout.strip() == "hello"
        cell = await sb.run("import os\nos._exit(3)", timeout=30, max_output_chars=1000)
        assert cell.restarted and "died" in (cell.error or ""), cell.error
        cell = await sb.run("print(context)", timeout=30, max_output_chars=1000)
        assert cell.stdout.strip() == "hello"
        assert len(launcher._names) == 3                 # three incarnations
        assert len(containers(launcher.id)) == 1          # the old ones are gone
    finally:
        await sb.close()
    assert containers(launcher.id) == []


@needs_docker
async def test_real_engine_missing_image_without_pull_is_a_clear_error(tmp_path: Path) -> None:
    sb = make_remote_sandbox("docker", image="recursa-no-such-image:0", pull=False)
    with pytest.raises(SandboxError, match="is not present and pull=False"):
        await sb.start(payload_for(tmp_path), handler)


@needs_docker
def test_rlm_answers_through_the_docker_sandbox(tmp_path: Path) -> None:
    code = ("import os\nn = len(context.split())\nr = llm_query('name the colour')\n"
            "FINAL(f'{n} words, {r}, uid {os.getuid()}')")
    client = ReplayClient(root_script(repl(code), sub="blue"))
    rlm = RLM(model=client, sandbox="docker", cell_timeout=30,
              sandbox_options={"image": IMAGE, "pull": False}, trace_path=tmp_path / "t.jsonl")
    res = rlm.completion("How many words?", context="one two three")
    assert res.status == "final", (res.status, res.error)
    assert res.answer == "3 words, blue, uid 65534"
    assert res.subcalls == 1
