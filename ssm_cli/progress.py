"""A progress bar on stderr: redrawn in place on a terminal, one line per step with -v elsewhere,
silent otherwise (so pipes and logs stay clean)."""

from __future__ import annotations

import sys
import time


class Progress:
    WIDTH = 24

    def __init__(self, total: int, verbose: int = 0, stream=None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = self.tty or verbose > 0
        self.total = max(total, 1)
        self.done = 0
        self.t0 = time.perf_counter()
        self._width = 0

    def update(self, label: str, advance: int = 0) -> None:
        """Show ``label`` as the current step; ``advance`` steps are counted as done first."""
        self.done = min(self.done + advance, self.total)
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            filled = self.WIDTH * self.done // self.total
            bar = "#" * filled + "." * (self.WIDTH - filled)
            text = f"[{bar}] {self.done}/{self.total} {elapsed:5.0f} s  {label}"
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        elif advance == 0:  # a log line per step started
            self.stream.write(f"[{self.done}/{self.total} {elapsed:.0f} s] {label}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self._width = 0
