"""Joining a Ray cluster (or starting one on this machine) for a batch or a server: within a time limit, with one
line for every way it can fail, and Ray's own prints kept off stdout."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
from urllib.parse import urlsplit

from ditto_fast.core.errors import InputError, UsageError

INSTALL_HINT = ('Ray is not installed; install it with: pip install -e ".[ray]" '
                '(or pip install "ray[client]>=2.9,<3")')
CLIENT_HINT = ('a ray:// address needs the Ray Client (grpcio), which this install lacks; install it with: '
               'pip install -e ".[ray]" (or pip install "ray[client]>=2.9,<3")')
TIMEOUT_ENV = "DITTO_FAST_RAY_TIMEOUT"
CONNECT_TIMEOUT_S = 30.0        # how long joining a cluster may take before we say it does not answer


def ray_module():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray: {INSTALL_HINT}") from None
    return ray

def start_ray(address: str, temp_dir: str | None = None):
    """Join the cluster at `address` (within `connect_timeout()` seconds), or start one on this machine for
    "local"; a running one is reused."""
    ray = ray_module()
    if address != "local":
        _check_address(address)
        timeout = connect_timeout()
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, _temp_dir=temp_dir)
        else:
            _join(ray, address, timeout)
    return ray

def connect_timeout() -> float:
    """Seconds to wait for a cluster to answer: $DITTO_FAST_RAY_TIMEOUT, else 30."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return CONNECT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 86400:
        raise UsageError(f"{TIMEOUT_ENV}={raw[:40]}: not a number of seconds; give e.g. 30 (or unset it)")
    return seconds

def _check_address(address: str) -> None:
    """A malformed address, or a ray:// one without the Ray Client installed, is bad usage (exit 2)."""
    client = address.startswith("ray://")
    if address != "auto":
        try:
            parts = urlsplit("//" + address.removeprefix("ray://"))
            ok = bool(parts.hostname) and bool(parts.port) and not (parts.path or parts.query or
                                                                         parts.fragment or parts.username)
        except ValueError:              # a port that is not a number, or out of range
            ok = False
        if not ok:
            raise UsageError(f"--ray {address[:200]}: not a Ray address; give local, auto, HOST:PORT (the head's "
                             "GCS port, 6379 by default) or ray://HOST:PORT (the Ray Client's, 10001 by default)")
    if client:
        try:
            import grpc  # noqa: F401 - what the Ray Client needs and the minimal `ray` lacks
        except ImportError:
            raise UsageError(f"--ray {address}: {CLIENT_HINT}") from None

def _join(ray, address: str, timeout: float) -> None:
    """ray.init(address) in a thread given `timeout` seconds: Ray itself retries an address that does not
    answer for about 12 minutes. A cluster that does not answer in time is exit 3, one that refuses us exit 3."""
    outcome: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(e)

    thread = threading.Thread(target=connect, name="ditto-fast-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():               # left to Ray's own retries; the process ends before they do
        raise InputError(f"--ray {address}: no Ray cluster answered within {timeout:g} s; check the address and "
                         f"that the cluster is up (or give it longer with {TIMEOUT_ENV}=SECONDS)")
    if outcome:
        e = outcome[0]
        why = _last_cause(e)
        if isinstance(e, ValueError):
            raise UsageError(f"--ray {address}: not an address Ray accepts ({why})") from None
        if isinstance(e, (ConnectionError, RuntimeError)):
            raise InputError(f"--ray {address}: cannot join the Ray cluster ({why})") from None
        raise e

def _last_cause(e: BaseException) -> str:
    """The last line of the innermost cause of `e` (Ray wraps why it could not connect, an authentication token
    missing say, as a traceback's text in a RuntimeError under a bare ConnectionError)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


@contextlib.contextmanager
def ray_session(address: str):
    """Ray joined (or started) at `address` for a batch, and left at its end if joined here. Meanwhile stdout is
    stderr: Ray prints its raylet's messages (a worker that died, say) on stdout, which is the batch's summary's."""
    ours = not ray_module().is_initialized()
    with contextlib.redirect_stdout(sys.stderr):
        try:
            yield start_ray(address)
        finally:
            ray = ray_module()
            if ours and ray.is_initialized():   # stops Ray's listener threads, flushes what they held
                ray.shutdown()
