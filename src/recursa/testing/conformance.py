"""The conformance suite every hosted provider passes, as a kit for a provider plugin's tests.

    # tests/test_conformance.py of recursa-theirs
    from recursa.testing.conformance import ProviderConformance

    class TestTheirProvider(ProviderConformance):
        prefixes = ["theirs"]
        wires = [TheirFakeWire]     # only for a wire recursa's fake does not speak

Each prefix's client is built by its spec (`PREFIX:EXAMPLE`, the Provider's example model) with
`base_url=`, `api_key=` and `http_client=` (an httpx.AsyncClient over a `WireFake` of
recursa.testing.wire, through httpx's MockTransport) and must show the shared control flow's
behaviour: a 429's Retry-After honoured and a 400 not retried, an empty reply retried once, a
cut body or stream retried, usage and cost read the same way streamed or not, a malformed usage
field failing the call (and a run) clearly, a cancelled call leaving nothing behind, and the key
in no repr, error or trace. Each test runs in an event loop of its own (`asyncio.run`), so the
kit needs pytest only, no async plugin. This module imports pytest: only tests import it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from recursa.base.extras import MissingExtra
from recursa.base.types import ModelError, Usage
from recursa.core.rlm import RLM
from recursa.models import make_client, prefixes, provider
from recursa.models.pricing import charge, status
from recursa.models.streaming import StreamCut

from .wire import PIECES, USAGE, Step, Wire, WireFake

__all__ = ["BASE_URL", "KEY", "Kit", "ProviderConformance", "hosted_prefixes"]

KEY = "sk-conformance-7f3a9c2e-secret"
BASE_URL = "http://provider.test/v1"
USER = [{"role": "user", "content": "What is the answer?"}]
FINAL = '```repl\nFINAL("forty-two")\n```'


def hosted_prefixes(slow: Collection[str] = ()) -> list[Any]:
    """Every registered provider that takes a `base_url=` (recursa's own, installed plugins'
    and registered ones), for `ProviderConformance.prefixes`; those in `slow` marked slow."""
    out: list[Any] = []
    for prefix in prefixes():
        p = provider(prefix)
        if p is not None and p.endpoint:
            out.append(pytest.param(prefix, marks=pytest.mark.slow) if prefix in slow
                       else prefix)
    return out


class Kit:
    """One test's provider and fake: `build(**options)` makes the provider's client over the
    fake (closed when the test ends)."""

    def __init__(self, prefix: str, fake: WireFake, tmp_path: Path) -> None:
        self.prefix = prefix
        self.fake = fake
        self.tmp_path = tmp_path
        self._open: list[Any] = []

    def build(self, **options: Any) -> Any:
        """The provider's client over the fake: an httpx AsyncClient, or an httpx2 one where
        the provider's SDK takes only those (the `anthropic` SDK says so, naming it)."""
        p = provider(self.prefix)
        if p is None:
            raise ValueError(f"no provider is registered for the prefix {self.prefix!r} "
                             "(is the plugin that adds it installed?)")
        options.setdefault("retry_base_delay", 0.001)
        for http in self.fake.http_clients():
            try:
                client = make_client(f"{self.prefix}:{p.example or 'model'}",
                                     base_url=BASE_URL, api_key=KEY, http_client=http,
                                     **options)
            except MissingExtra as e:
                pytest.skip(str(e))
            except TypeError as e:
                if "httpx2" in str(e):
                    continue
                raise
            self._open.append(client)
            return client
        raise AssertionError(f"{self.prefix}: no HTTP client of the fake was taken")

    async def aclose(self) -> None:
        while self._open:
            await self._open.pop().aclose()


Case = TypeVar("Case", bound=Callable[..., Coroutine[Any, Any, None]])


def _in_a_loop(case: Case) -> Case:
    """The test pytest runs: the async `case` in an event loop of its own, its clients closed
    before the loop ends. (A plain function, so no async plugin takes it for its own.)"""
    def test(self: Any, kit: Kit, **params: Any) -> None:
        async def main() -> None:
            try:
                await case(self, kit, **params)
            finally:
                await kit.aclose()
        asyncio.run(main())

    test.__name__, test.__qualname__, test.__doc__ = \
        case.__name__, case.__qualname__, case.__doc__
    test.__signature__ = inspect.signature(case)  # type: ignore[attr-defined]
    return test  # type: ignore[return-value]


def _collect() -> tuple[list[tuple[str, int]], Callable[[str, int], None]]:
    got: list[tuple[str, int]] = []
    return got, lambda piece, offset: got.append((piece, offset))


def _streams(client: Any) -> None:
    if not client.capabilities.streaming:
        pytest.skip(f"{client.name} does not stream")


class ProviderConformance:
    """The suite. Subclass it as a `Test...` class in a test module and set `prefixes`.

    `prefixes`: the providers to check (prefixes, or `pytest.param`s of them;
    `hosted_prefixes()` for every registered one). `wires`: `recursa.testing.wire.Wire`
    subclasses for wires the fake does not speak yet, tried before recursa's. `env`: variables
    set while a test runs (a SigV4 provider signs for a region)."""

    prefixes: Sequence[Any] = ()
    wires: Sequence[type[Wire]] = ()
    env: Mapping[str, str] = {"AWS_REGION": "us-east-1"}

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "prefix" in metafunc.fixturenames:
            if not self.prefixes:
                raise ValueError(f"{type(self).__name__}: set `prefixes` to the provider "
                                 "prefixes to check (hosted_prefixes() for every one)")
            metafunc.parametrize("prefix", list(self.prefixes))

    @pytest.fixture
    def kit(self, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Kit:
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        return Kit(prefix, WireFake(wires=self.wires), tmp_path)

    # -------------------------------------------------------------- the suite
    @_in_a_loop
    async def test_usage_and_cost_are_read_the_same_streamed_or_not(self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        comp = await client.complete(USER, max_tokens=64)
        assert comp.text == fake.text and len(fake.requests) == 1, comp.text
        want = Usage(input_tokens=USAGE[0], output_tokens=USAGE[1], cached_tokens=USAGE[2])
        assert comp.usage == want, f"usage {comp.usage!r}, want {want!r}"
        pricing = client.capabilities.pricing
        assert comp.cost_usd == charge(pricing, comp.usage, model=comp.model)
        if status(pricing) == "known":
            assert comp.cost_usd is not None and comp.cost_usd > 0
        assert comp.latency_s > 0 and client.stats.retries == 0
        if client.capabilities.streaming:
            got, on_delta = _collect()
            streamed = await client.astream(USER, on_delta, max_tokens=64)
            pieces = [p for p, _ in got]
            if fake.served[-1].stream:      # a wire that sends whole replies: one piece
                assert pieces == list(PIECES), pieces
            assert "".join(pieces) == comp.text, pieces
            assert [o for _, o in got] == [sum(map(len, pieces[:i]))
                                           for i in range(len(pieces))], got
            assert streamed.text == comp.text and streamed.usage == comp.usage
            assert streamed.cost_usd == comp.cost_usd and streamed.model == comp.model

    @_in_a_loop
    async def test_a_429_waits_as_retry_after_says_and_a_400_is_not_retried(
            self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build(retry_base_delay=5.0)  # a backoff takes seconds
        fake.script(Step.status_of(429, retry_after="0.05"))
        t0 = time.perf_counter()
        assert (await client.complete(USER)).text == fake.text
        waited = time.perf_counter() - t0
        assert 0.05 <= waited < 2.0, f"waited {waited:.3f} s for a Retry-After of 0.05 s"
        assert client.stats.retries == 1 and client.stats.slept_s == pytest.approx(0.05)
        fake.script(Step.status_of(400))
        with pytest.raises(ModelError) as ei:
            await client.complete(USER)
        assert ei.value.status == 400 and not ei.value.retryable, repr(ei.value)
        assert len(fake.requests) == 3 and client.stats.retries == 1

    @_in_a_loop
    async def test_an_empty_reply_is_retried_once_then_an_error(self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        fake.script(Step.empty())
        assert (await client.complete(USER)).text == fake.text
        fake.script(Step.empty(), Step.empty(), Step.empty())
        with pytest.raises(ModelError, match="returned no text"):
            await client.complete(USER)
        assert len(fake.requests) == 4, f"{len(fake.requests)} requests, want 4"

    @_in_a_loop
    async def test_a_cut_body_is_retried(self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        fake.script(Step.cut())
        assert (await client.complete(USER)).text == fake.text
        assert client.stats.retries == 1 and len(fake.requests) == 2, client.stats

    @_in_a_loop
    async def test_a_cut_stream_is_retried_from_the_start_or_fails_clearly(
            self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        _streams(client)
        fake.script(Step.cut(2))
        got, on_delta = _collect()
        comp = await client.astream(USER, on_delta)
        if not fake.served[0].stream:
            pytest.skip(f"{kit.prefix}: its wire sends whole replies (a cut one is a cut "
                        "body, tested above)")
        assert comp.text == fake.text and client.stats.retries == 1, client.stats
        assert [o for _, o in got].count(0) == 2, got     # the retry starts again at 0
        cut = len(PIECES[0] + PIECES[1])
        assert f"cut after {cut} characters" in client.stats.last_errors[0]
        once = kit.build(max_retries=0)
        fake.script(Step.cut(2))
        with pytest.raises(StreamCut, match=f"stream was cut after {cut} characters") as ei:
            await once.astream(USER, lambda *_: None)
        assert ei.value.retryable and "provider.test" in str(ei.value)

    @_in_a_loop
    async def test_a_malformed_usage_field_is_a_model_error_naming_it(self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        fake.script(Step.bad_usage("many"))
        try:
            comp = await client.complete(USER)
        except ModelError as e:
            assert not e.retryable and "'many'" in str(e), repr(e)
            assert len(fake.requests) == 1 and client.stats.failures == 1
        else:   # the provider's library repaired the usage before recursa read it (LiteLLM)
            counts = comp.usage.model_dump().values()
            assert all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                       for n in counts), comp.usage

    @pytest.mark.parametrize("streamed", [False, True], ids=["complete", "astream"])
    @_in_a_loop
    async def test_a_cancelled_call_stops_at_once_and_leaves_the_client_usable(
            self, kit: Kit, streamed: bool) -> None:
        fake, client = kit.fake, kit.build()
        if streamed:
            _streams(client)
        fake.script(Step.hang())
        call = client.astream(USER, lambda *_: None) if streamed else client.complete(USER)
        task = asyncio.create_task(call)
        for _ in range(200):
            if fake.requests:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(fake.requests) == 1
        assert client.stats.retries == 0 and client.stats.failures == 0, client.stats
        assert (await client.complete(USER)).text == fake.text

    @_in_a_loop
    async def test_the_key_is_in_no_repr_error_or_trace(self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build()
        for shown in (repr(client), str(client), repr(client.capabilities),
                      repr(client.stats)):
            assert KEY not in shown, shown
        fake.script(Step.status_of(401))
        with pytest.raises(ModelError) as ei:
            await client.complete(USER)
        assert KEY not in str(ei.value) and KEY not in repr(ei.value), repr(ei.value)
        sent = fake.requests[-1]
        assert any(KEY in value for value in sent.headers.values()), \
            "the key was not sent in a header"
        assert KEY not in sent.content.decode(), "the key is in the request's body"
        assert KEY not in str(sent.url), "the key is in the request's URL (and so in logs)"
        fake.pieces = (FINAL,)
        trace = kit.tmp_path / "trace.jsonl"
        res = await RLM(client, sandbox="inprocess", trace_path=trace,
                        preflight=False).acompletion("What is the answer?", "context")
        assert res.status == "final" and res.answer == "forty-two", res
        assert KEY not in trace.read_text() and KEY not in repr(res)

    @_in_a_loop
    async def test_a_malformed_usage_field_ends_a_run_with_an_error_and_its_trace_finished(
            self, kit: Kit) -> None:
        fake, client = kit.fake, kit.build(max_retries=2)
        fake.pieces = (FINAL,)
        fake.script(Step.bad_usage("many"))
        trace = kit.tmp_path / "trace.jsonl"
        res = await RLM(client, sandbox="inprocess", trace_path=trace,
                        preflight=False).acompletion("What is the answer?", "context")
        events = [json.loads(line) for line in trace.read_text().splitlines()]
        assert (events[-1]["kind"], events[-1]["phase"]) == ("run", "end"), events[-1]
        assert events[-1]["data"]["status"] == res.status
        if res.status != "final":    # (a library that repairs usage: see the test above)
            assert res.status == "error" and "'many'" in (res.error or ""), res
            assert len(fake.requests) == 1                   # not retried
