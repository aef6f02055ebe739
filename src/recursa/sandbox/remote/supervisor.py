"""recursa remote supervisor: runs worker.py inside a remote sandbox and carries its stdio.

A standalone, stdlib-only program uploaded next to worker.py and started as
``python3 -I -S supervisor.py [--text] [--pidfile F] -- python3 -I -S worker.py ...``.
It exists because provider SDKs differ in two ways the worker cannot paper over:

* Some give no way to kill one process they started (Modal's exec has none): closing the
  supervisor's stdin (or SIGTERM/SIGHUP, or killing it: the worker has PR_SET_PDEATHSIG) kills
  the worker's whole process group at once, even mid-cell.
* Some carry stdout only as decoded UTF-8 text (E2B, Daytona). With ``--text`` the byte stream
  travels as ASCII lines instead: the host writes ``W:<base64>\\n``, the supervisor writes
  ``R:<base64>\\n`` and, when the worker ends, ``X:<exit status>\\n``. Lines without a known
  prefix (a login shell's banner, an echo of the input) are ignored by both ends.

Without ``--text`` the bytes pass through unchanged.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    text = False
    pidfile = None
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--text":
            text = True
        elif opt == "--pidfile" and args:
            pidfile = args.pop(0)
        else:
            sys.stderr.write(f"supervisor: unknown option {opt!r}\n")
            return 2
    cmd = args[1:]
    if not cmd:
        sys.stderr.write("supervisor: usage: supervisor.py [--text] [--pidfile F] -- CMD...\n")
        return 2

    # Its own session and process group, so one killpg reaches everything it started.
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                            start_new_session=True)
    if pidfile:
        try:
            with open(pidfile, "w") as f:
                f.write(str(proc.pid))
        except OSError as exc:
            sys.stderr.write(f"supervisor: cannot write {pidfile}: {exc}\n")

    def kill_tree() -> None:
        for fn, target in ((os.killpg, proc.pid), (os.kill, proc.pid)):
            try:
                fn(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(signum: int, frame: object) -> None:
        kill_tree()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)

    assert proc.stdin is not None and proc.stdout is not None
    to_worker = proc.stdin.fileno()

    def pump_in() -> None:
        try:
            pending = b""
            while True:
                # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader
                # aborts the interpreter at exit.
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                if not text:
                    _write_all(to_worker, chunk)
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.startswith(b"W:"):
                        _write_all(to_worker, base64.b64decode(line[2:].strip()))
        except (OSError, ValueError):
            pass  # the worker is gone, or the host sent a broken line: end this incarnation
        # The host closed our input: it wants this incarnation gone, busy or not.
        kill_tree()

    threading.Thread(target=pump_in, name="pump-in", daemon=True).start()

    out = sys.stdout.fileno()
    from_worker = proc.stdout.fileno()
    try:
        while True:
            chunk = os.read(from_worker, 65536)
            if not chunk:
                break
            _write_all(out, b"R:" + base64.b64encode(chunk) + b"\n" if text else chunk)
    except OSError:
        kill_tree()
    rc = proc.wait()
    if text:
        try:
            _write_all(out, b"X:%d\n" % rc)
        except OSError:
            pass
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    code = main()
    # _exit: skip interpreter shutdown, which would wait on the still-blocked input thread.
    os._exit(code)
