"""The attack cells of test_attack.py that apply to a container, on a real Docker engine.

Each runs one scripted RLM with sandbox="docker" on the image scripts/docker-sandbox.sh builds
(`docker run --network none --read-only --cap-drop ALL --user 65534:65534 ...`): the network,
the host's files, writes outside the workspace, the read-only root, API keys, the uid and
capabilities, the memory cap, processes left behind. Skipped, with the reason, where no engine
answers (see helpers_docker).
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from helpers_docker import needs_docker
from helpers_procs import processes_with
from test_attack import PROC_KEY_SCAN, SECRET, attack, cell_out, intact

pytestmark = needs_docker


def test_docker_network_is_off(tmp_path):
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(8)   # a connection that got through would wait in the backlog
    port = server.getsockname()[1]
    # the host's loopback and the docker bridge's usual host address; and DNS
    code = ("import socket\n"
            f"for host in ('127.0.0.1', '172.17.0.1'):\n"
            "    try:\n"
            f"        s = socket.create_connection((host, {port}), timeout=3)\n"
            "        s.sendall(b'exfiltrated'); s.close(); print('sent', host)\n"
            "    except OSError as e:\n"
            "        print('blocked', host, type(e).__name__)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 443); print('dns ok')\n"
            "except OSError as e:\n"
            "    print('dns blocked', type(e).__name__)\n"
            "import os; print('interfaces', sorted(os.listdir('/sys/class/net')))")
    try:
        a = attack(tmp_path, "docker", code)
        intact(a)
        out = cell_out(a)
        assert "blocked 127.0.0.1 ConnectionRefusedError" in out   # its own loopback
        assert "blocked 172.17.0.1 OSError" in out                 # no route: no interface
        assert "dns blocked" in out and "sent" not in out
        assert "interfaces ['lo']" in out
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_docker_host_files_are_invisible_and_root_is_read_only(tmp_path):
    host_secret = tmp_path / "id_rsa"
    host_secret.write_text("attack-marker")
    project = Path(__file__).resolve().parent.parent / "pyproject.toml"
    target = tmp_path / "planted.txt"
    code = ("import os\nseen = {}\n"
            f"for p in {[str(host_secret), str(project)]!r}:\n"
            "    try:\n"
            "        seen[p] = open(p).read(80)\n"
            "    except OSError as e:\n"
            "        seen[p] = type(e).__name__\n"
            # /var/tmp is world-writable in the image: only the read-only root stops it
            f"for p in {[str(target), '/var/tmp/planted', '/usr/planted', '/planted']!r}:\n"
            "    try:\n"
            "        open(p, 'w').write('x'); seen[p] = 'written'\n"
            "    except OSError as e:\n"
            "        seen[p] = e.strerror\n"
            "open('inside.txt', 'w').write('fine')\n"
            "open('/tmp/t.txt', 'w').write('fine')\n"
            "seen['workspace'] = open('inside.txt').read() + os.getcwd()\n"
            "print(seen)")
    a = attack(tmp_path, "docker", code)
    intact(a)
    assert cell_out(a).startswith("{"), a.feedback[:2000]
    seen = eval(cell_out(a).strip().splitlines()[0])
    assert seen[str(host_secret)] == seen[str(project)] == "FileNotFoundError"
    assert seen[str(target)] == "No such file or directory"
    assert seen["/var/tmp/planted"] == "Read-only file system"
    assert seen["/usr/planted"] in ("Read-only file system", "Permission denied")
    assert seen["/planted"] in ("Read-only file system", "Permission denied")
    assert seen["workspace"] == "fine/workspace"
    assert "attack-marker" not in a.feedback and not target.exists()


def test_docker_keys_uid_and_capabilities(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    code = ("import os\n"
            f"key = {SECRET[:12]!r}\nfound = []\n"
            + PROC_KEY_SCAN +
            "print('own env keys:', sorted(k for k in os.environ if 'KEY' in k))\n"
            "print('found', found)\n"
            "print('ids', os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
            "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
            " if ':\\t' in l)\n"
            "print('caps', st['CapEff'].strip(), st['CapBnd'].strip(), 'nnp', st['NoNewPrivs'])\n"
            "try:\n"
            "    os.setuid(0); print('setuid worked')\n"
            "except OSError as e:\n"
            "    print('setuid', type(e).__name__)")
    a = attack(tmp_path, "docker", code)
    intact(a)
    out = cell_out(a)
    assert "own env keys: []" in out and "found []" in out
    assert "ids 65534 65534 65534 []" in out or "ids 65534 65534 65534 [65534]" in out
    assert "caps 0000000000000000 0000000000000000 nnp 1" in out
    assert "setuid PermissionError" in out
    assert SECRET not in a.trace_path.read_text()


@pytest.mark.slow
def test_docker_memory_cap(tmp_path):
    """The container's 256 MB cgroup limit: the kernel kills the worker when it would grow
    past it (no MemoryError: the cgroup, not an rlimit, holds it), and the run goes on in a new
    container."""
    code = ("chunks = []\n"
            "while True:\n"
            "    chunks.append(bytearray(32 * 1024 * 1024))")
    a = attack(tmp_path, "docker", code, sandbox_opts={"memory_mb": 256}, cell_timeout=20)
    intact(a)
    assert "died while running this cell" in a.feedback, a.feedback[:1500]
    assert "SIGKILL (out of memory" in a.feedback and "restarted" in a.feedback


def test_docker_processes_left_behind_are_removed_with_the_container(tmp_path):
    marker = f"recursa-attack-{uuid.uuid4().hex}"
    code = ("import subprocess, sys, os\n"
            f"argv = [sys.executable, '-c', 'import time; time.sleep(300)', '{marker}']\n"
            "subprocess.Popen(argv, start_new_session=True)\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        os.execv(sys.executable, argv)\n"
            "    os._exit(0)\n"
            "import time; time.sleep(0.5)\nprint('spawned')")
    a = attack(tmp_path, "docker", code)
    intact(a)
    assert "spawned" in cell_out(a)
    for _ in range(100):   # the container's processes are the host kernel's: ps sees them
        if not processes_with(marker):
            break
        time.sleep(0.1)
    assert processes_with(marker) == []


def test_docker_fork_bomb_is_capped(tmp_path):
    """--pids-limit is the container's cgroup: it holds whatever the host's uid."""
    from test_attack import FORK_BOMB
    marker = f"recursa-bomb-{uuid.uuid4().hex}"
    a = attack(tmp_path, "docker", f"MARK = {marker!r}\n" + FORK_BOMB,
               sandbox_opts={"pids_limit": 24}, cell_timeout=20)
    intact(a)
    out = cell_out(a)
    assert "fork refused after" in out
    assert int(out.split("fork refused after")[1].split()[0]) < 24
    for _ in range(100):
        if not processes_with(marker):
            break
        time.sleep(0.1)
    assert processes_with(marker) == []
