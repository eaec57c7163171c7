"""How the CLI shows the (stage, done, total) progress of the engine's long work on stderr: a tqdm bar per stage
on a terminal; elsewhere (a log file, cron, CI) one plain line when a stage starts, at each 10 % of it and at
least every 30 s, never a carriage return. The engine itself only calls the callback it is given.

A plain line: `ditto-fast: render: motion 1800/90000 frames (2 %), 45.1 fps, ETA 0:32:35`.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

EVERY_S = 30.0          # a plain line at least this often while a stage runs
RATE_AFTER_S = 1.0      # no rate (fps, ETA) on a line until the stage has run this long: over ~0 s it means nothing


def _clock_text(seconds: float) -> str:
    """H:MM:SS."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class ProgressReport:
    """A progress callback (stage, done, total) for the CLI: bars on a terminal, plain lines elsewhere."""

    def __init__(self, label: str, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, unit: str = "frames"):
        self.label, self.stream, self.clock, self.unit = label, stream or sys.stderr, clock, unit
        if self.stream is None:                 # stderr closed (2>&-): nothing to show it on
            tty = False
        self.tty = self.stream.isatty() if tty is None else tty
        self._stage: str | None = None
        self._bar = None
        self._t0 = self._last_t = 0.0
        self._last_step = self._last_done = -1

    def __call__(self, stage: str, done: int, total: int) -> None:
        """`done` of `total` units of `stage` are finished (a new stage name starts a new bar or line)."""
        total = max(int(total), int(done), 1)
        if stage != self._stage:
            self._start(stage, total)
        if self.tty:
            self._bar.total = total
            self._bar.update(done - self._bar.n)
            return
        now, step = self.clock(), 10 * done // total
        if done != self._last_done and (step > self._last_step or now - self._last_t >= EVERY_S):
            self._line(stage, done, total, now)
            self._last_step, self._last_done, self._last_t = step, done, now

    def _start(self, stage: str, total: int) -> None:
        self.close()
        self._stage, self._t0 = stage, self.clock()
        self._last_step = self._last_done = -1
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=self._name(stage), unit=self.unit.rstrip("s"),
                             dynamic_ncols=True, leave=False, file=self.stream)

    def _name(self, stage: str) -> str:
        """`render: motion`; the label alone for a stage named like it (`register`)."""
        return f"{self.label}:" if stage == self.label else f"{self.label}: {stage}"

    def _line(self, stage: str, done: int, total: int, now: float) -> None:
        text = f"ditto-fast: {self._name(stage)} {done}/{total} {self.unit} ({100 * done // total} %)"
        elapsed = now - self._t0
        if done and elapsed >= RATE_AFTER_S:
            rate = done / elapsed
            text += f", {rate:.1f} fps, ETA {_clock_text((total - done) / rate)}"
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (AttributeError, OSError, ValueError):  # no stderr, or its reader gone: the render goes on
            pass

    def close(self) -> None:
        """Take the bar off the terminal (plain lines need nothing)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._stage = None


def counted(report: ProgressReport) -> Callable[[int, str], Callable[[int], None]]:
    """A `progress(total, label) -> step(n=1)` factory (what registration takes) drawing on `report`."""
    def factory(total: int, label: str) -> Callable[[int], None]:
        count = [0]

        def step(n: int = 1) -> None:
            count[0] += n
            report(label, count[0], total)

        report(label, 0, total)
        return step

    return factory


__all__ = ["EVERY_S", "RATE_AFTER_S", "ProgressReport", "counted"]
