"""`recursa view --live`: follow a trace as it is written.

A tiny HTTP server on 127.0.0.1 serves the viewer page and, at /events?offset=N, the complete
lines appended to the trace since byte N. The page polls once a second and folds new events into
what it shows, keeping expanded nodes, selection and scroll. Why a server rather than rewriting
the HTML file: a rewritten file must be reloaded, which loses that state and re-parses the whole
trace every time, while byte offsets make each poll cost only the new lines.

The trace holds prompts, answers and the context's text (it is written owner-only), so the
server is guarded as `recursa serve` is against web pages the user visits: every request must
name a loopback Host (a DNS-rebinding page's requests carry its own name), an Origin, when
sent, must be the server's own, and every request must carry the key printed at start (a
random token in the URL it prints; the page passes it on to /events). Anything else gets 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from recursa.obs.viewer import render_html

MAX_CHUNK = 8 * 1024 * 1024   # bytes of trace sent per poll; the page asks again for the rest


def read_from(path: Path, offset: int) -> tuple[int, list[dict[str, Any]]]:
    """Complete lines of `path` after byte `offset`: (next offset, parsed lines).

    A line without its newline yet (the writer is mid-line) is left for the next poll. If the
    file shrank (rewritten), start again from 0 and let the page reset.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0, []
    if size < offset:
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read(MAX_CHUNK)
    end = chunk.rfind(b"\n")
    if end < 0:
        if len(chunk) == MAX_CHUNK:      # one line longer than a chunk: skip it whole
            return offset + len(chunk), []
        return offset, []
    events: list[dict[str, Any]] = []
    for line in chunk[:end].split(b"\n"):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return offset + end + 1, events


LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def loopback_host(header: str | None) -> bool:
    """Whether a Host header names this machine's loopback (a name or an IP literal, any
    port). None (HTTP/1.0 without a Host) is no browser: allowed."""
    if header is None:
        return True
    h = header.strip().lower()
    if h.startswith("["):                       # [::1]:port
        h = h[1:h.find("]")] if "]" in h else h
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    h = h.rstrip(".")
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def refusal(host: str | None, origin: str | None, key: str | None, expected: str) -> str | None:
    """Why a request to the live view is refused (None: it is not)."""
    if not loopback_host(host):
        return (f"Host {host!r} is not this machine's loopback address; a page naming another "
                f"host is how DNS rebinding reaches a local server")
    if origin is not None and origin.strip().rstrip("/").lower() != \
            f"http://{(host or '').strip().lower()}":
        return f"Origin {origin!r} is not this live view's own: other pages may not read it"
    if key is None or not hmac.compare_digest(key.encode(), expected.encode()):
        return ("this live view needs the key it printed when it started: open the URL it "
                "printed (…/?key=...)")
    return None


class LiveServer:
    """Serves one trace file's live view. `url` (the page, with its key) is ready after
    construction; `serve_forever` or `start()` (a daemon thread) runs it; `close()` stops it.
    `key`: the token every request must carry (default: a new random one)."""

    def __init__(self, trace: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 poll_ms: int = 1000, key: str | None = None):
        self.trace = Path(trace)
        self.key = key or secrets.token_urlsafe(24)
        trace_path, expected = self.trace, self.key
        page = render_html([], title=f"recursa · live · {self.trace.name}", live={
            "events_url": f"/events?key={self.key}", "source": self.trace.name, "offset": 0,
            "poll_ms": poll_ms}).encode("utf-8")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                url = urlparse(self.path)
                query = parse_qs(url.query)
                why = refusal(self.headers.get("Host"), self.headers.get("Origin"),
                              next(iter(query.get("key") or []), None), expected)
                if why is not None:
                    self._send(403, "text/plain; charset=utf-8", why.encode("utf-8"))
                elif url.path == "/":
                    self._send(200, "text/html; charset=utf-8", page)
                elif url.path == "/events":
                    try:
                        offset = max(0, int(query.get("offset", ["0"])[0]))
                    except ValueError:
                        offset = 0
                    nxt, events = read_from(trace_path, offset)
                    body = json.dumps({"offset": nxt, "events": events}).encode("utf-8")
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("Referrer-Policy", "no-referrer")   # the URL holds the key
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: polled every second
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://{host}:{self.httpd.server_address[1]}/"
        self.url = f"{self.base}?key={self.key}"
        self._thread: threading.Thread | None = None

    def events_url(self, offset: int = 0) -> str:
        """/events from `offset`, with the key."""
        return f"{self.base}events?key={self.key}&offset={offset}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> LiveServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
