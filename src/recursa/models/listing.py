"""The models a provider's server says it serves (`recursa models list`): Ollama's
`GET /api/tags`, or the OpenAI-style `GET {base_url}/models` (LM Studio, vLLM).

    names = await served_models(provider("ollama"))       # ["llama3.2:latest", ...]

A server that is down, slow or answers something else is a `ListError` whose message is one
line saying why; a listing never waits longer than `timeout` seconds.
"""

from __future__ import annotations

from typing import Any

from recursa.base.types import RecursaError
from recursa.models._http import httpx

from .providers import Provider

DEFAULT_TIMEOUT = 1.0


class ListError(RecursaError):
    """The server could not be asked for its models (the message says why, in one line)."""


async def served_models(p: Provider, *, base_url: str | None = None,
                        timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """The names of the models `p`'s server serves (at `base_url`, else where its row says)."""
    url = p.endpoint_url(base_url)
    if p.models_api is None:
        raise ListError(f"{p.prefix}: its server does not list models")
    if not url:
        how = f"set {p.url_env}" if p.url_env else "give its base URL"
        raise ListError(f"no server known: {how} to list its models")
    root = url.rstrip("/")
    if p.models_api == "ollama":
        target = (root[:-3] if root.endswith("/v1") else root) + "/api/tags"
        field, key = "models", "name"
    else:
        target, field, key = root + "/models", "data", "id"
    data = await _get_json(target, timeout)
    items = data.get(field) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ListError(f"{target} answered, but not with a list of models")
    return sorted(str(m[key]) for m in items if isinstance(m, dict) and m.get(key))


async def _get_json(url: str, timeout: float) -> Any:
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            r = await http.get(url, headers={"Accept": "application/json"})
    except httpx.TimeoutException:
        raise ListError(f"not reachable at {url} (no answer within {timeout:g} s)") from None
    except httpx.ConnectError:
        raise ListError(f"not reachable at {url} (no server answers there: is it "
                        "running?)") from None
    except httpx.HTTPError as e:
        why = " ".join(str(e).split())[:160] or type(e).__name__
        raise ListError(f"not reachable at {url} ({why})") from None
    if r.status_code != 200:
        raise ListError(f"{url} answered HTTP {r.status_code}")
    try:
        return r.json()
    except ValueError:
        raise ListError(f"{url} answered, but not with JSON") from None
