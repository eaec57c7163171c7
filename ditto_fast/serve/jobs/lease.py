"""A server's lease on the jobs it runs: who holds them (host, pid and that process's start, so a reused pid is not
taken for the same server; a random token per queue opened) and a heartbeat the server refreshes. A running job
whose lease is dead was left by a server that is gone."""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ditto_fast.serve.service_thread import ServiceThread

HEARTBEAT_EVERY_S = 5.0         # how often a server refreshes its lease
LEASE_EXPIRY_S = 60.0           # a lease not refreshed for this long is dead, whoever holds it


def process_start(pid: int) -> str | None:
    """What tells this run of process `pid` from a later one with the same pid: the boot's id and the process's
    start time in clock ticks since boot (/proc); None where there is no /proc or no such process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()      # after the command's name, which may hold spaces
    return f"{boot}:{fields[19]}"                      # field 22 of proc(5), starttime


def process_alive(pid: int, started: str | None) -> bool:
    """Whether process `pid` runs and is the one that started at `started` (process_start's value then)."""
    now = process_start(pid)
    if now is not None or started is not None:
        return now is not None and now == started
    try:                                               # no /proc: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Lease:
    """Who holds a running job: `token` names one opened queue (one server's start)."""

    token: str
    host: str
    pid: int
    started: str | None

    @classmethod
    def this_process(cls) -> "Lease":
        """A new lease for this process."""
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), process_start(os.getpid()))


def lease_alive(host: str, pid: int, started: str | None, heartbeat: float, now: float | None = None) -> bool:
    """Whether a lease still holds: refreshed within LEASE_EXPIRY_S and, on this host, its process still the one that
    took it (another host's process cannot be looked at: its heartbeat alone tells)."""
    now = time.time() if now is None else now
    if now - heartbeat > LEASE_EXPIRY_S:
        return False
    return host != socket.gethostname() or process_alive(pid, started)


class Heartbeat(ServiceThread):
    """Calls `beat` (the queue's heartbeat) every `every_s` seconds until stopped."""

    def __init__(self, beat: Callable[[], object], log: Callable[[dict], None], every_s: float = HEARTBEAT_EVERY_S):
        super().__init__("ditto-fast-heartbeat", log)
        self.beat, self.every_s = beat, every_s

    def step(self) -> float:
        self.beat()
        return self.every_s
