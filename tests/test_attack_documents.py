"""Attack suite, documents: hostile files, and code running where the document parser runs.

Documents are parsed by a confined process (recursa.documents.confine), never by the host. Two
kinds of cells here:

* hostile documents (the reproductions of issue 35 and their relatives), each loaded by a fresh
  host process that measures itself: the load must end within seconds with a bounded context
  or an error naming the file and the bound, and the host's peak resident memory must not grow
  by more than HOST_MB (the unbounded readers grew it by 0.6 to 3.7 GB, or hung);
* probes: Python run by the parser's own launcher, set up exactly as the parser is (control
  groups, rlimits, lock-down) before the probe's code runs, standing for a parser taken over by
  a hostile file: it must not see API keys, the network, the host's files or processes, and
  its memory, time and output must be capped.

Parametrised over the parser's isolation: "bwrap" where bubblewrap works, "limits" always.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import helpers_hostile as hh
from helpers_sandbox import MODES
from recursa.documents import DocumentError, confine

HOST_MB = 200     # the host's peak resident memory may grow by this much, at most
SECONDS = 15.0    # a hostile file ends within this (on a loaded 2-core machine)
SECRET = "sk-recursa-parser-attack-0123456789"


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(confine.ENV_MODE, request.param)
    return str(request.param)


def bounded(r: dict[str, Any]) -> None:
    assert r["seconds"] < SECONDS, r
    assert r["rss_growth_mb"] < HOST_MB, r


# ------------------------------------------------------------------ hostile documents
REFUSED = {   # builder -> what the error says (the file and the bound)
    "sqlite_generated": r"gen.sqlite: its text grew past 10,000,000 characters, more than 100 "
                        r"per byte.*MAX_TEXT_RATIO",
    "sqlite_huge_value": r"gen.sqlite: table 't' holds a value over the 64.0 MB limit for one "
                         r"value \(recursa.documents.limits.MAX_VALUE_BYTES",
    "xlsx_shared_string": r"gen.xlsx: its text grew past 10,000,000 characters.*MAX_TEXT_RATIO",
    "docx_bomb": r"gen.docx: refused before reading it: member 'word/document.xml' would unpack "
                 r"\d+ times its size \(100.0 MB; limit 100x\)",
    "docx_wide_table": r"gen.docx: its text grew past 10,000,000 characters.*MAX_TEXT_RATIO",
    "tar_gz_bomb": r"gen.tar.gz: archive refused before extraction: its members declare 200.0 "
                   r"MB uncompressed, \d+ times its [\d,]+ bytes \(limit 100x, MAX_RATIO\)",
}
SUFFIX = {"sqlite": ".sqlite", "xlsx": ".xlsx", "docx": ".docx", "tar": ".tar.gz"}


@pytest.mark.parametrize("builder", sorted(REFUSED))
def test_hostile_document_is_refused_in_seconds_with_the_host_unharmed(builder: str, mode: str,
                                                                        tmp_path: Path):
    path = getattr(hh, builder)(tmp_path / ("gen" + SUFFIX[builder.split("_")[0]]))
    assert path.stat().st_size < 1024 * 1024
    r = hh.measure_host("load", path, env={confine.ENV_MODE: mode})
    assert not r["ok"], r
    assert r["error"].startswith("DocumentError: ")
    assert re.search(REFUSED[builder], r["error"]), r["error"]
    bounded(r)


def test_a_hostile_document_as_the_context_of_a_run(mode: str, tmp_path: Path):
    """`recursa run --context gen.sqlite` streams a document into the payload: same bound."""
    path = hh.sqlite_generated(tmp_path / "gen.sqlite")
    r = hh.measure_host("prepare", path, tmp_path / "w", env={confine.ENV_MODE: mode})
    assert not r["ok"] and "gen.sqlite: its text grew past 10,000,000" in r["error"], r
    bounded(r)
    assert not (tmp_path / "w" / "context.json").exists()


def test_many_paragraphs_parse_in_seconds(mode: str, tmp_path: Path):
    """60,000 paragraphs in 190 KB of Word (not a bomb by ratio): python-docx's own style
    lookup made this minutes; the text comes back whole."""
    path = hh.docx_paragraphs(tmp_path / "long.docx", 60_000)
    r = hh.measure_host("load", path, env={confine.ENV_MODE: mode})
    assert r["ok"], r
    assert r["chars"] > 60_000 * 20
    bounded(r)


def test_folder_whose_gitignore_is_dev_zero(mode: str, tmp_path: Path):
    root = hh.folder_gitignore_dev_zero(tmp_path / "repo")
    r = hh.measure_host("prepare", root, tmp_path / "w", env={confine.ENV_MODE: mode})
    assert r["ok"], r
    assert ".gitignore: not read (a symlink out of the folder" in " ".join(r["notes"])
    assert "'a.txt'" in r["description"]
    bounded(r)


def test_folder_with_fifos_and_a_symlink_out(mode: str, tmp_path: Path):
    root = hh.folder_with_fifos(tmp_path / "repo")
    r = hh.measure_host("prepare", root, tmp_path / "w", env={confine.ENV_MODE: mode})
    assert r["ok"], r
    notes = " ".join(r["notes"])
    assert "1 symlinks not followed, 1 not regular files (devices, FIFOs, sockets)" in notes
    assert "sub/.gitignore: not read" in notes
    payload = json.loads((tmp_path / "w" / "context.json").read_text())
    assert payload == {"a.txt": "kept text"}     # nothing of the file outside
    bounded(r)


def test_a_fifo_inside_a_list_context_is_named_not_opened(tmp_path: Path):
    root = hh.folder_with_fifos(tmp_path / "repo")
    r = hh.measure_host("inner", root / "pipe.txt", tmp_path / "w")
    assert not r["ok"]
    assert "context path is neither a file nor a directory" in r["error"], r
    bounded(r)


def test_the_walk_skips_what_is_not_a_regular_file_inside(tmp_path: Path):
    """recursa.documents.tree.walk (also what `recursa batch` lists a folder with)."""
    from collections import Counter

    from recursa.documents.tree import walk
    root = hh.folder_with_fifos(tmp_path / "repo")
    os.symlink("/dev/zero", root / "zero.txt")
    skipped: Counter[str] = Counter()
    assert [rel for rel, _ in walk(root, skipped)] == ["a.txt"]
    assert skipped == {"symlinks not followed": 2,
                       "not regular files (devices, FIFOs, sockets)": 1}


# ------------------------------------------------------------------ probes in the parser
PROBE = """\
import json, site, sys
for p in json.loads(sys.argv[1]):
    site.addsitedir(p)
from recursa.documents.parse_worker import setup, write_status
request, status_fd = setup(json.loads(sys.argv[2]))
seen = {}
try:
%s
finally:
    write_status(status_fd, {"ok": True, "notes": [json.dumps(seen)]})
"""


def probe(mode: str, code: str, *, caps: confine.ParseCaps | None = None,
          binds: list[tuple[str, str]] | None = None
          ) -> tuple[int, dict[str, Any], str | None, str]:
    """Run `code` where the parser runs, set up as the parser is: (exit status, what it put in
    `seen`, why the host stopped it, its stderr)."""
    run = confine.ParserProcess(mode, caps or confine.ParseCaps(seconds=20),
                                binds or [], boot=PROBE % textwrap.indent(code, "    "))
    try:
        rc, status, err = run.run({"op": "probe", "limits": {}})
    finally:
        run.cleanup()
    seen = json.loads(status["notes"][0]) if status else {}
    return rc, seen, run.reason, err


def test_the_parser_sees_no_keys(mode: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    code = ("import os\n"
            "seen['env'] = dict(os.environ)\n"
            "seen['found'] = []\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    try:\n"
            f"        if {SECRET!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read():\n"
            "            seen['found'].append(pid)\n"
            "    except OSError:\n"
            "        pass\n"
            "try:\n"
            "    host = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
            "    seen['host'] = 'readable' if b'PATH=' in host else 'empty'\n"
            "except OSError as e:\n"
            "    seen['host'] = type(e).__name__\n")
    rc, seen, _, err = probe(mode, code)
    assert rc == 0, err
    assert SECRET not in json.dumps(seen["env"]) and seen["found"] == []
    assert not any("KEY" in k for k in seen["env"])
    assert set(seen["env"]) <= {"LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
                                "PYTHONUNBUFFERED", "PATH", "HOME", "TMPDIR", "PWD",
                                "LD_LIBRARY_PATH"}
    if mode == "bwrap":   # its parent is bubblewrap's, in a pid namespace of its own
        assert seen["host"] != "readable" or os.getpid() not in map(int, seen["found"])
    elif os.geteuid() == 0:   # no capabilities left: the root host's environ needs them
        assert seen["host"] == "PermissionError"


def test_the_parser_cannot_reach_the_network(mode: str):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        srv.settimeout(8)
        try:
            conn, _ = srv.accept()
            got.append(conn.recv(100))
            conn.close()
        except OSError:
            pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    code = ("import socket\n"
            "try:\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "    s.sendall(b'leak')\n"
            "    seen['net'] = 'connected'\n"
            "except OSError as e:\n"
            "    seen['net'] = type(e).__name__\n")
    rc, seen, _, err = probe(mode, code)
    t.join(10)
    srv.close()
    assert rc == 0, err
    if mode == "bwrap":
        assert seen["net"] != "connected" and got == []
    else:   # the documented difference: without bubblewrap the parser has the network
        assert seen["net"] == "connected"


def test_the_parser_cannot_read_or_write_the_hosts_files(mode: str, tmp_path: Path):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY attack-marker")
    doc = tmp_path / "given.txt"
    doc.write_text("the document")
    inside = "/recursa/in/file.txt" if mode == "bwrap" else str(doc)
    code = ("import os\n"
            f"for k, p in {{'secret': {str(secret)!r}, 'doc': {inside!r}, "
            "'home': os.path.expanduser('~root/.bashrc')}.items():\n"
            "    try:\n"
            "        seen[k] = open(p).read(40)\n"
            "    except OSError as e:\n"
            "        seen[k] = type(e).__name__\n"
            f"for k, p in {{'write_tmp_path': {str(tmp_path / 'dropped')!r}, "
            f"'write_doc': {inside!r}}}.items():\n"
            "    try:\n"
            "        open(p, 'w').write('x')\n"
            "        seen[k] = 'written'\n"
            "    except OSError as e:\n"
            "        seen[k] = type(e).__name__\n")
    rc, seen, _, err = probe(mode, code, binds=[(str(doc), inside)])
    assert rc == 0, err
    assert seen["doc"] == "the document"          # what it was given, read-only
    if mode == "bwrap":
        assert seen["secret"] == "FileNotFoundError" and seen["home"] in (
            "FileNotFoundError", "PermissionError")
        assert seen["write_tmp_path"] != "written" and seen["write_doc"] != "written"
        assert not (tmp_path / "dropped").exists()
        assert doc.read_text() == "the document"
    else:   # the documented difference: without bubblewrap the host's files are in reach
        assert seen["secret"].startswith("PRIVATE KEY")


def test_the_parser_cannot_signal_the_host(mode: str):
    code = ("import os, signal\n"
            f"try:\n    os.kill({os.getpid()}, signal.SIGTERM)\n    seen['kill'] = 'sent'\n"
            "except OSError as e:\n    seen['kill'] = type(e).__name__\n")
    if mode != "bwrap":
        pytest.skip("without bubblewrap the parser runs as the host's user (documented)")
    rc, seen, _, err = probe(mode, code)
    assert rc == 0, err
    assert seen["kill"] in ("ProcessLookupError", "PermissionError")


def test_the_parsers_memory_is_capped(mode: str):
    code = ("blocks = []\n"
            "for _ in range(200):\n"
            "    blocks.append(bytearray(8 * 1024 * 1024))   # 1.6 GB, touched\n"
            "seen['allocated'] = True\n")
    t = time.monotonic()
    rc, seen, reason, err = probe(mode, code, caps=confine.ParseCaps(memory_mb=256, seconds=30))
    assert time.monotonic() - t < SECONDS
    assert not seen.get("allocated")
    assert reason == "memory" or "MemoryError" in err, (rc, reason, err[-500:])


def test_the_parsers_time_is_capped(mode: str):
    t = time.monotonic()
    rc, seen, reason, _ = probe(mode, "while True:\n    pass\n",
                                caps=confine.ParseCaps(cpu_seconds=60, seconds=2))
    assert time.monotonic() - t < 10 and reason == "time" and not seen
    rc, seen, reason, _ = probe(mode, "import time\ntime.sleep(60)\n",
                                caps=confine.ParseCaps(seconds=2))
    assert time.monotonic() - t < 20 and reason == "time"


def test_the_parsers_cpu_is_capped(mode: str, tmp_path: Path):
    rc, _, reason, _ = probe(mode, "while True:\n    pass\n",
                             caps=confine.ParseCaps(cpu_seconds=1, seconds=30))
    assert reason is None and rc == -signal.SIGXCPU, (rc, reason)
    long = hh.docx_paragraphs(tmp_path / "long.docx", 100_000)
    with pytest.raises(DocumentError, match=r"long.docx: parsing it took more than 1 s of CPU.*"
                                            r"PARSE_CPU_SECONDS"):
        confine.load_file(long, caps=confine.ParseCaps(cpu_seconds=1))


def test_the_parsers_output_is_capped(mode: str):
    code = ("import json, os\n"
            "out = json.loads(sys.argv[2])['out']\n"
            "try:\n"
            "    with open(os.path.join(out, 'result.json'), 'wb') as f:\n"
            "        for _ in range(64):\n"
            "            f.write(b'x' * (1024 * 1024))\n"
            "    seen['wrote'] = 'all'\n"
            "except OSError as e:\n"
            "    seen['wrote'] = e.errno\n")
    rc, seen, _, err = probe(mode, code, caps=confine.ParseCaps(output_mb=8))
    assert seen["wrote"] == errno.EFBIG, (rc, seen, err)


def test_a_cap_reached_in_a_real_parse_names_the_file_and_the_cap(mode: str, tmp_path: Path):
    big = tmp_path / "big.csv"
    with big.open("w") as f:
        for i in range(400_000):
            f.write(f"{i},some text of a row of this table,{i * 7}\n")
    # stopped by the control group, or out of address space (without one)
    with pytest.raises(DocumentError, match=r"big.csv: (parsing it needed more than its 64 MB "
                                            r"of memory|out of memory while reading it as "
                                            r"CSV).*PARSE_MEMORY_MB"):
        confine.load_file(big, caps=confine.ParseCaps(memory_mb=64))
    with pytest.raises(DocumentError, match=r"big.csv: its text is over the 1 MB the parser "
                                            r"may write.*PARSE_OUTPUT_MB"):
        confine.load_file(big, caps=confine.ParseCaps(output_mb=1))


def test_a_file_that_kills_the_parser_is_skipped_and_the_rest_of_the_folder_loads(
        mode: str, tmp_path: Path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.txt").write_text("first")
    hh.docx_paragraphs(root / "b.docx", 300_000)      # more CPU than the cap below
    (root / "c.md").write_text("# last\n")
    files, notes = confine.load_folder(root, caps=confine.ParseCaps(cpu_seconds=2))
    assert set(files) == {"a.txt", "c.md"}
    assert any(n.startswith("b.docx: skipped: parsing it took more than 2 s of CPU")
               for n in notes), notes
