"""`serve`'s live sessions: each one work for an engine of the engine host (ditto_fast/handles/), carried beside its
render jobs on the networks it has loaded and supervised as they are (heartbeat, stall limit, memory cap, its GPU),
streaming an avatar to a `.ts`/`.m3u8` under the roots or to a network URL, fed the PCM its WebSocket brings
(resampled here to 16 kHz). While any session streams, no queued render starts (a running one finishes): a session
keeps its rate. A session without a client for `idle_timeout` seconds ends, as DELETE ends it: cleanly, its file
playable. This module starts no process: it asks an engine handle to open each session."""

from __future__ import annotations

import secrets
from fractions import Fraction
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ditto_fast.core.errors import DittoError, UsageError, one_line
from ditto_fast.core.files import shown
from ditto_fast.handles.base import EngineHandle
from ditto_fast.handles.live_link import SessionOrder, LiveLink
from ditto_fast.live.options import LIVE_KEYS, LiveRequest
from ditto_fast.live.outputs import describe_destination
from ditto_fast.live.start import check_launch, check_live
from ditto_fast.live.states import ACTIVE as SESSION_ACTIVE, IDLE, STATES as SESSION_STATES, with_idle
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE
from ditto_fast.serve.checks import check_utf8, confine
from ditto_fast.serve.live.playlists import OpenPlaylists
from ditto_fast.serve.live.whep import WhepViewers

STATES = with_idle(SESSION_STATES)     # a live session's states, and idle: no client, nothing left to say
ACTIVE = with_idle(SESSION_ACTIVE)
QUEUED_AUDIO_S = 600            # seconds of speech a client may send ahead of the stream
END_WAIT_S = 30.0               # how long DELETE waits for a session's file to be finished
KEPT_ENDED = 100                # ended sessions still answered by GET


class ServedSession:
    """One live session as this server serves it: its request, the link to the engine that carries it, its audio
    client and its times."""

    def __init__(self, sid: str, request: LiveRequest, log: Callable[[dict], None],
                 viewers: Callable[[str], int] = lambda sid: 0):
        self.id, self.request, self.log, self.viewers = sid, request, log, viewers
        self.created, self.started, self.finished = time.time(), None, None
        self.link: LiveLink | None = None
        self.engine: EngineHandle | None = None
        self.pid: int | None = None
        self.error: str | None = None
        self.clients = 0
        self.idle_since: float | None = None        # when it last became idle (no client, nothing left to say)
        self.received = 0               # samples (16 kHz) handed to the session
        self._listeners: list[Callable[[Any], None]] = []

    def heard(self, event: str, detail: Any) -> None:
        """What the session's engine says of it (its link's events), into the server's log."""
        if event == "ready":
            self.started = time.time()
            self.log({"live": self.id, "state": self.state, "engine": self.link.engine, "pid": self.pid})
        elif event == "log":
            self.log({"live": self.id, "said": detail})
        elif event == "event":                  # playback, for the audio client
            for listen in list(self._listeners):
                listen(detail)
        else:                                   # ended or failed
            self.finished = time.time()
            self.error = self.error or (detail if event == "failed" else None)
            self.log({"live": self.id, "state": event, **({"error": self.error} if self.error else {}),
                      **({"stats": self.stats} if self.stats else {})})

    @property
    def state(self) -> str:
        if self.link is None:
            return "failed" if self.error else "starting"
        state = self.link.state
        return IDLE if state == "streaming" and not self.clients and not self.link.speaking else state

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def rate(self) -> Fraction:
        """Frames per second (known once the session streams)."""
        return Fraction(self.link.info["rate"]) if self.link is not None and self.link.info else Fraction(25)

    @property
    def stats(self) -> dict | None:
        return self.link.stats if self.link is not None else None

    # ------------------------------------------------------------------ the client
    def connect(self) -> bool:
        """An audio client comes; False if the session has one already (one speaks for a session)."""
        if self.clients:
            return False
        self.clients += 1
        return True

    def disconnected(self) -> None:
        self.clients -= 1

    def listen(self, hear: Callable[[Any], None]) -> Callable[[], None]:
        """`hear(event)` hears the session's playback events from now on; returns what stops it."""
        self._listeners.append(hear)
        return lambda: self._listeners.remove(hear) if hear in self._listeners else None

    def feed(self, samples: np.ndarray, band: np.ndarray | None = None) -> None:
        """Speech (16 kHz float32, and `band`: the same as it came, at 48 kHz) for the session; UsageError when the
        client is far ahead of the stream (what waits with these samples over QUEUED_AUDIO_S: none of them taken)."""
        if self.link.queued_seconds + len(samples) / SPEECH_SAMPLE_RATE > QUEUED_AUDIO_S:
            raise UsageError(f"over {QUEUED_AUDIO_S} s of speech would be waiting to be spoken; send PCM at most as "
                             "fast as it is spoken, give or take a sentence")
        self.received += len(samples)
        self.link.push(samples, band)

    # ------------------------------------------------------------------ the end
    def end(self, why: str = "DELETE", wait: float = END_WAIT_S) -> None:
        """End the stream cleanly (its file complete and playable), waiting up to `wait` s for it; `why` is what its
        figures say ended it."""
        if self.link is None or not self.link.active:
            return
        self.link.stop(why)
        if not self.link.wait(wait):
            self.error = f"the session did not end within {wait:g} s (its file may lack its end); its engine " \
                         f"{self.link.engine} is watched for a hang"

    def view(self) -> dict:
        stats = self.stats or {}
        return {"id": self.id, "avatar": self.request.avatar, "out": self.request.out, "state": self.state,
                "engine": self.link.engine if self.link else None, "pid": self.pid,
                "created": self.created, "started": self.started, "finished": self.finished,
                "client_connected": self.clients > 0, "speech_in_seconds": round(self.received / SPEECH_SAMPLE_RATE, 3),
                "audio": f"/v1/live/{self.id}/audio", "whep": f"/v1/live/{self.id}/whep",
                "viewers": self.viewers(self.id), "error": self.error,
                "first_frame_latency_s": stats.get("first_frame_latency_s"), "latency_s": stats.get("latency_s"),
                "frames": stats.get("frames"), "rtf": stats.get("rtf"), "stats": self.stats}


class LiveSessions:
    """The server's live sessions: checked (as `live` checks), opened on an engine of `engines` (the one carrying the
    fewest, an idle one first), fed, looked up, ended; at most `max_live` at once; those without a client for
    `idle_timeout` s end."""

    def __init__(self, engines: Sequence[EngineHandle], setup: Any, roots: list[Path], avatars: Callable[[str], Any],
                 log: Callable[[dict], None], max_live: int = 1, idle_timeout: float = 30.0,
                 network_outputs: bool = False, playlists: OpenPlaylists | None = None):
        self.engines, self.setup, self.roots = list(engines), setup, [r.resolve() for r in roots]
        self.avatars, self.log, self.playlists = avatars, log, playlists
        self.max_live, self.idle_timeout, self.network_outputs = max_live, idle_timeout, network_outputs
        self._sessions: dict[str, ServedSession] = {}
        self.viewers = WhepViewers()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_idle, name="live-idle", daemon=True)

    def start(self) -> None:
        self._watch.start()

    def check(self, body: Any) -> LiveRequest:
        """The LiveRequest `body` (the avatar, `out` and the live settings) asks for, checked before anything starts:
        its fields, its output under the roots (a relative one under the first, as a job's; or a URL, where allowed)
        and the files it would write by `live`'s rules (check_files: one there already only with "overwrite": true),
        its control file, its avatar."""
        if not isinstance(body, dict):
            raise UsageError("send one live session as a JSON object: {\"avatar\": NAME, \"out\": PATH_OR_URL, ...}")
        unknown = sorted(set(body) - set(LIVE_KEYS))
        if unknown:
            raise UsageError(f"unknown field {shown(unknown[0])}; a live session takes {', '.join(LIVE_KEYS)}")
        check_utf8(body, "live session")
        if not isinstance(body.get("avatar"), str):
            raise UsageError("avatar is required: the name of a registered avatar")
        out = body.get("out")
        if out is not None and (not isinstance(out, str) or not out):
            raise UsageError("out, when given, is a .ts or .m3u8 path under the server's roots, or an srt://, udp:// "
                             "or rtmp:// URL (without it the session is watched by WebRTC, WHEP, only)")
        if out is None:
            pass
        elif describe_destination(out) in ("ts file", "hls"):
            out = str(self.roots[0] / out)              # a relative path lies under the first root, as a job's does
            confine(Path(out), self.roots, "live output")
        elif not self.network_outputs:
            raise UsageError(f"{out}: this server streams to files under its roots only; start it with "
                             "--live-outputs any to allow srt://, udp:// and rtmp:// outputs")
        values = {k: v for k, v in body.items() if v is not None}
        if isinstance(values.get("controls"), str) and values["controls"]:
            values["controls"] = str(self.roots[0] / values["controls"])
            confine(Path(values["controls"]), self.roots, "controls file")
        request = LiveRequest(**{**values, "out": out})
        check_live(request, self.setup.config, served=True)
        self.avatars(request.avatar)                    # unknown or broken: its line, before an engine hears of it
        return request

    def open(self, body: Any) -> ServedSession:
        """A session for `body`, checked (see check), then opened on an engine; DittoError with its line if no
        engine takes it."""
        request = self.check(body)
        check_launch(self.setup.launch)
        with self._lock:
            if sum(s.active for s in self._sessions.values()) >= self.max_live:
                raise UsageError(f"{self.max_live} live session(s) stream already, the most this server runs "
                                 "(--max-live); end one (DELETE /v1/live/ID) first")
            if request.out is not None and any(s.active and s.request.out == request.out
                                               for s in self._sessions.values()):
                raise UsageError(f"{request.out}: another live session streams there; choose another output")
            session = ServedSession(secrets.token_hex(8), request, self.log, self.viewers.count)
            self._sessions[session.id] = session
            if self.playlists is not None and request.out is not None and describe_destination(request.out) == "hls":
                self.playlists.add(session.id, request.out)    # closed at its end, or at the next start if killed
            ended = [k for k, s in self._sessions.items() if not s.active]
            for k in ended[:max(0, len(ended) - KEPT_ENDED)]:
                del self._sessions[k]
        try:
            engine = self._carry(session)
        except DittoError as e:
            session.error, session.finished = str(e), time.time()
            self._close_playlists()
            raise
        session.engine, session.pid = engine, engine.info.get("pid")
        self.log({"live": session.id, "state": "starting", "avatar": request.avatar, "out": request.out,
                  "engine": engine.name, "pid": session.pid})
        return session

    def _carry(self, session: ServedSession) -> EngineHandle:
        """Open `session` on the engine carrying the fewest sessions (a dead one, carrying none, is started afresh;
        a live one first where they carry as many, an idle one before a busy one); one that cannot start passes it
        to the next. The engine that took it."""
        order = SessionOrder(session.request, label=session.id)
        engines = sorted(self.engines, key=lambda h: (len(h.state().sessions), h.state().state == "dead",
                                                      h.state().state == "busy"))
        for i, engine in enumerate(engines):
            try:
                session.link = engine.open_live(order, heard=session.heard)
                return engine
            except DittoError as e:
                if i == len(engines) - 1:
                    raise
                self.log({"live": session.id, "event": "engine down", "engine": engine.name, "error": str(e)})
        raise UsageError("no engine carries live sessions")

    def get(self, sid: str) -> ServedSession | None:
        return self._sessions.get(sid)

    def list(self) -> list[ServedSession]:
        return sorted(self._sessions.values(), key=lambda s: s.created)

    @property
    def active(self) -> bool:
        """Whether any session streams (or starts, or ends): queued renders wait."""
        return any(s.active for s in list(self._sessions.values()))

    def counts(self) -> dict[str, int]:
        sessions = list(self._sessions.values())
        return {state: sum(s.state == state for s in sessions) for state in STATES}

    def carried(self) -> list[dict]:
        """Each active session with the engine (and its pid) that carries it, for /healthz."""
        return [{"id": s.id, "state": s.state, "engine": s.link.engine if s.link else None, "pid": s.pid}
                for s in self.list() if s.active]

    def frames(self) -> dict[str, int]:
        """The frames of every session so far, by what became of them."""
        kinds = ("sent", "on_time", "repeated", "skipped", "late")
        out = dict.fromkeys(kinds, 0)
        for s in list(self._sessions.values()):
            for k in kinds:
                out[k] += ((s.stats or {}).get("frames") or {}).get(k, 0)
        return out

    def _close_playlists(self) -> None:
        """The playlists of the sessions that have ended closed where their writer left them open, their records
        removed (OpenPlaylists.done; one still being written is looked at again next time)."""
        if self.playlists is None:
            return
        for sid in self.playlists.recorded():
            session = self._sessions.get(sid)
            if session is None or not session.active:
                playlist = self.playlists.playlist(sid)
                if self.playlists.done(sid):
                    self.log({"live": sid, "event": "playlist closed", "playlist": playlist,
                              "why": "its stream ended without closing it"
                                     + (f" ({session.error})" if session is not None and session.error else "")})

    def _watch_idle(self) -> None:
        """End a session idle (no client, and what its last client sent said) for `idle_timeout` s; close what
        ended sessions left open."""
        while not self._stop.wait(1.0):
            try:
                self._look_for_idle()
            except Exception as e:  # noqa: BLE001 - said; the next look goes on (this thread is the server's only one)
                self.log({"event": "live idle watch failed", "why": one_line(f"{type(e).__name__}: {e}")})

    def _look_for_idle(self) -> None:
        """One look: playlists left open closed, each idle session's time counted, and ended past the limit."""
        self._close_playlists()
        for s in list(self._sessions.values()):
            if s.state != IDLE:
                s.idle_since = None
                continue
            s.idle_since = s.idle_since or time.monotonic()
            if time.monotonic() - s.idle_since > self.idle_timeout:
                s.idle_since = None
                self.log({"live": s.id, "event": "no client", "why": f"no client for {self.idle_timeout:g} s "
                          "(--live-idle-timeout): ending the session"})
                threading.Thread(target=s.end, args=("no client",), name=f"live-{s.id}-end", daemon=True).start()

    def close(self) -> None:
        """End every session cleanly (the server stops), each file complete."""
        self._stop.set()
        threads = [threading.Thread(target=s.end, args=("server stopped",), daemon=True)
                   for s in list(self._sessions.values()) if s.active]
        for t in threads:
            t.start()
        for t in threads:
            t.join(END_WAIT_S + 15)
        self._close_playlists()             # a session that did not end in time keeps its record: the next start
