"""ggml in a child process, so that an abort is a finding and not the end of the run.

ggml stops the process on a failed check (``GGML_ASSERT`` prints ``file:line: GGML_ASSERT(cond)
failed`` and calls abort()), and a kernel that reads out of bounds may segfault. :class:`Worker`
runs ssm_ggml.engine's requests in a child process (a python running :func:`main`); when the
child dies, the call raises :class:`GgmlAbort` with the signal, the assert's line and the child's whole
stderr of that call, and the next call starts a new child.

Protocol: each message is an 8-byte little-endian length, then a pickle, on the child's stdin
(requests) and on a duplicate of its stdout (replies); the child points its own stdout at its
stderr so nothing ggml prints can get into the replies. stderr goes to a temporary file that the
parent reads from the offset where the call began. The child runs with GGML_NO_BACKTRACE=1 (a
backtrace through gdb would take seconds per abort).
"""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time

__all__ = ["GgmlAbort", "Worker", "main"]

_LEN = struct.Struct("<Q")
DEFAULT_TIMEOUT = 600.0


class GgmlAbort(RuntimeError):
    """The worker died during a call (an abort, a segfault, a timeout). ``assertion`` is ggml's
    ``GGML_ASSERT(...)`` line when there is one, ``stderr`` all it printed during the call,
    ``signal`` the signal's name ("SIGABRT", ...) or "" for an exit or a timeout."""

    def __init__(self, what: str, assertion: str, stderr: str, sig: str):
        self.assertion, self.stderr, self.signal = assertion, stderr, sig
        detail = assertion or _last_line(stderr)
        super().__init__(what + (f": {detail}" if detail else "") + (f"\nggml's stderr:\n{stderr.rstrip()}"
                                                                        if stderr.strip() else ""))


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


_ASSERT = re.compile(r"^.*GGML_ASSERT\(.*\) failed.*$|^.*GGML_ABORT.*$|^.*: error: .*$", re.MULTILINE)


def _assertion(text: str) -> str:
    m = _ASSERT.search(text)
    return m.group(0).strip() if m else ""


def _read_exact(fd: int, n: int, deadline: float) -> bytes | None:
    """n bytes from fd, or None at end of file (the child died). Raises TimeoutError."""
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


class Worker:
    """A child process running ssm_ggml.engine.execute. ``call(request)`` returns the reply or
    raises: the exception the engine raised (re-created here: GgmlError, OutputOverrun,
    GgmlNotFound, ValueError, TypeError; others as RuntimeError) or GgmlAbort. ``close()``
    ends the child."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._proc = None
        self._err = None

    def _start(self) -> None:
        self._err = tempfile.TemporaryFile(mode="w+b")
        env = {**os.environ, "GGML_NO_BACKTRACE": "1", "PYTHONUNBUFFERED": "1"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen([sys.executable, "-c", "from ssm_ggml.worker import main; main()"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, env=env,
                                      close_fds=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def call(self, request: dict):
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        self._err.seek(0, os.SEEK_END)
        start = self._err.tell()
        body = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._proc.stdin.write(_LEN.pack(len(body)) + body)
            self._proc.stdin.flush()
            deadline = time.monotonic() + self.timeout
            fd = self._proc.stdout.fileno()
            head = _read_exact(fd, _LEN.size, deadline)
            reply = None if head is None else _read_exact(fd, _LEN.unpack(head)[0], deadline)
        except TimeoutError:
            self._kill()
            raise self._abort(f"ggml did not answer within {self.timeout:g} s (the worker was stopped)",
                              start, "") from None
        except BrokenPipeError:
            reply = None
        if reply is None:
            code = self._proc.wait()
            self._proc = None
            sig = signal.Signals(-code).name if code < 0 else ""
            what = f"ggml stopped the process ({sig})" if sig else f"the ggml worker exited with status {code}"
            raise self._abort(what, start, sig)
        status, payload = pickle.loads(reply)
        if status == "ok":
            return payload
        raise _rebuild(*payload)

    def _abort(self, what: str, start: int, sig: str) -> GgmlAbort:
        self._err.seek(start)
        text = self._err.read().decode(errors="replace")
        return GgmlAbort(what, _assertion(text), text, sig)

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._kill()
            self._proc = None
        if self._err is not None:
            self._err.close()
            self._err = None


def _rebuild(kind: str, message: str, extra: dict) -> BaseException:
    from .graph import GgmlError, OutputOverrun
    from .lib import GgmlNotFound

    if kind == "OutputOverrun":
        return OutputOverrun(extra["device"], extra["packed"], extra["changed"], extra["first"])
    cls = {"GgmlError": GgmlError, "GgmlNotFound": GgmlNotFound, "ValueError": ValueError,
           "TypeError": TypeError, "MemoryError": MemoryError}.get(kind)
    return cls(message) if cls is not None else RuntimeError(f"{kind}: {message}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> None:
    """The child's loop: read a request, answer it, until stdin closes."""
    from .engine import execute, reset
    from .graph import OutputOverrun

    out = os.dup(1)
    os.dup2(2, 1)                       # ggml's prints go to stderr, never into a reply
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer.fileno()
    try:
        while True:
            head = _read_exact(inp, _LEN.size, float("inf"))
            if head is None:
                break
            req = pickle.loads(_read_exact(inp, _LEN.unpack(head)[0], float("inf")))
            try:
                reply = ("ok", execute(req))
            except Exception as e:  # reported to the parent, which raises it there
                extra = {}
                if isinstance(e, OutputOverrun):
                    extra = {"device": e.device, "packed": e.packed, "changed": e.changed, "first": e.first}
                reply = ("error", (type(e).__name__, str(e), extra))
            body = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            _write_all(out, _LEN.pack(len(body)) + body)
    finally:
        reset()


if __name__ == "__main__":
    main()
