"""A live session's process (`python -c ... live_child FD PARENT_PID`), one per session: loads the networks, then
streams as `ditto-fast live --audio-in -` does, the speech coming as s16le 16 kHz mono on its stdin (the server
writes what the session's WebSocket brings). A render that dies elsewhere in the server does not touch it, nor it
them. It dies with its parent.

Messages in: ("start", setup, request, live options), ("stop",).
Messages out: ("ready", info), ("log", line), ("stats", summary) each second, ("ended", summary),
("failed", line, exit_code)."""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

from ditto_fast.handles.child import _Channel, _die_with_parent

STATS_EVERY_S = 1.0


def _listen(conn: Connection, stop: threading.Event, session: list) -> None:
    """Wait for ("stop",) or the parent gone; then end the session (or the start under way)."""
    try:
        while conn.recv()[0] != "stop":
            pass
    except (EOFError, OSError):
        pass
    stop.set()
    if session:
        session[0].stop()


def _report(channel: _Channel, session, stop: threading.Event) -> None:
    while not stop.wait(STATS_EVERY_S):
        try:
            channel.send("stats", session.stats.summary(False))
        except OSError:
            return


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the server ends sessions; a Ctrl-C is its to handle
    faulthandler.enable()
    conn = Connection(fd)
    channel = _Channel(conn)
    _, setup, request, options = conn.recv()
    import ditto_fast.media.ffpipe as ffpipe
    from ditto_fast.core.errors import DittoError, one_line

    ffpipe.FFMPEG_OWN_SESSION = False       # this process's group: its ffmpegs die with it
    stop, session = threading.Event(), []
    threading.Thread(target=_listen, args=(conn, stop, session), name="live-listen", daemon=True).start()
    try:
        from ditto_fast.engine.renderer import Renderer
        from ditto_fast.live.sources import AudioSource
        from ditto_fast.live.start import check_live, stream_live

        request, checked = check_live(request, options, setup.config)
        t0 = time.perf_counter()
        renderer = Renderer(setup=setup)
        source = AudioSource("the session's audio", fd=sys.stdin.fileno())

        def started(s) -> None:
            session.append(s)
            if stop.is_set():
                s.stop()
            channel.send("ready", {"load_seconds": round(time.perf_counter() - t0, 3)})
            threading.Thread(target=_report, args=(channel, s, stop), name="live-report", daemon=True).start()

        stats = stream_live(renderer, request, checked, options, source, False, lambda line: channel.send("log", line),
                            started=started)
    except DittoError as e:
        channel.send("failed", str(e), e.exit_code)
        return 0
    except Exception as e:  # noqa: BLE001 - the server says why the session failed
        channel.send("failed", one_line(f"the live session failed: {type(e).__name__}: {e}", 500), 1)
        return 0
    finally:
        stop.set()
    channel.send("ended", stats)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
