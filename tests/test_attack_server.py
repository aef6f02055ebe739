"""Attack suite, the server: a real `recursa serve` on loopback, real HTTP clients and raw
sockets.

* An attached document is parsed by the confined parser off the event loop: `/health` answers
  while a heavy upload is being parsed, and a hostile upload is refused by its caps.
* Slow clients are dropped: headers, or a body, trickled a byte at a time are cut after
  `--header-timeout` / `--body-timeout` seconds, on the first request of a connection and on a
  kept-alive one; a client that sends in time is served however long its run takes.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import helpers_hostile as hh
from helpers_procs import processes_with
from serve_process import ServeProcess, recursa_serve

KEY = "attack-server-key-0123456789"
RUN_SECONDS = 1.5      # each run sleeps this long: longer than both timeouts below
TIMEOUT = 1.0          # --header-timeout and --body-timeout


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServeProcess]]:
    script = tmp_path_factory.mktemp("slow") / "script.json"
    script.write_text(json.dumps({"cycle": [
        f"```repl\nimport time\ntime.sleep({RUN_SECONDS})\nFINAL('ok')\n```"]}))
    with recursa_serve("--model", f"replay-file:{script}", "--sandbox", "inprocess",
                       "--api-key", KEY, "--header-timeout", str(TIMEOUT), "--body-timeout",
                       str(TIMEOUT), "--log-level", "warning") as (base, proc):
        yield base, proc


def chat(base: str, content: Any, timeout: float = 120) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=timeout,
                      headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "recursa", "messages": [{"role": "user", "content": content}]})


def with_file(name: str, data: bytes) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "What does the file say?"},
            {"type": "file", "file": {"filename": name,
                                      "file_data": base64.b64encode(data).decode()}}]


# ------------------------------------------------------------------ uploads
def test_health_answers_while_a_heavy_upload_is_parsed(served: Any, tmp_path: Path) -> None:
    base, _ = served
    heavy = hh.docx_paragraphs(tmp_path / "long.docx", 150_000).read_bytes()
    done: dict[str, Any] = {}

    def upload() -> None:
        done["response"] = chat(base, with_file("long.docx", heavy))
        done["at"] = time.monotonic()

    t = threading.Thread(target=upload)
    t.start()
    deadline = time.monotonic() + 20
    while not processes_with("recursa.documents.parse_worker") and t.is_alive():
        assert time.monotonic() < deadline, "no parser started"
        time.sleep(0.02)
    asked = time.monotonic()
    health = httpx.get(base + "/health", timeout=10)
    answered = time.monotonic()
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert answered - asked < 2.0, answered - asked
    t.join(120)
    assert done["response"].status_code == 200, done["response"].text
    assert done["at"] > answered     # the upload was still in hand when /health answered


def test_a_hostile_upload_is_refused_by_its_caps(served: Any, tmp_path: Path) -> None:
    base, _ = served
    data = hh.sqlite_generated(tmp_path / "gen.sqlite").read_bytes()
    t = time.monotonic()
    r = chat(base, with_file("gen.sqlite", data))
    assert time.monotonic() - t < 15
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_file"
    assert "gen.sqlite" in err["message"] and "MAX_TEXT_RATIO" in err["message"]
    assert httpx.get(base + "/health", timeout=5).status_code == 200


# ------------------------------------------------------------------ slow clients
def _closed_within(sock: socket.socket, trickle: bytes, limit: float) -> float | None:
    """Send `trickle` a byte every 0.1 s; the seconds until the server closed the connection
    (None if it was still open after `limit` s)."""
    start = time.monotonic()
    sock.settimeout(0.1)
    i = 0
    while time.monotonic() - start < limit:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass
        except OSError:      # reset
            return time.monotonic() - start
        try:
            sock.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
        except OSError:
            return time.monotonic() - start
        i += 1
    return None


def _connect(base: str) -> socket.socket:
    port = int(base.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=5)


HEAD = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n")


def test_trickled_headers_are_dropped(served: Any) -> None:
    base, _ = served
    with _connect(base) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        took = _closed_within(s, b"X-Slow: abcdefghij\r\n", limit=8)
    assert took is not None and took < TIMEOUT + 2.5, took
    assert httpx.get(base + "/health", timeout=5).status_code == 200


def test_a_trickled_body_is_dropped(served: Any) -> None:
    base, _ = served
    with _connect(base) as s:
        s.sendall((HEAD + "Content-Length: 4000\r\n\r\n").encode())
        took = _closed_within(s, b'{"model": "recursa"      ', limit=8)
    assert took is not None and took < TIMEOUT + 2.5, took


def test_a_kept_alive_connection_trickling_its_next_request_is_dropped(served: Any) -> None:
    base, _ = served
    with _connect(base) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200")
        time.sleep(0.5)      # idle between requests: the keep-alive timer's, not ours
        s.sendall(b"G")
        took = _closed_within(s, b"ET /health HTTP/1.1\r\nX: y\r\n", limit=8)
    assert took is not None and took < TIMEOUT + 2.5, took


def test_a_client_in_time_is_served_however_long_its_run(served: Any) -> None:
    """Headers and body each in time (in two writes, 0.4 s apart); the run then takes longer
    than both timeouts, and the answer still comes back on the same connection."""
    base, _ = served
    body = json.dumps({"model": "recursa", "messages": [{"role": "user", "content": "q"}],
                       "context": "abc"}).encode()
    with _connect(base) as s:
        s.settimeout(30)
        s.sendall((HEAD + f"Content-Length: {len(body)}\r\n").encode())
        time.sleep(0.4)
        s.sendall(b"\r\n" + body[:10])
        time.sleep(0.4)
        t = time.monotonic()
        s.sendall(body[10:])
        got = b""
        while b'"finish_reason"' not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    assert time.monotonic() - t >= RUN_SECONDS
    assert b'"content":"ok"' in got.replace(b" ", b"")


def test_serve_refuses_a_timeout_that_is_not_positive() -> None:
    from recursa.server.slowclients import guarded_h11
    with pytest.raises(ValueError, match="positive"):
        guarded_h11(0, 5)
