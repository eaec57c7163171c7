"""The live sessions an engine process carries (`EngineSessions`), each on a thread of its own beside the render loop
and on the same loaded networks: started, fed speech, cleared, ended, watched and stopped by its parent's messages
(messages.py, live_link.py); its frames encoded for its parent while someone watches (live/relay.py), beside its file or
network stream if it has one; its figures sent each second, its end or failure said once."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ditto_fast.core.errors import one_line
from ditto_fast.handles import messages as m
from ditto_fast.handles.live_link import SessionOrder

STATS_EVERY_S = 1.0
PLAYBACK_EVERY_S = 0.04     # how often a session's playback is looked at (a frame at 25 fps)


class _Carried:
    """One session: its speech source, its LiveSession once it exists, whether a stop came first."""

    def __init__(self, order: SessionOrder):
        from ditto_fast.live.pushed import PushedSource

        from ditto_fast.live.playback import Playback

        self.order = order
        self.source = PushedSource(f"live session {order.label or order.id}")
        self.playback = Playback()
        self.lock = threading.Lock()            # the source and the playback change together
        self.session: Any = None
        self.relay: Any = None
        self.watchers = 0
        self.ends: list[int] = []              # answers' ends whose speech has not all come yet (SegmentEnd.at)
        self.stop_asked = threading.Event()
        self.why = "stop"                       # what ended it, when a stop did


class EngineSessions:
    """The sessions of one engine process; `send(message)` says things to its parent."""

    def __init__(self, renderer: Any, send: Callable[[m.SessionMessage], None]):
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
            if self._fused is None:        # each batch size captured now, before the first session streams
                from ditto_fast.core.graphs import BUCKETS
                from ditto_fast.engine.measurements import sample_inputs
                from ditto_fast.render.shared_fused import SharedFused

                self._fused = SharedFused(self.renderer.fused.twin(max_graphs=len(BUCKETS)))
                self._fused.warm(sample_inputs(self.renderer.fused, 1))
            return {"fused": self._fused, "windows": self._windows_for}

    def _windows_for(self, steps: int) -> Any:
        """The DDIM sampler of `steps` steps the sessions share (made at its first use)."""
        from ditto_fast.motion.ddim import DDIMSampler
        from ditto_fast.motion.shared_windows import SharedWindows

        r = self.renderer
        with self._lock:
            if steps not in self._windows:
                self._windows[steps] = SharedWindows(DDIMSampler(r.lmdm, steps, r.config.motion.guidance, r.denoise))
                self._windows[steps].warm()         # (the Denoiser's graphs: once for every step count)
            return self._windows[steps]

    def hear(self, message: m.SessionMessage) -> None:
        """A parent's message about a session (from the engine's reader thread)."""
        if isinstance(message, m.Open):
            carried = _Carried(message.order)
            with self._lock:
                self._carried[message.id] = carried
            thread = threading.Thread(target=self._run, args=(carried,), name=f"live-{message.id}", daemon=True)
            self._threads.append(thread)
            thread.start()
            return
        carried = self._carried.get(message.id)
        if carried is None:
            return                                  # ended already: late speech is dropped
        if isinstance(message, m.Speech):
            samples = np.frombuffer(message.pcm, "<i2").astype(np.float32) / 32768.0
            band = None if message.band is None else np.frombuffer(message.band, "<i2").astype(np.float32) / 32768.0
            with carried.lock:
                carried.playback.pushed(carried.source.received, len(samples))
                carried.source.push(samples, band)
                while carried.ends and carried.ends[0] <= carried.source.received:
                    carried.playback.end_segment(carried.ends.pop(0))
        elif isinstance(message, m.SegmentEnd):
            with carried.lock:
                if message.at <= carried.source.received and not carried.ends:
                    carried.playback.end_segment(message.at)
                else:                               # it overtook its speech (control goes first): when it comes
                    carried.ends.append(message.at)
        elif isinstance(message, m.Clear):
            self._clear(carried)
        elif isinstance(message, m.Watch):
            with carried.lock:
                carried.watchers = message.watchers
                if carried.relay is not None:
                    carried.relay.watch(message.watchers)
        elif isinstance(message, m.End):
            carried.why = message.why
            carried.stop_asked.set()
            if carried.session is not None:
                carried.session.stop(message.why)

    def _clear(self, carried: _Carried) -> None:
        """An interruption: the speech not yet taken dropped, what was taken silenced, the unfinished answers
        finished interrupted; answered `cleared` with the last frame that may still carry speech from before."""
        with carried.lock:
            carried.ends.clear()                    # their speech was dropped before it was sent: interrupted below
            played = carried.session.played if carried.session is not None else (0, -1)
            events = carried.playback.interrupt(*played)
            if carried.session is not None:
                carried.session.interrupt()
                # a frame being written as it came may have read its speech before the silence: one more
                through = carried.session.played[1] + 1
            else:
                carried.source.clear()
                through = -1
            for event in [*events, {"event": "cleared", "frame": through}]:    # before the reporter's next ones
                self.send(m.SessionEvent(carried.order.id, event))

    def stop_all(self, timeout: float = 30.0) -> None:
        """End every session cleanly (the engine stops), waiting up to `timeout` s for their files to close."""
        for carried in list(self._carried.values()):
            self.hear(m.End(carried.order.id, "engine stopped"))
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, carried: _Carried) -> None:
        from ditto_fast.core.errors import DittoError
        from ditto_fast.handles.outcome import out_of_memory
        from ditto_fast.live.start import stream_live

        sid = carried.order.id

        def started(session: Any) -> None:
            carried.session = session
            if carried.stop_asked.is_set():
                session.stop(carried.why)
            self.send(m.SessionReady(sid, {"avatar": carried.order.request.avatar, "size": list(session.avatar.size),
                                          "rate": str(session.s.rate)}))
            threading.Thread(target=self._report, args=(carried,), name=f"live-{sid}-stats", daemon=True).start()

        def outputs(avatar: Any, settings: Any) -> Any:
            from ditto_fast.live.relay import Outputs, RelayOutput
            from ditto_fast.live.start import plate_pix_fmt, stream_output

            relay = RelayOutput(avatar.size, settings.rate, plate_pix_fmt(avatar),
                                lambda *media: self.send(m.SessionMedia(sid, *media)), preset=self.renderer.setup.preset)
            with carried.lock:                      # a Watch heard meanwhile is not lost
                carried.relay = relay
                relay.watch(carried.watchers)
            if carried.order.request.out is None:
                return carried.relay
            try:
                return Outputs(stream_output(self.renderer, carried.order.request, avatar, settings), carried.relay)
            except BaseException:
                carried.relay.abort()
                raise

        try:
            stats = stream_live(self.renderer, carried.order.request, carried.source, False,
                                lambda line: self.send(m.SessionLog(sid, line)), started=started, output=outputs,
                                **self._shared())
        except DittoError as e:
            self._last_word(m.SessionFailed(sid, str(e), e.exit_code))
        except Exception as e:  # noqa: BLE001 - the parent says why the session failed
            why = "out of memory" if out_of_memory(e) else "the live session failed"
            self._last_word(m.SessionFailed(sid, one_line(f"{why}: {type(e).__name__}: {e}", 500), 1))
        else:
            self._last_word(m.SessionEnded(sid, stats))
        finally:
            with self._lock:
                self._carried.pop(sid, None)
            carried.stop_asked.set()                # its reporter stops

    def _last_word(self, message: m.SessionMessage) -> None:
        """A session's end said to the parent; a parent gone (its wire cut) hears nothing more."""
        try:
            self.send(message)
        except OSError:
            pass

    def _report(self, carried: _Carried) -> None:
        """The session's playback events as its stream goes out, and its figures each second."""
        sid, beat, said = carried.order.id, 0, False
        while not carried.stop_asked.wait(PLAYBACK_EVERY_S):
            try:
                with carried.lock:                  # sent as decided: an interruption's events cannot pass them
                    for event in carried.playback.advance(*carried.session.played):
                        self.send(m.SessionEvent(sid, event))
                beat += 1
                if beat * PLAYBACK_EVERY_S >= STATS_EVERY_S:
                    beat = 0
                    self.send(m.SessionStats(sid, carried.session.stats.summary(), carried.source.taken,
                                             carried.session.unsent))
            except OSError:
                return
            except Exception as e:  # noqa: BLE001 - said once; the session's events go on at the next look
                if not said:
                    self.send(m.SessionLog(sid, one_line(f"live: its events missed a beat: {type(e).__name__}: {e}")))
                said = True
