"""64 simultaneous runs in one process (threads and asyncio): no cross-talk of output, files,
usage or traces. One scripted model is shared by all runs, as a real client would be."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import pytest

from helpers_scripted import SYSTEM_MARK
from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.obs.trace import load
from recursa.sandbox import LocalSandbox

N = 64

# Every run reads its own id from its context, makes (id % 5 + 1) sub-calls, writes a file
# with its id into its working directory, waits a little (so runs overlap), reads the file
# back and answers with everything it saw.
TURN_1 = """```repl
WRITE_FILES = {write}
import time
me = context.strip()
n = int(me.split('-')[1]) % 5 + 1
r = llm_batch([f'{me} q{j}' for j in range(n)])
if WRITE_FILES:
    open('mine.txt', 'w').write(me)
time.sleep(0.05)
seen = open('mine.txt').read() if WRITE_FILES else me
print(me, seen, r)
```"""
TURN_2 = """```repl
FINAL(me + '|' + seen + '|' + ','.join(r))
```"""


def shared_client(write_files: bool = False) -> ReplayClient:
    turn_1 = TURN_1.replace("{write}", str(write_files))

    def respond(messages):
        if SYSTEM_MARK not in messages[0]["content"]:
            return "ans:" + messages[-1]["content"]
        return turn_1 if len(messages) == 2 else TURN_2
    return ReplayClient(respond, cost_usd=0.001)


def expected(i: int) -> str:
    me = f"ctx-{i}"
    return f"{me}|{me}|" + ",".join(f"ans:{me} q{j}" for j in range(i % 5 + 1))


def check(i: int, res, trace_path) -> None:
    assert res.status == "final", (i, res.error)
    assert res.answer == expected(i)
    n = i % 5 + 1
    assert res.subcalls == n and res.usage["sub"].calls == n
    assert res.usage["root"].calls == 2
    assert res.cost_usd == pytest.approx(0.001 * (n + 2))
    run = load(trace_path)
    assert run.run_id == res.run_id and run.finished
    assert run.totals.subcalls == n and run.totals.cost_usd == pytest.approx(res.cost_usd)
    # the trace holds this run only
    ids = {json.loads(line).get("run_id") for line in open(trace_path)}
    assert ids == {res.run_id}
    assert run.query == f"q ctx-{i}"


def make_rlm(client, i, tmp_path, sandbox):
    return RLM(model=client, sandbox=sandbox, trace_path=tmp_path / f"run-{i}.jsonl",
               concurrency=8)


def test_64_runs_in_threads(tmp_path):
    client = shared_client()

    def one(i: int):
        # in-process cells share the host's cwd, so no files here (see the local test)
        return make_rlm(client, i, tmp_path, "inprocess").completion(f"q ctx-{i}",
                                                                     context=f"ctx-{i}")

    with concurrent.futures.ThreadPoolExecutor(N) as pool:
        results = list(pool.map(one, range(N)))
    for i, res in enumerate(results):
        check(i, res, tmp_path / f"run-{i}.jsonl")


async def test_64_runs_in_asyncio(tmp_path):
    client = shared_client()
    rlms = [make_rlm(client, i, tmp_path, "inprocess") for i in range(N)]
    results = await asyncio.gather(*(r.acompletion(f"q ctx-{i}", context=f"ctx-{i}")
                                     for i, r in enumerate(rlms)))
    for i, res in enumerate(results):
        check(i, res, tmp_path / f"run-{i}.jsonl")


@pytest.mark.slow
async def test_64_runs_with_local_sandboxes_keep_their_files(tmp_path):
    client = shared_client(write_files=True)

    def sandbox():
        return LocalSandbox(memory_mb=512)

    rlms = [make_rlm(client, i, tmp_path, sandbox) for i in range(N)]
    results = await asyncio.gather(*(r.acompletion(f"q ctx-{i}", context=f"ctx-{i}")
                                     for i, r in enumerate(rlms)))
    for i, res in enumerate(results):
        check(i, res, tmp_path / f"run-{i}.jsonl")
