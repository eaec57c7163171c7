"""`serve`'s live sessions: each one a process of its own (live_child.py) streaming an avatar to a `.ts`/`.m3u8`
under the roots or to a network URL, fed the PCM its WebSocket brings (resampled here to 16 kHz). While any session
streams, no queued render starts (a running one finishes): a session keeps its rate. A session without a client for
`idle_timeout` seconds ends, as DELETE ends it: cleanly, its file playable."""

from __future__ import annotations

import os
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

import numpy as np

import ditto_fast
from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.core.files import shown
from ditto_fast.engine.request import FIELDS
from ditto_fast.live.options import NOT_LIVE, LiveOptions
from ditto_fast.live.outputs import describe_destination
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE
from ditto_fast.serve.accept import check_utf8, confine

LIVE_REQUEST = tuple(f.name for f in FIELDS if f.name not in NOT_LIVE)
LIVE_KEYS = (*LIVE_REQUEST, "out", "max_latency", "overlap")
STATES = ("starting", "streaming", "idle", "ending", "ended", "failed")
ACTIVE = ("starting", "streaming", "idle", "ending")
RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
QUEUED_AUDIO_S = 600            # seconds of speech a client may send ahead of the stream
END_WAIT_S = 30.0               # how long DELETE waits for a session's file to be finished
KEPT_ENDED = 100                # ended sessions still answered by GET
_CHILD = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from ditto_fast.serve.live_child import main; "
          "sys.exit(main(sys.argv[1:]))")


def parse_rate(message: str) -> int:
    """The rate a client's text message `{"rate": N}` declares; UsageError naming what is accepted otherwise."""
    import json

    try:
        value = json.loads(message)
    except ValueError:
        value = None
    rate = value.get("rate") if isinstance(value, dict) and set(value) == {"rate"} else None
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in RATES:
        raise UsageError(f"a text message may only declare the PCM's rate, as {{\"rate\": N}} with N one of "
                         f"{', '.join(map(str, RATES))}, before any audio; got {shown(message[:80])}")
    return rate


class Stream:
    """One live session of the server: its process, its state and figures, the PCM on its way to it."""

    def __init__(self, sid: str, request: dict, options: LiveOptions, log: Callable[[dict], None]):
        self.id, self.request, self.options, self.log = sid, request, options, log
        self.state, self.error = "starting", None
        self.created, self.started, self.finished = time.time(), None, None
        self.stats: dict | None = None
        self.clients = 0
        self.without_client_since = time.monotonic()
        self.received = 0               # samples (16 kHz) handed to the session
        self._pcm: queue.Queue = queue.Queue()
        self._queued = 0
        self._ended = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ life
    def launch(self, setup: Any) -> None:
        ours, theirs = socket.socketpair()
        here = str(Path(ditto_fast.__file__).resolve().parents[1])
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, here, str(theirs.fileno()), str(os.getpid())],
                                          pass_fds=(theirs.fileno(),), stdin=subprocess.PIPE,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          start_new_session=True)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(("start", setup, self.request, self.options))
        threading.Thread(target=self._listen, name=f"live-{self.id}-listen", daemon=True).start()
        threading.Thread(target=self._write, name=f"live-{self.id}-pcm", daemon=True).start()
        threading.Thread(target=self._said, name=f"live-{self.id}-stderr", daemon=True).start()

    def _said(self) -> None:
        """What the session's process prints (a crash's traceback, say) goes to the server's log."""
        for line in self._proc.stderr:
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self.log({"live": self.id, "said": text})

    def _listen(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "ready":
                    self.started = time.time()
                    self._set("streaming" if self.clients else "idle")
                    self.log({"live": self.id, "state": self.state, **message[1]})
                elif kind == "stats":
                    self.stats = message[1]
                elif kind == "log":
                    self.log({"live": self.id, "said": message[1]})
                elif kind == "ended":
                    self.stats = message[1]
                    self._end("ended")
                    return
                elif kind == "failed":
                    self.error = message[1]
                    self._end("failed")
                    return
        except (EOFError, OSError):
            code = self._proc.wait()
            self.error = self.error or f"the live session's process died (exit status {code})"
            self._end("failed")

    def _end(self, state: str) -> None:
        with self._lock:
            self.state, self.finished = state, time.time()
        self._pcm.put(None)
        self._ended.set()
        self.log({"live": self.id, "state": state, **({"error": self.error} if self.error else {}),
                  **({"stats": self.stats} if self.stats else {})})
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(self._proc)

    def _write(self) -> None:
        """Hand the queued PCM to the session's stdin as it comes (closed at the end: the stream goes on idle)."""
        stdin = self._proc.stdin
        try:
            while (data := self._pcm.get()) is not None:
                self._queued -= len(data)
                stdin.write(data)
                stdin.flush()
        except OSError:
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    def _set(self, state: str) -> None:
        with self._lock:
            if self.state in ACTIVE and self.state != "ending":
                self.state = state

    # ------------------------------------------------------------------ the client
    def connected(self) -> None:
        self.clients += 1
        if self.state == "idle":
            self._set("streaming")

    def disconnected(self) -> None:
        self.clients -= 1
        if not self.clients:
            self.without_client_since = time.monotonic()
            if self.state == "streaming":
                self._set("idle")

    def feed(self, samples: np.ndarray) -> None:
        """Queue speech (16 kHz float32) for the session; UsageError when the client is far ahead of the stream."""
        if self._queued > QUEUED_AUDIO_S * SPEECH_SAMPLE_RATE * 2:
            raise UsageError(f"live session {self.id}: over {QUEUED_AUDIO_S} s of speech are waiting to be spoken; "
                             "send PCM at most as fast as it is spoken, give or take a sentence")
        pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
        self.received += len(samples)
        self._queued += len(pcm)
        self._pcm.put(pcm)

    # ------------------------------------------------------------------ the end
    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def end(self, wait: float = END_WAIT_S) -> None:
        """End the stream cleanly (its file complete and playable), waiting up to `wait` s; killed past that."""
        with self._lock:
            if self.state not in ACTIVE:
                return
            self.state = "ending"
        try:
            self._conn.send(("stop",))
        except OSError:
            pass
        if not self._ended.wait(wait) and self._proc is not None:
            self.error = f"the session did not end within {wait:g} s; killed (its file may lack its end)"
            _kill(self._proc)
            self._ended.wait(10)

    def view(self) -> dict:
        stats = self.stats or {}
        return {"id": self.id, "avatar": self.request["avatar"], "out": self.options.out, "state": self.state,
                "created": self.created, "started": self.started, "finished": self.finished,
                "client_connected": self.clients > 0, "speech_in_seconds": round(self.received / SPEECH_SAMPLE_RATE, 3),
                "audio": f"/v1/live/{self.id}/audio", "error": self.error,
                "first_frame_latency_s": stats.get("first_frame_latency_s"), "latency_s": stats.get("latency_s"),
                "frames": stats.get("frames"), "rtf": stats.get("rtf"), "stats": self.stats}


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class LiveSessions:
    """The server's live sessions: opened (checked first, as `live` checks), fed, looked up, ended; at most
    `max_live` at once; those without a client for `idle_timeout` s end."""

    def __init__(self, setup: Any, roots: list[Path], avatars: Callable[[str], Any], log: Callable[[dict], None],
                 max_live: int = 1, idle_timeout: float = 30.0, network_outputs: bool = False):
        self.setup, self.roots, self.avatars, self.log = setup, [r.resolve() for r in roots], avatars, log
        self.max_live, self.idle_timeout, self.network_outputs = max_live, idle_timeout, network_outputs
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_idle, name="live-idle", daemon=True)

    def start(self) -> None:
        self._watch.start()

    def open(self, body: Any) -> Stream:
        """A session for `body` (the avatar, `out` and the live settings), checked before anything starts."""
        from ditto_fast.live.start import check_live

        if not isinstance(body, dict):
            raise UsageError("send one live session as a JSON object: {\"avatar\": NAME, \"out\": PATH_OR_URL, ...}")
        unknown = sorted(set(body) - set(LIVE_KEYS))
        if unknown:
            raise UsageError(f"unknown field {shown(unknown[0])}; a live session takes {', '.join(LIVE_KEYS)}")
        check_utf8(body, "live session")
        if not isinstance(body.get("avatar"), str):
            raise UsageError("avatar is required: the name of a registered avatar")
        out = body.get("out")
        if not isinstance(out, str) or not out:
            raise UsageError("out is required: a .ts or .m3u8 path under the server's roots, or an srt://, udp:// or "
                             "rtmp:// URL")
        kind = describe_destination(out)
        if kind in ("ts file", "hls"):
            out = str(Path(out).absolute())
            confine(Path(out), self.roots, "live output")
        elif not self.network_outputs:
            raise UsageError(f"{out}: this server streams to files under its roots only; start it with "
                             "--live-outputs any to allow srt://, udp:// and rtmp:// outputs")
        request = {k: body[k] for k in LIVE_REQUEST if body.get(k) is not None}
        if request.get("controls") is not None:
            confine(Path(str(request["controls"])), self.roots, "controls file")
        options = LiveOptions(audio_in="-", out=out, max_latency=body.get("max_latency"), overlap=body.get("overlap"))
        request, _ = check_live(request, options, self.setup.config)
        self.avatars(request["avatar"])                 # unknown or broken: its line, before a process starts
        with self._lock:
            if sum(s.active for s in self._streams.values()) >= self.max_live:
                raise UsageError(f"{self.max_live} live session(s) stream already, the most this server runs "
                                 "(--max-live); end one (DELETE /v1/live/ID) first")
            if any(s.active and s.options.out == out for s in self._streams.values()):
                raise UsageError(f"{out}: another live session streams there; choose another output")
            stream = Stream(secrets.token_hex(8), request, options, self.log)
            self._streams[stream.id] = stream
            ended = [k for k, s in self._streams.items() if not s.active]
            for k in ended[:max(0, len(ended) - KEPT_ENDED)]:
                del self._streams[k]
        try:
            stream.launch(self.setup)
        except OSError as e:
            stream.error = f"cannot start the live session's process ({e.strerror or e})"
            stream._end("failed")
            raise DittoError(stream.error) from None
        self.log({"live": stream.id, "state": "starting", "avatar": request["avatar"], "out": out})
        return stream

    def get(self, sid: str) -> Stream | None:
        return self._streams.get(sid)

    def list(self) -> list[Stream]:
        return sorted(self._streams.values(), key=lambda s: s.created)

    @property
    def active(self) -> bool:
        """Whether any session streams (or starts, or ends): queued renders wait."""
        return any(s.active for s in list(self._streams.values()))

    def counts(self) -> dict[str, int]:
        streams = list(self._streams.values())
        return {state: sum(s.state == state for s in streams) for state in STATES}

    def frames(self) -> dict[str, int]:
        """The frames of every session so far, by what became of them."""
        kinds = ("sent", "on_time", "repeated", "skipped", "late")
        out = dict.fromkeys(kinds, 0)
        for s in list(self._streams.values()):
            for k in kinds:
                out[k] += ((s.stats or {}).get("frames") or {}).get(k, 0)
        return out

    def _watch_idle(self) -> None:
        while not self._stop.wait(1.0):
            for s in list(self._streams.values()):
                if s.state == "idle" and not s.clients and \
                        time.monotonic() - s.without_client_since > self.idle_timeout:
                    self.log({"live": s.id, "event": "no client", "why": f"no client for {self.idle_timeout:g} s "
                              "(--live-idle-timeout): ending the session"})
                    threading.Thread(target=s.end, name=f"live-{s.id}-end", daemon=True).start()

    def close(self) -> None:
        """End every session (the server stops)."""
        self._stop.set()
        threads = [threading.Thread(target=s.end, daemon=True) for s in list(self._streams.values()) if s.active]
        for t in threads:
            t.start()
        for t in threads:
            t.join(END_WAIT_S + 15)
