"""The benchmark model server: tests/openai_testserver.py with a scripted responder, in its own
process on 127.0.0.1. Prints {"base_url": ...} on stdout; answers "stats" lines on stdin with the
responder's counters; stops when stdin closes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parent.parent / "tests")]

from _responders import Scripted  # noqa: E402

from openai_testserver import OpenAITestServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--responder", default="scripted")
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--dialect", default="recursa", choices=["recursa", "rlms"])
    a = ap.parse_args()
    responder = Scripted(a.dialect)
    with OpenAITestServer(responder=responder, latency=a.latency) as srv:
        print(json.dumps({"base_url": srv.base_url}), flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                st = responder.stats()
                st["requests"] = srv.request_count
                srv.reset()
                print(json.dumps(st), flush=True)


if __name__ == "__main__":
    main()
