"""A watch folder, as broadcast watch folders work on network shares (where change notifications don't arrive): the
folder is listed every few seconds, and a speech file is taken once its signature (inode, size, modification time)
has stayed the same for a settling interval. A sidecar `<stem>.json` may hold request fields; the folder's defaults
fill the rest; a `<stem>.srt` (.vtt, .scc, .ttml) beside it captions the clip, a `<stem>.txt` is its script. The output goes to the out folder, one file's only: a file of another name whose output is taken is
refused, one dropped again under its own name (a correction) replaces its output. Once the job ends the file it took
(and its sidecar, if the job read that one) moves to `done/`, or to `failed/` beside a `<stem>.error.txt` with the
one-line error and exit code; a file that changed since it was taken is a new file, taken in turn. One bad file or
a locked queue costs one log line, never the watch thread."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

from ditto_fast.audio.files import AUDIO_SUFFIXES
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, InputError, UsageError, one_line
from ditto_fast.core.files import KIB, file_signature, printable, read_bounded
from ditto_fast.encoding.formats import default_suffix
from ditto_fast.delivery.profiles import load_profile
from ditto_fast.serve.checks import check_utf8
from ditto_fast.serve.jobs.accept import Acceptor
from ditto_fast.serve.jobs.queue import JobQueue
from ditto_fast.serve.service_thread import ServiceThread

SIDECAR_MAX_BYTES = 64 * KIB
CAPTION_SUFFIXES = (".srt", ".vtt", ".scc", ".ttml", ".dfxp", ".txt")    # a dropped file's captions or script
TRANSIENT = (OSError, sqlite3.Error)        # a share gone for a moment, a queue locked by a backup: try again later


def _aside(folder: Path, name: str) -> Path:
    """`folder/name`, or `folder/stem-N.suffix` when that is taken (a file dropped twice keeps both copies)."""
    folder.mkdir(exist_ok=True)
    target, n = folder / name, 1
    while target.exists():
        target, n = folder / f"{Path(name).stem}-{n}{Path(name).suffix}", n + 1
    return target


def captions_beside(path: Path) -> dict[str, str]:
    """The captions of a dropped speech file: {"captions": <stem>.srt/.vtt/.scc/.ttml/.dfxp} or {"script":
    <stem>.txt} beside it (the first found in that order), or {}."""
    for suffix in CAPTION_SUFFIXES:
        side = path.with_suffix(suffix)
        if side.is_file():
            return {"script" if suffix == ".txt" else "captions": str(side)}
    return {}


def _same(signature: Any, taken: Any) -> bool:
    """Whether a file's signature now is the one a job took."""
    return signature is not None and list(signature) == list(taken)


class WatchFolder(ServiceThread):
    """Turns settled speech files in `folder` into jobs whose outputs go to `out`, and files their inputs away.
    `alive` and `last_poll` (time.time() of the last full look) say whether its thread still works."""

    def __init__(self, folder: Path, out: Path, defaults: dict[str, Any], acceptor: Acceptor, queue: JobQueue,
                 notify: Callable[[], None], log: Callable[[dict], None], settle_s: float = 5.0, poll_s: float = 2.0):
        """`notify()` is called when a job is queued (the dispatcher takes it)."""
        super().__init__("ditto-fast-watch", log)
        self.folder, self.out, self.defaults = folder, out, defaults
        self.acceptor, self.queue, self.notify = acceptor, queue, notify
        self.settle_s, self.poll_s = settle_s, poll_s
        self.last_poll: float | None = None
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}   # name -> (signature, when first seen so)

    def step(self) -> float:
        self.poll()
        return self.poll_s

    def failed(self, e: Exception) -> float:
        """A share gone, a locked queue, a bug: one line, then again."""
        self.log({"watch": printable(str(self.folder)), "error": one_line(
            f"cannot look at the watch folder ({type(e).__name__}: {e}); trying again in {self.poll_s:g} s")})
        return self.poll_s

    def poll(self, now: float | None = None) -> None:
        """One look at the folder: file away the inputs of ended jobs, queue the files that have settled."""
        now = time.monotonic() if now is None else now
        for job in self.queue.watched(unmoved_final=True):
            self._guarded(job["watch_path"], self._file_away, job)
        taken: dict[str, list] = {}         # file -> the signatures its queued or running jobs took (None: unknown)
        for job in self.queue.watched(unmoved_final=False):
            taken.setdefault(job["watch_path"], []).append((job["watch_files"] or {}).get("audio"))
        names = sorted(e.name for e in os.scandir(self.folder)
                       if e.is_file() and not e.name.startswith(".") and Path(e.name).suffix.lower() in AUDIO_SUFFIXES)
        self._seen = {k: v for k, v in self._seen.items() if k in names}
        for name in names:
            path = self.folder / name
            sig = file_signature(path)
            if sig is None or any(t is None or _same(sig, t) for t in taken.get(str(path), ())):
                continue                            # gone, or the very file a job took
            seen = self._seen.get(name)
            if seen is None or seen[0] != sig:
                self._seen[name] = (sig, now)       # new, or still growing: wait until it settles
            elif now - seen[1] >= self.settle_s:
                del self._seen[name]
                self._guarded(str(path), self._take, path, sig)
        self.last_poll = time.time()

    def _guarded(self, where: str, step: Callable, *args: Any) -> None:
        """One file's step; whatever goes wrong costs a log line (the step is tried again at a later look), never
        the other files' turn."""
        try:
            step(*args)
        except Exception as e:  # noqa: BLE001 - a share gone for a moment, a locked queue, a bug
            self.log({"watch": printable(where), "error": one_line(f"{type(e).__name__}: {e}; tried again later")})

    def _take(self, path: Path, signature: tuple[int, int, int]) -> None:
        where = printable(str(path))
        try:
            check_utf8({"audio": str(path)}, where)         # the queue keeps UTF-8 only: a Latin-1 name is refused
            sidecar, sidecar_signature = self._sidecar(path)
            data = {**self.defaults, **sidecar}
            data["audio"] = str(path)
            if "captions" not in sidecar and "script" not in sidecar:
                data.update(captions_beside(path))
            if "output" not in sidecar:
                self.acceptor.confine_profile(data.get("delivery"))     # before its file is read for the suffix
                output = self.out / f"{path.stem}{self._suffix(data)}"
                data["output"] = str(output)
                if "overwrite" not in data:
                    data["overwrite"] = self._own_output(path, output)
            job = self.acceptor.accept(data, where, source="watch", watch_path=str(path),
                                       watch_files={"audio": signature, "sidecar": sidecar_signature})
        except TRANSIENT:                           # the file stays: taken again once it settles
            raise
        except Exception as e:  # noqa: BLE001 - a refused file, or a bug in its check: that file alone fails
            error, code = (str(e), e.exit_code) if isinstance(e, DittoError) else \
                (one_line(f"internal error: {type(e).__name__}: {e}; report it"), EXIT_INTERNAL)
            self.log({"watch": where, "state": "failed", "error": error, "exit_code": code})
            self._failed(path, error, code)
            return
        self.notify()
        self.log({"job": job["id"], "state": "queued", "watch": where, "output": job["output"]})

    def _own_output(self, path: Path, output: Path) -> bool:
        """Whether `path` may replace `output`: True when a job of a file of that name queued, runs or wrote it (a
        correction replaces its output), False when no watch job did; UsageError when another file's job did."""
        for job in self.queue.watched_output(str(output)):         # newest first
            active, wrote = job["status"] in ("queued", "running"), job["status"] == "done" and output.exists()
            if not (active or wrote):
                continue
            if job["watch_path"] == str(path):
                return True
            raise UsageError(f"{printable(str(path))}: its output {output} is "
                             f"{printable(Path(job['watch_path']).name)}'s (a job of this watch folder, "
                             f"{job['status']}); rename the file, or name another output in a sidecar "
                             f"{printable(path.stem)}.json")
        return False

    def _sidecar(self, path: Path) -> tuple[dict, tuple[int, int, int] | None]:
        """The request fields of `path`'s sidecar ({} without one) and the sidecar's signature as it was read."""
        side = path.with_suffix(".json")
        signature = file_signature(side)
        if signature is None:
            return {}, None
        try:
            data = json.loads(read_bounded(side, SIDECAR_MAX_BYTES, "a sidecar of request fields (JSON)"))
        except FileNotFoundError:
            return {}, None
        except (ValueError, RecursionError) as e:
            raise InputError(f"{printable(str(side))}: not valid JSON ({getattr(e, 'msg', 'nested too deep')}); "
                             "write the request's fields as one JSON object") from None
        if not isinstance(data, dict):
            raise InputError(f"{printable(str(side))}: expected a JSON object of request fields such as "
                             '{"avatar": "ruby"}')
        if "audio" in data:
            raise UsageError(f"{printable(str(side))}: a sidecar names no audio (the file beside it is the audio); "
                             'remove "audio"')
        return data, signature

    def _suffix(self, data: dict) -> str:
        if isinstance(data.get("delivery"), str):
            return load_profile(data["delivery"]).extension
        return default_suffix(data.get("codec") if isinstance(data.get("codec"), str) else None)

    def _file_away(self, job: dict) -> None:
        """Move the file an ended job took to done/ or failed/, with its sidecar if the job read that one (a sidecar
        that came later stays); a file changed since it was taken is another file, taken in turn."""
        path, taken = Path(job["watch_path"]), job["watch_files"]       # taken None: a server that kept none
        if not path.exists():
            pass
        elif taken and not _same(file_signature(path), taken["audio"]):
            self.log({"job": job["id"], "watch": printable(str(path)), "filed": False,
                      "why": "the file changed after this job took it: it is taken as a new file once it settles"})
        else:
            side = path.with_suffix(".json")
            with_side = not taken or taken["sidecar"] is not None and _same(file_signature(side), taken["sidecar"])
            if job["status"] == "done":
                self._move(path, self.folder / "done", with_side)
            else:
                self._failed(path, job["error"] or job["status"], job["exit_code"], with_side)
        self.queue.mark_moved(job["id"])

    def _move(self, path: Path, folder: Path, with_side: bool = True) -> Path:
        target = _aside(folder, path.name)
        os.replace(path, target)
        side = path.with_suffix(".json")
        if with_side and side.exists():
            os.replace(side, target.with_suffix(".json"))
        for field, caption_file in captions_beside(path).items():      # its captions or script go along
            os.replace(caption_file, target.with_suffix(Path(caption_file).suffix))
        return target

    def _failed(self, path: Path, error: str, exit_code: int | None, with_side: bool = True) -> None:
        target = self._move(path, self.folder / "failed", with_side)
        note = target.with_name(f"{target.stem}.error.txt")
        note.write_text(f"{printable(error)}\nexit code {exit_code}\n")
