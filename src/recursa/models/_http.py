"""httpx for recursa's HTTP clients, as httpx has it (the `recursa` command imports it leaner
first, in its own process: recursa.frontend.lean_imports)."""

import httpx

__all__ = ["httpx"]
