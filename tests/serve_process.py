"""A real `recursa serve` process for tests: started on a free port, waited for, stopped."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess(subprocess.Popen):  # type: ignore[type-arg]
    """The server process; a thread reads its output as it comes (so a chatty server never
    blocks on a full pipe) and `output()` returns what it printed so far."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.stdout is not None
        for line in self.stdout:
            self._lines.append(line)

    def output(self) -> str:
        if self.poll() is not None:
            self._reader.join(5)
        return "".join(self._lines)

    @property
    def printed_key(self) -> str | None:
        """The API key the server made up and printed at start (None if it printed none)."""
        m = re.search(r"API key \(clients send it as the OpenAI API key\): (\S+)", self.output())
        return m.group(1) if m else None


@contextlib.contextmanager
def recursa_serve(*args: str, start_timeout: float = 30.0
                  ) -> Iterator[tuple[str, ServeProcess]]:
    """`recursa serve ARGS --port P` with no provider keys in its environment; yields its base
    URL (http://127.0.0.1:P) and the process once /health answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = ServeProcess([sys.executable, "-m", "recursa.cli", "serve", *args,
                         "--port", str(port)],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.output()
            assert time.monotonic() < deadline, "recursa serve did not start"
            time.sleep(0.1)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
