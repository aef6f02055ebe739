"""Frames from the worker are untrusted: model-written code can find the protocol's private
descriptors and write frames of its own. Each attack here runs as a cell in the real local
sandbox; the host bounds every frame by its type before parsing, reads nothing between cells,
drops (and counts) frames it did not ask for, and kills a worker that breaks the protocol, ending
its run with a clear error while other runs carry on."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from helpers_procs import alive
from helpers_sandbox import run, started
from recursa.base.types import SandboxError

# Model-written code: the worker's channel and the running cell's id, found through gc, and a
# raw frame writer (under the channel's lock, so frames do not interleave with honest ones).
FORGE = (
    "import gc, json, os, struct, threading\n"
    "ch = [o for o in gc.get_objects() if type(o).__name__ == '_Channel'][0]\n"
    "wk = [o for o in gc.get_objects() if type(o).__name__ == 'Worker'][0]\n"
    "def raw(body):\n"
    "    data = struct.pack('>I', len(body)) + body\n"
    "    with ch._wlock:\n"
    "        view = memoryview(data)\n"
    "        while view:\n"
    "            view = view[os.write(ch.wfd, view):]\n"
    "def frame(msg):\n"
    "    raw(json.dumps(msg).encode())\n"
)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The host's peak resident memory while the block runs, sampled from a thread (a stalled
    event loop cannot sample)."""

    def __enter__(self) -> PeakRss:
        self.base = rss_mb()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()

    @property
    def growth(self) -> float:
        return self.peak - self.base


async def test_a_frame_of_nested_empty_objects_is_refused_before_parsing(tmp_path):
    sb = await started(tmp_path)
    try:
        await run(sb, "kept = 1")
        # 15 MiB: the size of an honest call, but ~5 million values (~400 MB once parsed).
        code = FORGE + (
            "pad = b'{},' * (5 << 20)\n"
            "raw(b'{\"type\": \"call\", \"id\": \"c9\", \"kind\": \"llm\", \"args\": {\"p\": ['"
            " + pad + b'{}]}}')\n"
            "import time; time.sleep(5)\n")
        with PeakRss() as mem:
            with pytest.raises(SandboxError, match="broke the protocol") as err:
                await run(sb, code)
        assert "JSON values" in str(err.value)
        assert mem.growth < 120, f"host grew by {mem.growth:.0f} MB"
        assert sb.session is not None and sb.session.breach
        assert not [p for p in sb.processes() if alive(p)], "the worker was killed"
        with pytest.raises(SandboxError, match="cannot be used again"):
            await run(sb, "print(1)")
    finally:
        await sb.close()


async def test_frames_sent_after_the_cell_wait_in_the_pipe_and_break_the_next_cell(tmp_path):
    sb = await started(tmp_path)
    try:
        # A thread keeps writing 1 MiB frames of empty objects after its cell returned.
        code = FORGE + (
            "def flood():\n"
            "    import time; time.sleep(0.2)\n"
            "    body = b'{\"type\": \"pong\", \"pad\": [' + b'{},' * 350000 + b'{}]}'\n"
            "    for _ in range(12):\n"
            "        raw(body)\n"
            "threading.Thread(target=flood, daemon=True).start()\n"
            "print('cell done')")
        with PeakRss() as mem:
            cell = await run(sb, code)
            assert cell.stdout == "cell done\n", cell
            await asyncio.sleep(2.5)
        assert mem.growth < 40, f"host grew by {mem.growth:.0f} MB between cells"
        with pytest.raises(SandboxError, match="broke the protocol"):
            await run(sb, "print('next')")
    finally:
        await sb.close()


async def test_a_forged_done_between_cells_is_dropped_and_counted(tmp_path):
    sb = await started(tmp_path)
    try:
        code = FORGE + (
            "def forge():\n"
            "    import time; time.sleep(0.2)\n"
            "    for cid in ('x2', 'x3', wk.current_cell or 'x1'):\n"
            "        frame({'type': 'done', 'id': cid, 'stdout': 'FORGED', 'stdout_chars': 6,\n"
            "               'final': 'forged answer', 'answer': {'content': 'forged answer',\n"
            "               'ready': True}})\n"
            "threading.Thread(target=forge, daemon=True).start()\n"
            "x = 41")
        cell = await run(sb, code)
        assert cell.error is None
        await asyncio.sleep(0.5)
        nxt = await run(sb, "print(x + 1)")
        assert nxt.stdout == "42\n" and nxt.final is None, nxt
        assert "ignored 3 messages" in nxt.stderr
        assert sb.session is not None and sb.session.dropped_frames == 3
        assert (await run(sb, "print('again')")).stderr == ""
    finally:
        await sb.close()


async def test_a_flood_of_small_unrequested_frames_breaks_the_protocol(tmp_path):
    sb = await started(tmp_path)
    try:
        code = FORGE + "for i in range(1000):\n    frame({'type': 'pong', 'id': i})\n"
        with pytest.raises(SandboxError, match="did not ask for"):
            await run(sb, code)
    finally:
        await sb.close()


async def test_a_forged_done_with_3mb_of_stdout_breaks_the_protocol(tmp_path):
    sb = await started(tmp_path)
    try:
        code = FORGE + (
            "frame({'type': 'done', 'id': wk.current_cell, 'stdout': 'A' * 3_000_000,\n"
            "       'stdout_chars': 1})\n"
            "import time; time.sleep(5)\n")
        with pytest.raises(SandboxError, match="stdout"):
            await run(sb, code, max_output_chars=4000)
    finally:
        await sb.close()


async def test_a_forged_done_cannot_pass_100k_variable_names(tmp_path):
    sb = await started(tmp_path)
    try:
        code = FORGE + (
            "frame({'type': 'done', 'id': wk.current_cell, 'stdout': 'forged\\n',\n"
            "       'stdout_chars': 7, 'variables': [f'v{i}' for i in range(100_000)]})\n"
            "import time; time.sleep(1)\n")
        cell = await run(sb, code)
        assert cell.stdout == "forged\n"    # the worker may lie about its own cell, boundedly
        assert len(cell.variables) == 1000
        nxt = await run(sb, "print('next')")   # the honest done of that cell: dropped
        assert nxt.stdout == "next\n" and "ignored 1 messages" in nxt.stderr
    finally:
        await sb.close()


async def test_a_frame_of_unknown_type_breaks_the_protocol(tmp_path):
    sb = await started(tmp_path)
    try:
        with pytest.raises(SandboxError, match="unknown type"):
            await run(sb, FORGE + "frame({'type': 'result', 'id': 'c1', 'value': 1})\n"
                              "import time; time.sleep(5)\n")
    finally:
        await sb.close()


async def test_calls_in_flight_are_bounded_in_bytes(tmp_path):
    held = {"now": 0, "peak": 0}

    async def handler(kind: str, args: dict[str, Any]) -> Any:
        size = len(args["prompt"])
        held["now"] += size
        held["peak"] = max(held["peak"], held["now"])
        await asyncio.sleep(2.5)   # long enough for every thread's call to be sent
        held["now"] -= size
        return "ok"

    sb = await started(tmp_path, handler=handler)
    try:
        code = ("import threading\n"
                "out = []\n"
                "def ask():\n"
                "    out.append(llm_query('p' * (8 << 20)))\n"
                "ts = [threading.Thread(target=ask) for _ in range(12)]\n"
                "[t.start() for t in ts]; [t.join() for t in ts]\n"
                "print(len(out), set(out))")
        cell = await run(sb, code, timeout=60)
        assert cell.stdout == "12 {'ok'}\n", cell
        # 64 MiB in flight, plus the one frame read before reading paused
        assert held["peak"] <= (64 + 8) << 20, held["peak"] / 2**20
    finally:
        await sb.close()


async def test_other_runs_feel_nothing(tmp_path):
    attacked = await started(tmp_path)
    other = await started(tmp_path)
    try:
        code = FORGE + (
            "raw(b'{\"type\": \"call\", \"id\": \"c9\", \"kind\": \"llm\", \"args\": {\"p\": ['"
            " + b'{},' * (5 << 20) + b'{}]}}')\n"
            "import time; time.sleep(5)\n")
        steps: list[float] = []

        async def meanwhile() -> None:
            for i in range(10):
                t0 = time.perf_counter()
                cell = await run(other, f"print({i} * 2)")
                steps.append(time.perf_counter() - t0)
                assert cell.stdout == f"{i * 2}\n" and cell.error is None, cell

        hit = asyncio.create_task(run(attacked, code))
        await meanwhile()
        with pytest.raises(SandboxError, match="broke the protocol"):
            await hit
        assert (await run(other, "print('still fine')")).stdout == "still fine\n"
    finally:
        await attacked.close()
        await other.close()


def test_the_value_count_ignores_separators_inside_strings():
    """`count_values` is an upper bound of a frame's JSON values that honest frames (prose full
    of commas) stay far under, whichever way it finds the strings."""
    import json
    import random

    from recursa.sandbox import protocol

    rng = random.Random(7)
    alphabet = ['a', ',', ':', '"', '\\', '{', '[', ' ', 'é']
    for _ in range(300):
        doc = {"s": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))),
               "l": [rng.choice(["x,y", 1, {"k:": "v,"}, [], "\\"]) for _ in range(5)]}
        body = json.dumps(doc, ensure_ascii=False).encode()
        inside = protocol._separators_in_strings(body, 1000)
        skeleton = protocol._STRING.sub(b'""', body)
        assert inside is not None
        assert protocol.quick_count(body) - inside == protocol.quick_count(skeleton), body
    prose = json.dumps({"type": "call", "args": {"prompt": "a, b: c, " * 200_000}}).encode()
    assert protocol.count_values(prose, protocol.LIMITS.values) < 3000
    objects = b'{"args": [' + b'{},' * 300_000 + b'{}]}'
    assert protocol.count_values(objects, protocol.LIMITS.values) > 300_000
