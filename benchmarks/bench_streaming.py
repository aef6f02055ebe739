"""Time to first progress in `recursa serve`, with the upstream model streamed and not.

    PYTHONPATH=src python benchmarks/bench_streaming.py [--n 5] [--tps 50] [--ttft 0.3]

An upstream model (tests/openai_testserver.py, in its own process) answers each root turn after
`--ttft` seconds, then sends the reply at `--tps` tokens a second (4 characters a token; a
request that does not stream gets the whole reply after as long); the first turn's reply is about
120 tokens of code. The app `recursa serve` runs (create_app +
uvicorn, sandbox "local") is started twice, each in its own process: its OpenAI client streaming
(the default) and not (`stream=False`, how every turn went before streaming). One streaming chat
request goes to each in turn, `--n` times, and the client notes when chunks arrive:

  first chunk      the role chunk, sent as soon as the run starts
  first progress   the first progress chunk ("turn 1", before the model is called)
  first code       the first chunk carrying the root's reply as it is written (streaming only)
  reply seen       the earliest chunk that tells anything of the first reply as a whole: without
                   streaming, the first "code ran" line; with it, the same line, for reference
  done             the answer and [DONE]

Figures are medians in seconds from the request; "vs off" divides by the same figure without
streaming, measured in the same process pair, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"

REPLY_1 = ("I will count the words of the context, step by step.\n```repl\n"
           "words = context.split()\n"
           + "".join(f"n{i} = sum(1 for w in words if len(w) == {i})\n" for i in range(1, 9))
           + "print(len(words), n1, n2, n3)\n```\n")
REPLY_2 = 'That is the count.\n```repl\nFINAL(str(len(words)))\n```\n'


def responder(req: dict[str, Any]) -> str:
    turns = sum(m.get("role") == "assistant" for m in req.get("messages", []))
    return REPLY_1 if turns == 0 else REPLY_2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- child processes
def run_upstream(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(TESTS))
    from openai_testserver import OpenAITestServer
    with OpenAITestServer(responder=responder, latency=a.ttft, stream_chunk_chars=4,
                          stream_chunk_delay=1.0 / a.tps, pace_plain=True) as srv:
        print(json.dumps({"base_url": srv.base_url}), flush=True)
        sys.stdin.read()          # until the parent closes our stdin


def run_recursa(a: argparse.Namespace) -> None:
    from recursa.core.config import RLMConfig
    from recursa.models.openai_client import OpenAIClient
    from recursa.server.openai_app import ServerConfig, create_app, serve
    client = OpenAIClient("upstream-model", base_url=a.upstream, stream=a.stream == "on")
    app = create_app(ServerConfig(rlm=RLMConfig.build(model=client, sandbox="local",
                                                      max_iterations=4)))
    serve(app, host="127.0.0.1", port=a.port, log_level="warning")


def spawn(args: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def wait_up(base: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server at {base} exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"the server at {base} did not start")


# ---------------------------------------------------------------- one request
def one_request(base: str) -> dict[str, float | None]:
    body = {"model": "recursa", "stream": True, "messages": [
        {"role": "user", "content": "How many words are in the context?"}],
        "context": "the quick brown fox jumps over the lazy dog " * 50}
    marks: dict[str, float | None] = dict.fromkeys(
        ("first chunk", "first progress", "first code", "reply seen", "done"))
    answer = ""
    t0 = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter() - t0
            data = line[6:]
            if data == "[DONE]":
                marks["done"] = now
                break
            chunk = json.loads(data)
            if marks["first chunk"] is None:
                marks["first chunk"] = now
            p = chunk.get("recursa_progress")
            if p:
                if marks["first progress"] is None:
                    marks["first progress"] = now
                if p.get("phase") == "delta" and marks["first code"] is None:
                    marks["first code"] = now
                if p.get("line", "").startswith("code ran") and marks["reply seen"] is None:
                    marks["reply seen"] = now
            for ch in chunk.get("choices") or ():
                answer += (ch.get("delta") or {}).get("content") or ""
    if answer != str(len(body["context"].split())):
        raise SystemExit(f"wrong answer {answer!r}: the benchmark's run did not work")
    return marks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="requests per side")
    ap.add_argument("--tps", type=float, default=50.0, help="upstream tokens per second")
    ap.add_argument("--ttft", type=float, default=0.3, help="upstream seconds to first token")
    ap.add_argument("--role", choices=["bench", "upstream", "recursa"], default="bench",
                    help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stream", choices=["on", "off"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "upstream":
        return run_upstream(a)
    if a.role == "recursa":
        return run_recursa(a)

    procs: list[subprocess.Popen[str]] = []
    try:
        up = spawn(["--role", "upstream", "--tps", str(a.tps), "--ttft", str(a.ttft)])
        procs.append(up)
        assert up.stdout is not None
        upstream = json.loads(up.stdout.readline())["base_url"]
        sides: dict[str, str] = {}
        for mode in ("on", "off"):
            port = free_port()
            procs.append(spawn(["--role", "recursa", "--upstream", upstream,
                                "--port", str(port), "--stream", mode]))
            sides[mode] = f"http://127.0.0.1:{port}"
        for mode, base in sides.items():
            wait_up(base, procs[-1 if mode == "off" else -2])
            one_request(base)                                    # warm-up
        samples: dict[str, list[dict[str, float | None]]] = {m: [] for m in sides}
        for _ in range(a.n):
            for mode, base in sides.items():
                samples[mode].append(one_request(base))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    def med(mode: str, key: str) -> float | None:
        xs = [s[key] for s in samples[mode] if s[key] is not None]
        return statistics.median(xs) if xs else None

    load = os.getloadavg()[0]
    print(f"recursa serve: time to first progress - upstream {a.ttft:g} s to first token, then "
          f"{a.tps:g} tokens/s; {a.n} requests a side, interleaved; load average {load:.1f}")
    keys = ("first chunk", "first progress", "first code", "reply seen", "done")
    print(f"  {'':<24}" + "".join(f"{k:>16}" for k in keys))
    for mode in sides:
        label = "streaming on" if mode == "on" else "streaming off (before)"
        row = [med(mode, k) for k in keys]
        print(f"  {label:<24}" + "".join(f"{'-' if v is None else f'{v:.3f} s':>16}"
                                         for v in row))
    code_on, seen_off = med("on", "first code"), med("off", "reply seen")
    if code_on and seen_off:
        print(f"  the root's code first shows after {code_on:.3f} s streaming, against "
              f"{seen_off:.3f} s for the first news of the reply without ({code_on / seen_off:.2f}x)")


if __name__ == "__main__":
    main()
