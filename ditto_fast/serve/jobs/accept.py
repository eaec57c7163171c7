"""Accepting a job: a job line's JSON (from the API or a watch folder's file and sidecar) checked as `render` checks
its options, every path it names confined to the server's roots (a delivery profile's file before it is read), an
existing output kept unless the job says "overwrite", then queued. Nothing is queued that `render` would refuse;
the refusal is the line `render` prints and its exit code. When the job starts, its paths are confined again and a
watch folder's file must still be the one taken (`Acceptor.at_start`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlparse

from ditto_fast.avatar import Avatar
from ditto_fast.engine.digest import clip_is_finished
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.core.files import file_signature, printable, shown
from ditto_fast.delivery.profiles import is_profile_file, profile_path
from ditto_fast.engine.clip import Clip, check_clip, request_inputs
from ditto_fast.engine.emotion_auto import check_emotion_model
from ditto_fast.engine.request import RenderRequest
from ditto_fast.serve.checks import check_utf8, confine
from ditto_fast.serve.decoded import DecodedMemo
from ditto_fast.serve.jobs.callbacks import CallbackPolicy, redact
from ditto_fast.serve.jobs.queue import PRIORITIES, PRIORITY_RANGE, JobQueue

if TYPE_CHECKING:               # checking a job needs no torch: the engine's modules are imported where they run
    from ditto_fast.engine.render_setup import RenderSetup

EXTRA_KEYS = ("priority", "callback", "overwrite")   # what a job may carry beside the request's fields


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


def check_callback(url: Any, policy: CallbackPolicy) -> str | None:
    """A callback URL: http(s) with a host, no credentials, not a literal address `policy` refuses; UsageError
    otherwise."""
    if url is None:
        return None
    try:
        parsed = urlparse(url) if isinstance(url, str) and len(url) <= 2000 else None
        valid = parsed is not None and parsed.scheme in ("http", "https") and bool(parsed.hostname) and \
            parsed.port != 0
    except ValueError:                  # a bad port or IPv6 literal
        valid = False
    if not valid:
        shown_url = redact(url) if isinstance(url, str) else url
        raise UsageError(f"callback must be an http:// or https:// URL, got {shown(shown_url)}")
    policy.check_url(url)
    return url


def parse_overwrite(value: Any) -> bool:
    """Whether a job may replace an existing output that is not its own render: true or false (the default)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise UsageError(f"overwrite must be true or false, got {shown(value)}")


def check_not_replacing(clip: Clip, setup: RenderSetup) -> None:
    """UsageError if the clip's output exists and is not this request's own render (its digest): a job replaces
    another file only when it says "overwrite": true."""
    if os.path.lexists(clip.output) and not clip_is_finished(clip, setup):
        raise UsageError(f"{clip.output}: exists already and is not this request's render; choose another output, "
                         'or send "overwrite": true to replace it')


def check_taken(job: dict) -> None:
    """InputError unless a watch folder's job's file is still the one it took (the same signature): a copy that
    stalled past the settling time and went on, or a file removed, is not rendered."""
    taken = (job.get("watch_files") or {}).get("audio")
    if taken is None:                   # not a watch job (or queued by a server that kept no signatures)
        return
    now, name = file_signature(job["watch_path"]), printable(job["watch_path"])
    if now is None:
        raise InputError(f"{name}: removed from the watch folder before its render; drop it again to render it")
    if list(now) != list(taken):
        raise InputError(f"{name}: changed after the watch folder took it (a copy still being written?); it is "
                         "taken again once it settles. Write files elsewhere, then rename them into the folder")


def request_json(request: RenderRequest) -> dict:
    """A request as the job line that makes it again (paths as given, absolute; defaults left out)."""
    return {f.name: str(v) if isinstance(v, Path) else v
            for f in dataclasses.fields(request)
            if (v := getattr(request, f.name)) is not None and not (f.metadata["kind"] == "flag" and v is False)}


class Acceptor:
    """Checks jobs for one server (its roots, config and checkpoints) and queues them. `avatars` opens an avatar
    (default: opened once each, reopened when replaced); the audio each check decoded is kept in `decoded`;
    `callbacks`: the destinations a job's callback may have (default: public addresses only)."""

    def __init__(self, queue: JobQueue, setup: RenderSetup, roots: list[Path],
                 avatars: Callable[[str], Avatar] | None = None, callbacks: CallbackPolicy | None = None):
        self.queue, self.setup, self.config = queue, setup, setup.config
        self.callbacks = callbacks or CallbackPolicy()
        self.roots = [r.resolve() for r in roots]
        if avatars is None:
            from ditto_fast.engine.open_avatars import OpenAvatars

            avatars = OpenAvatars(setup.checkpoints).get
        self.avatars = avatars
        self.decoded = DecodedMemo()

    def check(self, data: Any, where: str, patient: bool = False) -> tuple[RenderRequest, int, str | None]:
        """The request, priority and callback of one job's JSON; UsageError (or the DittoError `render` gives) if
        it is not one `render` would take, names a path outside the roots or an existing output not its own
        (without "overwrite": true). Its audio is decoded in turn with the server's other decodings (DecodersBusy
        when their line is full, unless `patient`: it waits)."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected a JSON object like "
                             '{"avatar": "ruby", "audio": "/news/a.wav", "output": "/news/out/a.mp4"}')
        check_utf8(data, where)
        fields = {k: v for k, v in data.items() if k not in EXTRA_KEYS}
        priority = parse_priority(data.get("priority"))
        callback = check_callback(data.get("callback"), self.callbacks)
        overwrite = parse_overwrite(data.get("overwrite"))
        self.confine_profile(fields.get("delivery"))
        request = RenderRequest.from_json(fields, self.roots[0], where)
        self.confine_request(request)
        clip = check_clip(request, self.avatars(request.avatar), self.config,
                          audio=self.decoded.take(request.audio),     # an upload's check decoded it already
                          max_seconds=self.decoded.longest,
                          decode=self.decoded.patient if patient else self.decoded.decode)
        check_emotion_model(clip, self.setup.checkpoints)
        if not overwrite:
            check_not_replacing(clip, self.setup)
        self.decoded.put(request.audio, clip.audio)
        return request, priority, callback

    def confine_profile(self, delivery: Any) -> None:
        """A delivery profile given as a file, confined to the roots before anything reads it (so no line of a file
        outside them reaches an answer, a log or a watch folder's note)."""
        if isinstance(delivery, str) and is_profile_file(delivery):
            confine(self.roots[0] / delivery, self.roots, "delivery profile")

    def confine_request(self, request: RenderRequest) -> None:
        """UsageError unless the output and every file the request reads (a shipped delivery profile aside) lie
        under the roots, links followed as they are now."""
        confine(request.output, self.roots, "output")
        shipped = profile_path(request.delivery) if request.delivery and not is_profile_file(request.delivery) \
            else None
        for path in request_inputs(request, self.config.clip.emotion):
            if path != shipped:
                confine(path, self.roots, "input")

    def at_start(self, job: dict, request: RenderRequest) -> None:
        """What a render thread calls as a job starts, before its render opens any file: the paths confined again
        (a folder swapped for a link since the job was accepted is refused) and a watch folder's file still the
        one the job took (check_taken)."""
        self.confine_request(request)
        check_taken(job)

    def accept(self, data: Any, where: str, source: str = "api", watch_path: str | None = None,
               watch_files: dict | None = None) -> dict:
        """Check one job and queue it; returns the queued job. A request over the API may be told the server's
        decoders are busy (DecodersBusy); a watch folder's file waits its turn."""
        request, priority, callback = self.check(data, where, patient=source != "api")
        return self.queue.submit(request_json(request), priority=priority, source=source, callback=callback,
                                 watch_path=watch_path, output=str(request.output), watch_files=watch_files)

