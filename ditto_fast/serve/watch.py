"""A watch folder, as broadcast watch folders work on network shares (where change notifications don't arrive): the
folder is listed every few seconds, and a speech file is taken once its size and modification time have stayed
the same for a settling interval. A sidecar `<stem>.json` may hold request fields; the folder's defaults fill the
rest. The output goes to the out folder; once the job ends the input (and its sidecar) moves to `done/`, or to
`failed/` beside a `<stem>.error.txt` with the one-line error and exit code."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ditto_fast.batch.jobs import AUDIO_SUFFIXES
from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.core.files import KIB, file_signature, read_bounded
from ditto_fast.encoding.formats import default_suffix
from ditto_fast.delivery.profiles import load_profile
from ditto_fast.serve.accept import Acceptor
from ditto_fast.serve.queue import JobQueue

SIDECAR_MAX_BYTES = 64 * KIB


def _aside(folder: Path, name: str) -> Path:
    """`folder/name`, or `folder/stem-N.suffix` when that is taken (a file dropped twice keeps both copies)."""
    folder.mkdir(exist_ok=True)
    target, n = folder / name, 1
    while target.exists():
        target, n = folder / f"{Path(name).stem}-{n}{Path(name).suffix}", n + 1
    return target


class WatchFolder:
    """Turns settled speech files in `folder` into jobs whose outputs go to `out`, and files their inputs away."""

    def __init__(self, folder: Path, out: Path, defaults: dict[str, Any], acceptor: Acceptor, queue: JobQueue,
                 wake: Callable[[], None], log: Callable[[dict], None], settle_s: float = 5.0, poll_s: float = 2.0):
        self.folder, self.out, self.defaults = folder, out, defaults
        self.acceptor, self.queue, self.wake, self.log = acceptor, queue, wake, log
        self.settle_s, self.poll_s = settle_s, poll_s
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}   # name -> (signature, when first seen so)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ditto-fast-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except OSError as e:               # the share went away for a moment: try again next time
                self.log({"watch": str(self.folder), "error": f"cannot list the watch folder ({e.strerror or e})"})
            self._stop.wait(self.poll_s)

    def poll(self, now: float | None = None) -> None:
        """One look at the folder: file away the inputs of ended jobs, queue the files that have settled."""
        now = time.monotonic() if now is None else now
        for job in self.queue.watched(unmoved_final=True):
            self._file_away(job)
        active = {j["watch_path"] for j in self.queue.watched(unmoved_final=False)}
        names = sorted(e.name for e in os.scandir(self.folder)
                       if e.is_file() and not e.name.startswith(".") and Path(e.name).suffix.lower() in AUDIO_SUFFIXES)
        self._seen = {k: v for k, v in self._seen.items() if k in names}
        for name in names:
            path = self.folder / name
            sig = file_signature(path)
            if sig is None or str(path) in active:
                continue
            seen = self._seen.get(name)
            if seen is None or seen[0] != sig:
                self._seen[name] = (sig, now)           # new, or still growing: wait until it settles
            elif now - seen[1] >= self.settle_s:
                del self._seen[name]
                self._take(path)

    def _take(self, path: Path) -> None:
        where = str(path)
        try:
            data = {**self.defaults, **self._sidecar(path)}
            data["audio"] = str(path)
            data.setdefault("output", str(self.out / f"{path.stem}{self._suffix(data)}"))
            job = self.acceptor.accept(data, where, source="watch", watch_path=str(path))
        except DittoError as e:
            self._failed(path, str(e), e.exit_code)
            self.log({"watch": where, "state": "failed", "error": str(e), "exit_code": e.exit_code})
            return
        self.wake()
        self.log({"job": job["id"], "state": "queued", "watch": where, "output": job["output"]})

    def _sidecar(self, path: Path) -> dict:
        side = path.with_suffix(".json")
        if not side.exists():
            return {}
        try:
            data = json.loads(read_bounded(side, SIDECAR_MAX_BYTES, "a sidecar of request fields (JSON)"))
        except (ValueError, RecursionError) as e:
            raise InputError(f"{side}: not valid JSON ({getattr(e, 'msg', 'nested too deep')}); write the request's "
                             "fields as one JSON object") from None
        if not isinstance(data, dict):
            raise InputError(f"{side}: expected a JSON object of request fields such as {{\"avatar\": \"ruby\"}}")
        if "audio" in data:
            raise UsageError(f"{side}: a sidecar names no audio (the file beside it is the audio); remove \"audio\"")
        return data

    def _suffix(self, data: dict) -> str:
        if isinstance(data.get("delivery"), str):
            return load_profile(data["delivery"]).extension
        return default_suffix(data.get("codec") if isinstance(data.get("codec"), str) else None)

    def _file_away(self, job: dict) -> None:
        path = Path(job["watch_path"])
        if path.exists():
            if job["status"] == "done":
                self._move(path, self.folder / "done")
            else:
                self._failed(path, job["error"] or job["status"], job["exit_code"])
        self.queue.mark_moved(job["id"])

    def _move(self, path: Path, folder: Path) -> Path:
        target = _aside(folder, path.name)
        os.replace(path, target)
        side = path.with_suffix(".json")
        if side.exists():
            os.replace(side, target.with_suffix(".json"))
        return target

    def _failed(self, path: Path, error: str, exit_code: int | None) -> None:
        target = self._move(path, self.folder / "failed")
        note = target.with_name(f"{target.stem}.error.txt")
        note.write_text(f"{error}\nexit code {exit_code}\n")
