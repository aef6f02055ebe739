"""One TLS context for every client in the process.

Each SDK client otherwise builds its own SSL context and loads the whole CA bundle, 40-60 ms of
CPU that blocks the event loop; recursa makes clients per run, so that cost was most of a short
run's overhead. An SSLContext is safe to share between connections and threads.
"""

from __future__ import annotations

import functools
import os
import ssl


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if not cafile and not capath:
        import certifi  # what httpx trusts by default
        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)


@functools.cache
def plain_http_context() -> ssl.SSLContext:
    """What httpx builds for `verify=False`, built once: for clients of plain http:// URLs,
    which never do TLS. httpx would otherwise make a new SSLContext for every client
    (~0.3 ms each), and a pool makes a client per shard."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
