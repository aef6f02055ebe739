"""What one hosted-client call costs in CPU: the client's own work per call (request, attempt,
retry bookkeeping, reading the reply, usage and cost) plus a minimal server's, in microseconds.

    PYTHONPATH=src python benchmarks/bench_hosted_seam.py [--calls 3000] [--rounds 3]

`--calls` sequential `make_client("openai:gpt-5-mini", base_url=...).complete(...)` calls over
one keep-alive connection to an asyncio HTTP/1.1 server in the same process, which answers every
request with the same chat-completions reply (usage included). CPU is `time.process_time()`
over the calls (client and server both, after 100 warm-up calls); one figure per round, then
the range. Run it with another commit's `src` first on PYTHONPATH to compare two commits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from recursa.models import make_client

REPLY = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-5-mini",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "The answer is forty-two."}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7,
              "prompt_tokens_details": {"cached_tokens": 3}}}).encode()
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(REPLY)).encode() + b"\r\n\r\n" + REPLY)
MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the answer?"}]


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on a keep-alive connection with RESPONSE."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def one_round(calls: int) -> float:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = make_client("openai:gpt-5-mini", base_url=f"http://127.0.0.1:{port}/v1",
                         api_key="sk-bench")
    try:
        for _ in range(100):
            await client.complete(MESSAGES, max_tokens=64)
        t0 = time.process_time()
        for _ in range(calls):
            await client.complete(MESSAGES, max_tokens=64)
        return (time.process_time() - t0) / calls * 1e6
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    figures = [asyncio.run(one_round(args.calls)) for _ in range(args.rounds)]
    for i, us in enumerate(figures, 1):
        print(f"round {i}: {us:.0f} us of CPU per call ({args.calls} calls)")
    print(f"range: {min(figures):.0f}-{max(figures):.0f} us per call")


if __name__ == "__main__":
    main()
