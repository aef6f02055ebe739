"""sandbox="docker": each worker incarnation is one `docker run -i` container, driven by the CLI.

Why the CLI and one container per incarnation:

* `docker run -i` gives exactly the byte stream the protocol needs on the CLI's own
  stdin/stdout, so the local `SubprocessTransport` carries it unchanged. The Docker SDK's
  attach socket multiplexes stdout and stderr into 8-byte-header frames and needs a raw-socket
  half-close to signal EOF: more code for the same bytes. The CLI also honours everything a
  user has set up (docker contexts, DOCKER_HOST, ssh://, TLS, rootless engines).
* Killing an incarnation must kill what runs in it. Killing a `docker exec` client leaves its
  process running in the container; `docker rm -f NAME` on a container that *is* the
  incarnation stops everything in it. A restart costs one container start (~0.5 s).

Each container: no network (`--network none`), read-only root filesystem, size-capped tmpfs
for /tmp and the workspace, all capabilities dropped, no-new-privileges, a pids limit, memory
and CPU limits, an unprivileged uid, no host environment. The worker, supervisor and context
reach it read-only under /recursa: bind-mounted from a private host directory (upload="bind",
the default: the context is copied there once) or copied once into a named volume
(upload="volume", for engines on another machine, where host paths mean nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Sequence
from typing import Literal

from recursa.base.types import SandboxError
from recursa.sandbox.transport import SubprocessTransport, describe_exit

log = logging.getLogger("recursa.sandbox")

REMOTE_DIR = "/recursa"


class DockerTransport(SubprocessTransport):
    """`docker run -i ...` as a local subprocess; kill() also removes the container, because
    killing the CLI alone would leave a busy container running."""

    def __init__(self, argv: Sequence[str], *, docker: str, name: str):
        super().__init__(argv, env=_cli_env())
        self.docker = docker
        self.name = name

    async def kill(self) -> None:
        with contextlib.suppress(Exception):
            await _run_cli([self.docker, "rm", "-f", self.name], timeout=30)
        await super().kill()

    def diagnostics(self) -> str:
        rc = self.returncode
        if rc == 125:   # docker's own status for "the daemon could not run the container"
            text = "docker could not run the container (exit status 125)"
        elif rc in (126, 127):
            text = f"the container could not start the worker's interpreter (exit status {rc})"
        else:
            text = describe_exit(rc)
        tail = self._tail.decode("utf-8", errors="replace").strip()
        if tail:
            text += "; its last error output was:\n" + tail[-2000:]
        return text


def _cli_env() -> dict[str, str]:
    # The CLI needs the user's Docker settings; none of them reach the container (no -e).
    return dict(os.environ)


async def _run_cli(argv: Sequence[str], *, timeout: float) -> tuple[int, str, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_cli_env())
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return -1, "", f"`{' '.join(argv[:3])} ...` timed out after {timeout:g} s"
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    return (proc.returncode or 0, out.decode("utf-8", errors="replace"),
            err.decode("utf-8", errors="replace"))


class DockerLauncher:
    """Launcher for `RemoteSandbox` over the docker CLI; see the module docstring."""

    kind = "docker"

    def __init__(self, image: str = "python:3.12-slim", *, docker: str = "docker",
                 python: str = "python3", network: str = "none",
                 memory_mb: int | None = 4096, cpus: float | None = None,
                 pids_limit: int | None = 256, tmp_mb: int = 256, workspace_mb: int = 1024,
                 user: str | None = "65534:65534", upload: Literal["bind", "volume"] = "bind",
                 pull: bool = True, limits: str | None = None,
                 extra_args: Sequence[str] = (), check_timeout: float = 30.0,
                 pull_timeout: float = 900.0):
        if upload not in ("bind", "volume"):
            raise ValueError(f"upload must be 'bind' or 'volume', not {upload!r}")
        self.image = image
        self.docker = docker
        self.python = python
        self.network = network
        self.memory_mb = memory_mb
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.tmp_mb = tmp_mb
        self.workspace_mb = workspace_mb
        self.user = user
        self.upload = upload
        self.pull = pull
        self.limits = limits
        self.extra_args = list(extra_args)
        self.check_timeout = check_timeout
        self.pull_timeout = pull_timeout
        self.id = uuid.uuid4().hex[:12]
        self.stage: str | None = None       # upload="bind": the host directory mounted
        self.volume: str | None = None      # upload="volume": the named volume
        self._names: list[str] = []
        net = "no network" if network == "none" else f"network {network!r}"
        mem = f"memory {memory_mb} MB" if memory_mb else "no memory limit"
        self.isolation = (f"docker container {image} ({net}, read-only root, tmpfs workspace "
                          f"{workspace_mb} MB, {mem}, user {user or 'image default'}, "
                          f"capabilities dropped)")

    # ------------------------------------------------------------ argv
    def mounts(self) -> list[str]:
        """The -v/--mount options that show worker, supervisor and context under /recursa."""
        if self.upload == "volume":
            assert self.volume is not None
            return ["--mount", f"type=volume,source={self.volume},target={REMOTE_DIR},readonly"]
        assert self.stage is not None
        out: list[str] = []
        for name in ("worker.py", "supervisor.py", "context"):
            out += ["--mount", f"type=bind,source={self.stage}/{name},"
                               f"target={REMOTE_DIR}/{name},readonly"]
        return out

    def run_argv(self, name: str) -> list[str]:
        """The exact `docker run` command of one worker incarnation."""
        a = [self.docker, "run", "-i", "--rm", "--name", name, "--pull", "never",
             "--label", "recursa.sandbox=1", "--label", f"recursa.sandbox.id={self.id}",
             "--network", self.network, "--read-only",
             "--tmpfs", f"/tmp:rw,nosuid,nodev,size={self.tmp_mb}m,mode=1777",
             "--tmpfs", f"/workspace:rw,nosuid,nodev,size={self.workspace_mb}m,mode=1777"
                        f"{_owner_options(self.user)}",
             "--workdir", "/workspace",
             "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
             "--init"]
        if self.pids_limit:
            a += ["--pids-limit", str(self.pids_limit)]
        if self.memory_mb:
            # memory-swap = memory: no swap on top of the limit
            a += ["--memory", f"{self.memory_mb}m", "--memory-swap", f"{self.memory_mb}m"]
        if self.cpus:
            a += ["--cpus", f"{self.cpus:g}"]
        if self.user:
            a += ["--user", self.user]
        for k, v in (("HOME", "/workspace"), ("TMPDIR", "/tmp"), ("LANG", "C.UTF-8"),
                     ("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUNBUFFERED", "1")):
            a += ["--env", f"{k}={v}"]
        a += self.mounts()
        a += self.extra_args
        a += [self.image, self.python, "-I", "-S", f"{REMOTE_DIR}/worker.py"]
        if self.limits:
            a += ["--limits", self.limits]
        return a

    # ------------------------------------------------------------ Launcher
    async def check_engine(self) -> None:
        """A missing CLI or an unreachable engine is a SandboxError that says what to do."""
        cli = shutil.which(self.docker)
        if cli is None:
            raise SandboxError(
                f"sandbox='docker' needs the docker CLI, and {self.docker!r} is not on PATH: "
                f"install Docker (https://docs.docker.com/engine/install/) or pass docker=PATH")
        self.docker = cli
        rc, out, err = await _run_cli(
            [cli, "version", "--format", "{{.Server.Version}}"], timeout=self.check_timeout)
        if rc != 0 or not out.strip():
            why = (err.strip().splitlines() or ["no answer"])[-1]
            raise SandboxError(
                f"sandbox='docker': the docker CLI is installed but no Docker engine answers "
                f"({why}). Start the engine (e.g. `sudo systemctl start docker`) or point "
                f"DOCKER_HOST / `docker context use` at one, then try again.")

    async def _ensure_image(self) -> None:
        rc, _, _ = await _run_cli([self.docker, "image", "inspect", self.image],
                                  timeout=self.check_timeout)
        if rc == 0:
            return
        if not self.pull:
            raise SandboxError(f"sandbox='docker': image {self.image!r} is not present and "
                               f"pull=False")
        rc, _, err = await _run_cli([self.docker, "pull", self.image], timeout=self.pull_timeout)
        if rc != 0:
            raise SandboxError(f"sandbox='docker': could not pull image {self.image!r}: "
                               f"{err.strip()[-500:]}")

    async def prepare(self, files: dict[str, str]) -> str:
        await self.check_engine()
        await self._ensure_image()
        if self.upload == "bind":
            self.stage = await asyncio.to_thread(_stage, files)
        else:
            await self._fill_volume(files)
        return REMOTE_DIR

    async def _fill_volume(self, files: dict[str, str]) -> None:
        vol = f"recursa-{self.id}"
        rc, _, err = await _run_cli([self.docker, "volume", "create", "--label",
                                     "recursa.sandbox=1", vol], timeout=self.check_timeout)
        if rc != 0:
            raise SandboxError(f"sandbox='docker': could not create volume {vol}: {err.strip()}")
        self.volume = vol
        # A created (never started) helper container gives `docker cp` a way into the volume;
        # the tar stream goes to the engine, so this works for remote engines too.
        helper = f"recursa-{self.id}-upload"
        self._names.append(helper)
        rc, _, err = await _run_cli(
            [self.docker, "container", "create", "--name", helper, "--network", "none",
             "--mount", f"type=volume,source={vol},target={REMOTE_DIR}", self.image, "true"],
            timeout=self.check_timeout)
        if rc != 0:
            raise SandboxError(f"sandbox='docker': could not create the upload helper: "
                               f"{err.strip()}")
        await asyncio.to_thread(_copy_tar, self.docker, helper, files)
        await _run_cli([self.docker, "rm", "-f", helper], timeout=self.check_timeout)

    def transport(self) -> DockerTransport:
        name = f"recursa-{self.id}-{len(self._names)}"
        self._names.append(name)
        return DockerTransport(self.run_argv(name), docker=self.docker, name=name)

    async def cleanup(self) -> None:
        names, self._names = self._names, []
        if names:   # `--rm` removes finished ones; this catches busy or stuck ones
            await _run_cli([self.docker, "rm", "-f", *names], timeout=60)
        if self.volume:
            vol, self.volume = self.volume, None
            rc, _, err = await _run_cli([self.docker, "volume", "rm", "-f", vol], timeout=60)
            if rc != 0:
                log.warning("could not remove docker volume %s: %s", vol, err.strip())
        if self.stage:
            stage, self.stage = self.stage, None
            shutil.rmtree(stage, ignore_errors=True)


def _owner_options(user: str | None) -> str:
    """tmpfs options that give the workspace to a numeric `uid[:gid]`.

    `--workdir` makes the engine create the working directory and reset it to 0755 root,
    tmpfs or not (seen with docker 20.10), so mode=1777 alone left uid 65534 unable to write
    in its own workspace; owning the tmpfs is what keeps it writable. A user given by name
    cannot be resolved here: the workspace then stays as the engine leaves it."""
    if not user:
        return ""
    uid, _, gid = user.partition(":")
    out = f",uid={uid}" if uid.isdigit() else ""
    return out + (f",gid={gid}" if gid.isdigit() else "")


def _stage(files: dict[str, str]) -> str:
    """Copy the files into a private host directory, readable by the container's uid."""
    stage = tempfile.mkdtemp(prefix="recursa-docker-")
    try:
        for name, src in files.items():
            dst = os.path.join(stage, name)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o644)   # the directory stays 0700: only the engine resolves it
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage


def _copy_tar(docker: str, container: str, files: dict[str, str]) -> None:
    proc = subprocess.Popen([docker, "cp", "-", f"{container}:{REMOTE_DIR}"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_cli_env())
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
            for name, src in files.items():
                info = tar.gettarinfo(src, arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = 0o644
                with open(src, "rb") as f:
                    tar.addfile(info, f)
    finally:
        proc.stdin.close()
    err = proc.stderr.read().decode("utf-8", errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise SandboxError(f"sandbox='docker': uploading into the volume failed: {err.strip()}")
