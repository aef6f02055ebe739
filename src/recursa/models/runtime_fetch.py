"""Pinned files of the local runtime, fetched from a package index's simple API.

Both ways to get `llama-server` start from one pinned file on PyPI: the llama-cpp-python sdist
(llama.cpp's sources, built here) and the xllamacpp wheel (llama.cpp's server, prebuilt). Only
bytes move over HTTP: pip never handles either file (`pip download` of an sdist runs its build
backend; an installed wheel would be importable by the host), and nothing reads one before its
size and SHA-256 matched the pins. `$PIP_INDEX_URL` names a mirror.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

from recursa.base.types import RecursaError

from ._http import httpx
from .fetch import sha256_file

INDEX_URL = "https://pypi.org/simple"   # PEP 503/691 simple API; $PIP_INDEX_URL for a mirror
ENV_INDEX = "PIP_INDEX_URL"

ProgressFn = Callable[[str], None]


class RuntimeError_(RecursaError):
    """The local runtime could not be fetched, built, found or started."""


@dataclass(frozen=True)
class Pinned:
    project: str     # the name on the index, e.g. "xllamacpp"
    version: str
    filename: str
    size: int
    sha256: str
    what: str        # for messages: "the llama.cpp sources"


def index() -> str:
    return os.environ.get(ENV_INDEX) or INDEX_URL


def file_url(client: httpx.Client, pin: Pinned, index_url: str) -> str:
    """The pinned file's download URL, from the index's simple API page for the project (its
    JSON form where the index has one, else the HTML one)."""
    page = f"{index_url.rstrip('/')}/{pin.project}/"
    r = client.get(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, "
                                            "text/html;q=0.1"})
    r.raise_for_status()
    if "json" in r.headers.get("content-type", ""):
        links = [str(f.get("url", "")) for f in r.json().get("files", [])
                 if f.get("filename") == pin.filename]
    else:
        links = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', r.text)]
    for link in links:
        url = urljoin(str(r.url), link.split("#", 1)[0])
        if url.rsplit("/", 1)[-1] == pin.filename:
            return url
    raise RuntimeError_(f"{page} lists no {pin.filename}")


def download(pin: Pinned, dest: Path, say: ProgressFn, *, local_copy_hint: str) -> Path:
    """Fetch `pin` into the directory `dest` and check it; the bytes are refused (and deleted)
    unless they are the pinned file."""
    from .tls import shared_ssl_context
    index_url = index()
    say(f"downloading {pin.what} ({pin.project}=={pin.version}, {pin.size / 1e6:.0f} MB) "
        f"from {index_url}")
    got = dest / pin.filename
    try:
        with httpx.Client(verify=shared_ssl_context(), follow_redirects=True,
                          timeout=httpx.Timeout(60.0)) as client:
            url = file_url(client, pin, index_url)
            with client.stream("GET", url) as r, open(got, "wb") as f:
                r.raise_for_status()
                n = 0
                for block in r.iter_bytes(1 << 20):
                    n += len(block)
                    if n > pin.size:    # not the pinned file: no need to take more of it
                        break
                    f.write(block)
    except httpx.HTTPError as e:
        got.unlink(missing_ok=True)
        raise RuntimeError_(f"downloading {pin.filename} from {index_url} failed: {e} (set "
                            f"{ENV_INDEX} to a mirror, or {local_copy_hint})") from None
    try:
        verify(pin, got)
    except RuntimeError_:
        got.unlink(missing_ok=True)
        raise
    return got


def verify(pin: Pinned, path: Path) -> None:
    """Refuse any file but the pinned one, before anything reads or extracts it."""
    digest = sha256_file(path) if path.is_file() else "(no such file)"
    if digest != pin.sha256:
        raise RuntimeError_(f"{path}: sha256 {digest} does not match the pinned {pin.filename} "
                            f"({pin.sha256}); refusing to use it")
