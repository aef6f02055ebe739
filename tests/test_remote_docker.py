"""sandbox="docker": the exact `docker run` argv, staging, and clear errors without an engine.

Running containers is not tested here (this machine has the docker CLI but no engine); see
docs/remote.md for the steps that try it for real.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from recursa.base.types import ContextPayload, SandboxError
from recursa.sandbox.remote import make_remote_sandbox
from recursa.sandbox.remote.docker import DockerLauncher, DockerTransport, _stage


def payload_for(tmp_path: Path) -> ContextPayload:
    path = tmp_path / "context.txt"
    path.write_text("hello", encoding="utf-8")
    raw = path.read_bytes()
    return ContextPayload(path=str(path), kind="text", sha256=hashlib.sha256(raw).hexdigest(),
                          size_bytes=len(raw))


async def handler(kind: str, args: dict) -> str:
    return "x"


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        r = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and bool(r.stdout.strip())


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
    assert ("--tmpfs", "/workspace:rw,nosuid,nodev,size=512m,mode=1777") in pairs
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


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
@pytest.mark.skipif(engine_answers(), reason="a Docker engine answers here")
async def test_cli_without_engine_is_a_clear_error(tmp_path: Path) -> None:
    from recursa.sandbox.remote import RemoteSandbox

    launcher = DockerLauncher()
    sb = RemoteSandbox(launcher)
    with pytest.raises(SandboxError) as info:
        await asyncio.wait_for(sb.start(payload_for(tmp_path), handler), 60)
    msg = str(info.value)
    assert "no Docker engine answers" in msg and "DOCKER_HOST" in msg
    assert launcher.stage is None   # nothing was staged before the engine check


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
@pytest.mark.skipif(engine_answers(), reason="a Docker engine answers here")
async def test_docker_run_without_engine_reports_the_cli_error(tmp_path: Path) -> None:
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
