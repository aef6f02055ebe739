"""What keeps a web page the user visits from driving `recursa serve`.

A page can send requests to a loopback server without the server's consent: a `text/plain` or
body-less POST needs no CORS preflight, and with DNS rebinding (a name the attacker controls
that resolves to 127.0.0.1) the page can even read the replies. Three checks, before any route
runs, close that:

* **Host** must name this server: the address it is bound to, a loopback name when it is bound
  to loopback, any IP literal or this machine's name when it is bound to all interfaces, or a
  name the user allowed (`--allow-host`). A rebinding page's requests carry its own name.
* **Origin**, when present (browsers send it on every cross-origin request and every POST),
  must be allowed (`--allow-origin`) or be this server's own origin. Allowed origins also get
  CORS headers (and answered preflights), so a browser-based chat UI the user trusts works.
* **POST bodies** must be declared `application/json`: every other type (or none) is one a
  page may send without a preflight. 415 otherwise.

Refusals use OpenAI's error shape. Clients that are not browsers (the openai SDK, curl, `llm`,
a chat UI's backend) send no Origin and the Host they connected to, so they are unaffected.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
WILDCARDS = ("", "0.0.0.0", "::")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def host_name(header: str) -> str:
    """The name in a Host header, lowercased, without the port (IPv6 literals unbracketed)."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return h[1:end] if end > 0 else h
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


@dataclass(frozen=True)
class RequestPolicy:
    """Which Host names and Origins a server accepts. Build it with `for_bind`."""

    hosts: frozenset[str]                 # names and IP literals (normalized); "*": any
    any_ip: bool = False                  # any IP literal (bound to all interfaces)
    loopback_ips: bool = False            # any loopback IP literal (bound to loopback)
    origins: frozenset[str] = frozenset()  # "scheme://host[:port]", lowercased; "*": any

    @classmethod
    def for_bind(cls, host: str, allow_hosts: Iterable[str] = (),
                 allow_origins: Iterable[str] = ()) -> RequestPolicy:
        bound = host.strip().lower().strip("[]")
        names = {bound}
        ip = _ip(bound)
        loopback = bound in LOOPBACK_NAMES or (ip is not None and ip.is_loopback)
        wildcard = bound in WILDCARDS
        if loopback or wildcard:
            names.update(LOOPBACK_NAMES)
        if wildcard:   # the machine's own names; an attacker cannot make a page send them
            names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
        names.update(host_name(h) if h != "*" else "*" for h in allow_hosts)
        return cls(hosts=frozenset(n for n in names if n), any_ip=wildcard,
                   loopback_ips=loopback or wildcard,
                   origins=frozenset(o.strip().rstrip("/").lower() for o in allow_origins))

    def host_allowed(self, header: str | None) -> bool:
        if header is None:      # HTTP/1.0 without a Host: not a browser
            return True
        name = host_name(header)
        if "*" in self.hosts or name in self.hosts:
            return True
        ip = _ip(name)
        if ip is None:
            return False
        return self.any_ip or (self.loopback_ips and ip.is_loopback) or str(ip) in self.hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        o = origin.strip().rstrip("/").lower()
        if "*" in self.origins or o in self.origins:
            return True
        # the server's own origin (its Host already passed): same-origin is no attack
        _scheme, sep, rest = o.partition("://")
        return bool(sep) and host is not None and rest == host.strip().lower()


def _refusal(status: int, message: str, code: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    return {"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode())]}, body


def is_json_type(content_type: str | None) -> bool:
    """`application/json`, with or without parameters (`; charset=utf-8`)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


class RequestGuard:
    """ASGI middleware: refuses requests by Host, Origin and a POST's Content-Type."""

    def __init__(self, app: ASGIApp, policy: RequestPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        host, origin = headers.get("host"), headers.get("origin")
        refusal = None
        if not self.policy.host_allowed(host):
            refusal = _refusal(403, f"Host {host!r} is not this server's address; a request "
                               "naming another host is how DNS rebinding reaches a local "
                               "server. Allow a name you use with --allow-host.",
                               "host_not_allowed")
        elif origin is not None and not self.policy.origin_allowed(origin, host):
            refusal = _refusal(403, f"Origin {origin!r} is not allowed: web pages may not "
                               "use this server unless you allow their origin with "
                               "--allow-origin.", "origin_not_allowed")
        elif scope["method"] == "POST" and not is_json_type(headers.get("content-type")):
            refusal = _refusal(415, "the request body must be sent as Content-Type: "
                               f"application/json (got {headers.get('content-type')!r})",
                               "unsupported_media_type")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        start, body = refusal
        await send(start)
        await send({"type": "http.response.body", "body": body})
