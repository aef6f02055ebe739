"""tests/sandbox_asuser.py reaches a checkout wherever it lives: a venv and sources in a 0700
directory whose path has spaces (a `mktemp -d` clone, a clone under /root) run as the
unprivileged uid, and nothing else of that directory is visible to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import sandbox_asuser

PROBE = """
import os, sys, probe_mod
print(os.getuid(), probe_mod.VALUE, sys.prefix, sorted(os.listdir(sys.argv[1])), sep="|")
"""


def test_a_venv_and_sources_in_a_private_directory_with_spaces_are_reachable(tmp_path):
    why = sandbox_asuser.usable()
    if why:
        pytest.skip(f"cannot run as an unprivileged user: {why}")
    private = tmp_path / "a private dir"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("not for the other uid")
    venv, src = private / "the venv", private / "src dir"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    src.mkdir()
    (src / "probe_mod.py").write_text("VALUE = 42\n")
    python = str(venv / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(src)}

    # without exposing them, the other uid cannot even start the venv's interpreter
    bare = subprocess.run(sandbox_asuser.command([python, "-c", "pass"]), env=env,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode != 0 and "Permission denied" in bare.stderr, bare

    out = subprocess.run(sandbox_asuser.command([python, "-c", PROBE, str(private)],
                                                expose=[venv, src]),
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    uid, value, prefix, listing = out.stdout.strip().split("|")
    assert int(uid) == sandbox_asuser.uid() and value == "42"
    assert prefix == str(venv)
    assert listing == str(["src dir", "the venv"])      # the secret stays hidden


def test_unreadable_names_a_file_other_users_cannot_read(tmp_path):
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "ok.py").write_text("")
    os.chmod(tree, 0o755)
    os.chmod(tree / "pkg", 0o755)
    os.chmod(tree / "pkg" / "ok.py", 0o644)
    assert sandbox_asuser.unreadable([tree]) is None
    (tree / "pkg" / "private.py").write_text("")
    os.chmod(tree / "pkg" / "private.py", 0o600)          # made under umask 077
    assert sandbox_asuser.unreadable([tree]) == str(tree / "pkg" / "private.py")
