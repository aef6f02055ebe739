"""The pools' httpcore backend on plain asyncio streams (models/aionet.py) against real local
servers: plain HTTP, TLS (start_tls, certificate checks), refused connections and read
timeouts as httpx's errors; the pool uses it unless a proxy is set in the environment, and
makes its shards on demand. (Keep-alive, servers closing idle connections, chunked bodies and
streaming over it are in test_openai_http.py.)"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
from pathlib import Path

import pytest

from recursa.models._http import httpx
from recursa.models.aionet import AsyncioStream, AsyncioTransport
from recursa.models.httppool import LoopPool

BODY = b'{"ok": 1}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                      if h.lower().startswith(b"content-length")), 0)
            await reader.readexactly(n)
            writer.write(OK)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    writer.close()


def _limits() -> httpx.Limits:
    return httpx.Limits(max_connections=4, max_keepalive_connections=4)


async def test_plain_http_goes_over_asyncio_streams_and_keeps_its_connection() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = LoopPool(max_connections=8, tls=False, trust_env=False)
    try:
        for _ in range(2):
            async with pool.lease() as http:
                r = await http.post(f"http://127.0.0.1:{port}/x", content=b"{}")
                assert r.status_code == 200 and r.content == BODY
        assert len(pool._clients) == 1                       # one shard made, not all of them
        transport = pool._clients[0]._transport
        assert isinstance(transport, AsyncioTransport)
        conns = transport.pool.connections
        assert len(conns) == 1                               # kept alive and reused
        assert isinstance(conns[0]._connection._network_stream, AsyncioStream)
    finally:
        await pool.aclose()
        server.close()


async def test_a_proxy_in_the_environment_keeps_httpx_own_transport(monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    pool = LoopPool(max_connections=8, tls=False, trust_env=True)
    try:
        assert not isinstance(pool.get()._transport, AsyncioTransport)
    finally:
        await pool.aclose()
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("NO_PROXY", "*")                     # routes nothing through a proxy
    pool = LoopPool(max_connections=8, tls=False, trust_env=True)
    try:
        assert isinstance(pool.get()._transport, AsyncioTransport)
    finally:
        await pool.aclose()


async def test_refused_connections_and_silent_servers_are_httpx_errors() -> None:
    with socket.socket() as s:        # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with httpx.AsyncClient(transport=AsyncioTransport(
            ssl_context=ssl.create_default_context(), limits=_limits())) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"http://127.0.0.1:{port}/", timeout=0.2)
        finally:
            server.close()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_is_started_on_the_stream_and_the_certificate_checked(tmp_path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server = await asyncio.start_server(_serve, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/x"
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        transport = AsyncioTransport(ssl_context=trusting, limits=_limits())
        async with httpx.AsyncClient(transport=transport) as http:
            for _ in range(2):
                r = await http.post(url, content=b"{}")
                assert r.status_code == 200 and r.content == BODY
            stream = transport.pool.connections[0]._connection._network_stream
            assert stream.get_extra_info("ssl_object") is not None
            assert len(transport.pool.connections) == 1
        strict = AsyncioTransport(ssl_context=ssl.create_default_context(), limits=_limits())
        async with httpx.AsyncClient(transport=strict) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.post(url, content=b"{}")
    finally:
        server.close()
