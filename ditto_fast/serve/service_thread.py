"""A server's background thread (the lease's heartbeat, the callbacks' sender, the watch folder): a step, again and again, until the
server stops; a step that fails is logged and the next one runs (a locked queue passes, a bad item is one item)."""

from __future__ import annotations

import threading
from typing import Callable

RETRY_S = 1.0                   # the pause after a step that failed


class ServiceThread:
    """A daemon thread `name` running `step()` until `stop()`, pausing between steps the seconds `step` returns
    (cut short by `wake()`); a step's exception is logged (`event`: `name`) and the loop goes on."""

    def __init__(self, name: str, log: Callable[[dict], None]):
        self.name, self.log = name, log
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def step(self) -> float:
        """One round of the thread's work; returns the seconds to pause before the next."""
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        """Whether the thread runs (for /healthz)."""
        return self._thread.is_alive()

    def failed(self, e: Exception) -> float:
        """Say that a step failed (one log line); the seconds to pause before the next."""
        self.log({"event": self.name, "error": f"{self.name}: {type(e).__name__}: {e}"})
        return RETRY_S

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Run the next step now."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the step under way (waiting at most `timeout` seconds for it)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                pause = self.step()
            except Exception as e:  # noqa: BLE001 - one failed step must not end the thread
                pause = self.failed(e)
            self._wake.wait(pause)
            self._wake.clear()
