"""The local model server listens on a Unix socket in a private directory, not on a TCP port
picked beforehand (issue 21: a port picked, closed, then bound by llama-server is a race in which
another process can take it and receive our requests and token).

These tests run the real LlamaServer process management against a small stand-in for
llama-server (a real process that, like llama.cpp, listens on a Unix socket when `--host` ends
in `.sock` and on TCP otherwise, and checks the bearer token), so they need no runtime build;
test_models_local.py checks the same of the real llama.cpp server.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from helpers_procs import tcp_listeners
from recursa.base.types import ModelError
from recursa.models import llama_server
from recursa.models.local import LocalClient

FAKE = textwrap.dedent('''
    import json, os, socket, socketserver, sys
    from http.server import BaseHTTPRequestHandler
    argv = sys.argv[1:]
    host = argv[argv.index("--host") + 1]
    token = os.environ["LLAMA_API_KEY"]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def _authorised(self):
            if self.headers.get("Authorization") != "Bearer " + token:
                self._send(401, {"error": "no token"})
                return False
            return True
        def do_GET(self):
            if self._authorised():
                self._send(200, {"status": "ok", "pid": os.getpid()})
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self._authorised():
                self._send(200, {"choices": [{"message": {"content": str(os.getpid())},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    if host.endswith(".sock"):            # as llama.cpp: a Unix socket
        class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True
        srv = S(host, H)
    else:                                 # else TCP on --port
        class S(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
        srv = S((host, int(argv[argv.index("--port") + 1])), H)
    print("listening on", host, flush=True)
    srv.serve_forever()
''')


@pytest.fixture
def fake_binary(tmp_path: Path) -> str:
    # a shell wrapper: a #! line cannot name an interpreter whose path has a space
    (tmp_path / "fake_llama.py").write_text(FAKE)
    script = tmp_path / "llama-server"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} '
                      f'{shlex.quote(str(tmp_path / "fake_llama.py"))} "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    return str(m)


@pytest.fixture(autouse=True)
def _fresh_servers():
    llama_server.stop_all()
    yield
    llama_server.stop_all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_server_listens_on_a_private_unix_socket_only(fake_binary, model_file):
    srv = llama_server.get_server(llama_server.ServerConfig(binary=fake_binary, model=model_file))
    assert srv.alive()
    sock = Path(srv.socket_path)
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700     # nobody else can connect
    assert tcp_listeners(srv.proc.pid) == []                     # no port to race for
    status, body = srv.request("GET", "/health")
    assert status == 200 and json.loads(body)["pid"] == srv.proc.pid
    srv.stop()
    assert not sock.parent.exists()


def test_a_forked_child_leaves_the_parents_server_socket_alone(fake_binary, model_file):
    """A sandbox worker forked after a server started drops its copy of the registry; that
    copy's cleanup once deleted the parent's socket directory, and every later request of the
    parent failed with ENOENT (seen in CI as a model test failing after another forked)."""
    import gc
    import os
    srv = llama_server.get_server(llama_server.ServerConfig(binary=fake_binary, model=model_file))
    sock = Path(srv.socket_path)
    del srv                                   # only the registry holds it, as between runs
    pid = os.fork()
    if pid == 0:
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert stat.S_ISSOCK(sock.stat().st_mode)
    status, _ = llama_server.running()[0].request("GET", "/health")
    assert status == 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_requests_reach_their_own_server_while_another_process_takes_ports(
        fake_binary, model_file):
    """Three servers start at once while another process grabs every loopback port it can
    get: each starts, and each client's request is answered by its own server's process."""
    squatted: list[socket.socket] = []
    for _ in range(200):          # what a port-stealing process would do between pick and bind
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        squatted.append(s)
    try:
        clients = [LocalClient(model_file, n_ctx=512 + i, stream=False) for i in range(3)]
        for c in clients:
            c.config = lambda c=c: llama_server.ServerConfig(  # type: ignore[method-assign]
                binary=fake_binary, model=model_file, n_ctx=c.n_ctx)
        replies = await asyncio.gather(*(c.complete([{"role": "user", "content": "hi"}])
                                         for c in clients))
        servers = {s.config.n_ctx: s for s in llama_server.running()}
        assert len(servers) == 3
        for c, r in zip(clients, replies, strict=True):
            assert r.text == str(servers[c.n_ctx].proc.pid)    # its own server answered
        for c in clients:
            await c.aclose()
    finally:
        for s in squatted:
            s.close()


async def test_a_restarted_server_gets_a_new_socket_and_the_client_follows(
        fake_binary, model_file):
    c = LocalClient(model_file, n_ctx=600, stream=False)
    c.config = lambda: llama_server.ServerConfig(  # type: ignore[method-assign]
        binary=fake_binary, model=model_file, n_ctx=600)
    first = await c.complete([{"role": "user", "content": "hi"}])
    [srv] = llama_server.running()
    srv.proc.kill()
    srv.proc.wait()
    second = await c.complete([{"role": "user", "content": "hi"}])     # a fresh server
    [srv2] = llama_server.running()
    assert srv2.socket_path != srv.socket_path and second.text == str(srv2.proc.pid)
    assert first.text != second.text
    await c.aclose()


def test_a_binary_without_unix_sockets_is_a_clear_error(tmp_path, model_file):
    old = tmp_path / "old-llama-server"     # an old llama.cpp: takes .sock for a host name
    old.write_text("#!/bin/sh\necho \"couldn't bind HTTP server socket, hostname: $4\"\nexit 1\n")
    old.chmod(0o755)
    with pytest.raises(ModelError, match="cannot listen on a Unix socket"):
        llama_server.get_server(llama_server.ServerConfig(binary=str(old), model=model_file))
