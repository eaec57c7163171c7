"""Accepting a job: a job line's JSON (from the API or a watch folder's file and sidecar) checked as `render` checks
its options, every path it names confined to the server's roots, then queued. Nothing is queued that `render`
would refuse; the refusal is the line `render` prints and its exit code."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlparse

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.avatar import Avatar
from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import file_signature, shown
from ditto_fast.engine.clip import check_clip, request_inputs
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.queue import PRIORITIES, PRIORITY_RANGE, JobQueue

if TYPE_CHECKING:               # checking a job needs no torch: the engine's modules are imported where they run
    from ditto_fast.engine.render_setup import RenderSetup

EXTRA_KEYS = ("priority", "callback")     # what a job may carry beside the request's fields
MEMO_BYTES = 256 << 20                    # decoded audio kept between a job's check and its render


def parse_priority(value: Any) -> int:
    """A job's priority: normal (0), breaking (100) or a whole number in PRIORITY_RANGE; UsageError otherwise."""
    if value is None:
        return 0
    if isinstance(value, str) and value in PRIORITIES:
        return PRIORITIES[value]
    low, high = PRIORITY_RANGE
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    raise UsageError(f"priority must be normal, breaking or a whole number in {low}..{high}, got {shown(value)}")


def check_callback(url: Any) -> str | None:
    """A callback URL: http(s) with a host; UsageError otherwise."""
    if url is None:
        return None
    parsed = urlparse(url) if isinstance(url, str) and len(url) <= 2000 else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"callback must be an http:// or https:// URL, got {shown(url)}")
    return url


def confine(path: Path, roots: list[Path], what: str) -> None:
    """UsageError unless `path` (symbolic links followed) lies under one of `roots`."""
    real = path.resolve()
    if not any(real == r or r in real.parents for r in roots):
        raise UsageError(f"{path}: the {what} is outside the folders this server may use "
                         f"({', '.join(map(str, roots))}); give a path under one of them")


def request_json(request: RenderRequest) -> dict:
    """A request as the job line that makes it again (paths as given, absolute; defaults left out)."""
    return {f.name: str(v) if isinstance(v, Path) else v
            for f in dataclasses.fields(request) if (v := getattr(request, f.name)) is not None}


class DecodedMemo:
    """The audio a job's check decoded, kept (up to MEMO_BYTES, oldest dropped first) for its render, which then
    decodes nothing; taken back only if the file is the same one, unchanged, since."""

    def __init__(self, limit: int = MEMO_BYTES):
        self.limit = limit
        self._kept: OrderedDict[str, tuple[tuple[int, int, int], DecodedAudio]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, path: Path, audio: DecodedAudio) -> None:
        signature = file_signature(path)
        if signature is None or audio.samples.nbytes > self.limit:
            return
        with self._lock:
            self._kept[str(path)] = (signature, audio)
            self._kept.move_to_end(str(path))
            while sum(a.samples.nbytes for _, a in self._kept.values()) > self.limit:
                self._kept.popitem(last=False)

    def take(self, path: Path) -> DecodedAudio | None:
        """The audio decoded from `path` if it is unchanged since; None otherwise (decode it again)."""
        with self._lock:
            kept = self._kept.get(str(path))
        if kept is None or kept[0] != file_signature(path):
            return None
        return kept[1]


class Acceptor:
    """Checks jobs for one server (its roots, config and checkpoints) and queues them. `avatars` opens an avatar
    (default: opened once each, reopened when replaced); the audio each check decoded is kept in `decoded`."""

    def __init__(self, queue: JobQueue, setup: RenderSetup, roots: list[Path],
                 avatars: Callable[[str], Avatar] | None = None):
        self.queue, self.setup, self.config = queue, setup, setup.config
        self.roots = [r.resolve() for r in roots]
        if avatars is None:
            from ditto_fast.engine.open_avatars import OpenAvatars

            avatars = OpenAvatars(setup.checkpoints).get
        self.avatars = avatars
        self.decoded = DecodedMemo()

    def check(self, data: Any, where: str) -> tuple[RenderRequest, int, str | None]:
        """The request, priority and callback of one job's JSON; UsageError (or the DittoError `render` gives) if
        it is not one `render` would take or names a path outside the roots."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected a JSON object like "
                             '{"avatar": "ruby", "audio": "/news/a.wav", "output": "/news/out/a.mp4"}')
        fields = {k: v for k, v in data.items() if k not in EXTRA_KEYS}
        priority, callback = parse_priority(data.get("priority")), check_callback(data.get("callback"))
        request = RenderRequest.from_json(fields, self.roots[0], where)
        for path in (request.output, *request_inputs(request, self.config.clip.emotion)):
            confine(path, self.roots, "output" if path == request.output else "input")
        clip = check_clip(request, self.avatars(request.avatar), self.config)
        self.decoded.put(request.audio, clip.audio)
        return request, priority, callback

    def accept(self, data: Any, where: str, source: str = "api", watch_path: str | None = None) -> dict:
        """Check one job and queue it; returns the queued job."""
        request, priority, callback = self.check(data, where)
        return self.queue.submit(request_json(request), priority=priority, source=source, callback=callback,
                                 watch_path=watch_path, output=str(request.output))

