"""One progress line per phase on stderr, only when stderr is a terminal (or when asked)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`phase("reference run")` overwrites the previous line; `done()` clears it. The total
    time is measured from construction (the report prints it, terminal or not)."""

    def __init__(self, enabled: bool | None, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.start = time.perf_counter()
        self.marks: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def phase(self, name: str) -> None:
        self._close_current()
        self._current = (name, time.perf_counter())
        if self.enabled:
            self.stream.write(f"\r\033[Kbnfix validate: {name} ({self.elapsed():.0f} s)")
            self.stream.flush()

    def _close_current(self) -> None:
        if self._current is not None:
            name, began = self._current
            self.marks[name] = round(time.perf_counter() - began, 2)
            self._current = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def done(self) -> dict[str, float]:
        """Stop timing; returns seconds per phase plus "total"."""
        self._close_current()
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
        return {**self.marks, "total": round(self.elapsed(), 2)}
