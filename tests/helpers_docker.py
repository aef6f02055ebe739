"""The real Docker engine for the sandbox="docker" tests: whether one answers here, the image
`scripts/docker-sandbox.sh` builds (no registry), and a sandbox on it.

Without an engine or the image the engine tests skip and say which is missing; with
RECURSA_DOCKER_TESTS=require (`make test` sets it where it could start the engine) they run
and fail instead, so a broken engine cannot pass as a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

from recursa.base.types import Sandbox
from recursa.sandbox.remote import make_remote_sandbox

# the tag scripts/docker-sandbox.sh builds (test_remote_docker checks the two agree)
DEFAULT_IMAGE = "recursa-sandbox:1"
IMAGE = os.environ.get("RECURSA_DOCKER_IMAGE", DEFAULT_IMAGE)
REQUIRED = os.environ.get("RECURSA_DOCKER_TESTS") == "require"


def _docker(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(["docker", *args], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    r = _docker("version", "--format", "{{.Server.Version}}")
    return r is not None and r.returncode == 0 and bool(r.stdout.strip())


def _missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    if not engine_answers():
        return "no Docker engine answers (scripts/docker-sandbox.sh engine starts one as root)"
    r = _docker("image", "inspect", IMAGE)
    if r is None or r.returncode != 0:
        return f"image {IMAGE} is not present (scripts/docker-sandbox.sh image builds it)"
    return None


MISSING = _missing()
needs_docker = pytest.mark.skipif(MISSING is not None and not REQUIRED,
                                  reason=f"real Docker engine: {MISSING}")


def docker_sandbox(**opts: Any) -> Sandbox:
    """A docker sandbox on the local image, never pulling (these machines have no registry)."""
    return make_remote_sandbox("docker", image=IMAGE, pull=False, **opts)


def containers(launcher_id: str) -> list[str]:
    """The containers (running or not) a launcher left behind."""
    r = _docker("ps", "-aq", "--filter", f"label=recursa.sandbox.id={launcher_id}")
    assert r is not None and r.returncode == 0, r
    return r.stdout.decode().split()
