"""httpx for recursa's HTTP clients, imported without its command line (recursa.lean_imports):
import it from here, not directly, wherever recursa may be the first to import httpx."""

from recursa.lean_imports import import_httpx

import_httpx()

import httpx  # noqa: E402

__all__ = ["httpx"]
