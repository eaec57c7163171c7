"""The live sessions an engine process carries (`EngineSessions`), each on a thread of its own beside the render loop
and on the same loaded networks: started, fed speech, cleared, ended, watched and stopped by its parent's messages
(see live_link.py); its frames encoded for its parent while someone watches (live/relay.py), beside its file or
network stream if it has one; its figures sent each second, its end or failure said once."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ditto_fast.handles.live_link import LiveJob

STATS_EVERY_S = 1.0
PLAYBACK_EVERY_S = 0.04     # how often a session's playback is looked at (a frame at 25 fps)


class _Carried:
    """One session: its speech source, its LiveSession once it exists, whether a stop came first."""

    def __init__(self, job: LiveJob):
        from ditto_fast.live.pushed import PushedSource

        from ditto_fast.live.playback import Playback

        self.job = job
        self.source = PushedSource(f"live session {job.label or job.id}")
        self.playback = Playback()
        self.lock = threading.Lock()            # the source and the playback change together
        self.session: Any = None
        self.relay: Any = None
        self.watchers = 0
        self.stop_asked = threading.Event()


class EngineSessions:
    """The sessions of one engine process; `send(*message)` says things to its parent."""

    def __init__(self, renderer: Any, send: Callable[..., None]):
        self.renderer, self.send = renderer, send
        self._carried: dict[str, _Carried] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._fused = None                      # on a GPU, the sessions' warp + decode in one batch (shared_fused)
        self._windows: dict[int, Any] = {}      # and their LMDM windows, by step count (shared_windows)

    def _shared(self) -> dict[str, Any]:
        """What the sessions share on a GPU: one warp + decode batching their frames, and for each step count one
        DDIM sampler batching their windows; on a CPU nothing (each its own: a batch buys nothing there)."""
        if self.renderer.device.type != "cuda":
            return {}
        with self._lock:
            if self._fused is None:
                from ditto_fast.render.shared_fused import SharedFused

                self._fused = SharedFused(self.renderer.fused.twin())
            return {"fused": self._fused, "windows": self._windows_for}

    def _windows_for(self, steps: int) -> Any:
        """The DDIM sampler of `steps` steps the sessions share (made at its first use)."""
        from ditto_fast.motion.ddim import DDIMSampler
        from ditto_fast.motion.shared_windows import SharedWindows

        r = self.renderer
        with self._lock:
            if steps not in self._windows:
                self._windows[steps] = SharedWindows(DDIMSampler(r.lmdm, steps, r.config.motion.guidance, r.denoise))
            return self._windows[steps]

    def hear(self, message: tuple) -> None:
        """A parent's message about a session (from the engine's reader thread)."""
        kind = message[0]
        if kind == "live":
            job: LiveJob = message[1]
            carried = _Carried(job)
            with self._lock:
                self._carried[job.id] = carried
            thread = threading.Thread(target=self._run, args=(carried,), name=f"live-{job.id}", daemon=True)
            self._threads.append(thread)
            thread.start()
            return
        carried = self._carried.get(message[1])
        if carried is None:
            return                                  # ended already: late speech is dropped
        if kind == "live-pcm":
            samples = np.frombuffer(message[2], "<i2").astype(np.float32) / 32768.0
            band = None if message[3] is None else np.frombuffer(message[3], "<i2").astype(np.float32) / 32768.0
            with carried.lock:
                carried.playback.pushed(carried.source.received, len(samples))
                carried.source.push(samples, band)
        elif kind == "live-segment":
            with carried.lock:
                carried.playback.end_segment(carried.source.received)
        elif kind == "live-clear":
            with carried.lock:
                played = carried.session.played if carried.session is not None else (0, -1)
                events = carried.playback.interrupt(*played)
                if carried.session is not None:
                    carried.session.interrupt()
                    # a frame being written as it came may have read its speech before the silence: one more
                    through = carried.session.played[1] + 1
                else:
                    carried.source.clear()
                    through = -1
            for event in [*events, {"event": "cleared", "frame": through}]:
                self.send("live-event", carried.job.id, event)
        elif kind == "live-watch":
            carried.watchers = message[2]
            if carried.relay is not None:
                carried.relay.watch(message[2])
        elif kind == "live-stop":
            carried.stop_asked.set()
            if carried.session is not None:
                carried.session.stop()

    def stop_all(self, timeout: float = 30.0) -> None:
        """End every session cleanly (the engine stops), waiting up to `timeout` s for their files to close."""
        for carried in list(self._carried.values()):
            self.hear(("live-stop", carried.job.id))
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, carried: _Carried) -> None:
        from ditto_fast.core.errors import DittoError, one_line
        from ditto_fast.handles.outcome import out_of_memory
        from ditto_fast.live.start import stream_live

        sid = carried.job.id

        def started(session: Any) -> None:
            carried.session = session
            if carried.stop_asked.is_set():
                session.stop()
            self.send("live-ready", sid, {"avatar": carried.job.request.avatar, "size": list(session.avatar.size),
                                          "rate": str(session.s.rate)})
            threading.Thread(target=self._report, args=(carried,), name=f"live-{sid}-stats", daemon=True).start()

        def outputs(avatar: Any, settings: Any) -> Any:
            from ditto_fast.live.relay import Outputs, RelayOutput
            from ditto_fast.live.start import plate_pix_fmt, stream_output

            carried.relay = RelayOutput(avatar.size, settings.rate, plate_pix_fmt(avatar),
                                        lambda *media: self.send("live-media", sid, *media),
                                        preset=self.renderer.setup.preset)
            carried.relay.watch(carried.watchers)
            if carried.job.request.out is None:
                return carried.relay
            try:
                return Outputs(stream_output(self.renderer, carried.job.request, avatar, settings), carried.relay)
            except BaseException:
                carried.relay.abort()
                raise

        try:
            stats = stream_live(self.renderer, carried.job.request, carried.source, False,
                                lambda line: self.send("live-log", sid, line), started=started, output=outputs,
                                **self._shared())
        except DittoError as e:
            self.send("live-failed", sid, str(e), e.exit_code)
        except Exception as e:  # noqa: BLE001 - the parent says why the session failed
            why = "out of memory" if out_of_memory(e) else "the live session failed"
            self.send("live-failed", sid, one_line(f"{why}: {type(e).__name__}: {e}", 500), 1)
        else:
            self.send("live-ended", sid, stats)
        finally:
            with self._lock:
                self._carried.pop(sid, None)
            carried.stop_asked.set()                # its reporter stops

    def _report(self, carried: _Carried) -> None:
        """The session's playback events as its stream goes out, and its figures each second."""
        sid, beat = carried.job.id, 0
        while not carried.stop_asked.wait(PLAYBACK_EVERY_S):
            try:
                with carried.lock:
                    events = carried.playback.advance(*carried.session.played)
                for event in events:
                    self.send("live-event", sid, event)
                beat += 1
                if beat * PLAYBACK_EVERY_S >= STATS_EVERY_S:
                    beat = 0
                    self.send("live-stats", sid, carried.session.stats.summary(False), carried.source.taken)
            except OSError:
                return
