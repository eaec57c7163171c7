"""The HLS playlists serve's live sessions stream to, each recorded by a small file in the server's home
(`serve/live/ID.json`) from the session's start to its end. A playlist ends with `#EXT-X-ENDLIST` once its stream is
closed; one whose server was killed mid-session never gets it, and players poll it as live for ever. So a session
that has ended has its playlist closed if its writer left it open, and at the next start each playlist still
recorded (its server died) is closed and logged. A `.ts` needs nothing: it ends where it was cut."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from ditto_fast.media.outputs import write_json

ENDLIST = "#EXT-X-ENDLIST"
WRITTEN_S = 5.0         # a playlist changed this recently may have a writer still (ffmpeg rewrites it every segment)


def open_since(path: str | os.PathLike) -> float | None:
    """When the HLS playlist at `path` was last written, if it lacks #EXT-X-ENDLIST (a stream not closed); None when
    it is closed, gone or no playlist."""
    path = Path(path)
    try:
        if not path.is_file():
            return None
        text = path.read_text("utf-8", "replace")
        return path.stat().st_mtime if text.startswith("#EXTM3U") and ENDLIST not in text else None
    except OSError:
        return None


def close_playlist(path: str | os.PathLike, wait_s: float = 0.0) -> bool | None:
    """Append #EXT-X-ENDLIST to the HLS playlist at `path` if it lacks one and nobody has written it for WRITTEN_S
    (waiting up to `wait_s` for that): True when appended, False when there is nothing to close, None when it is
    still being written (a writer that may yet close it)."""
    deadline = time.monotonic() + wait_s
    while True:
        since = open_since(path)
        if since is None:
            return False
        quiet = time.time() - since
        if quiet >= WRITTEN_S:
            break
        if time.monotonic() + (WRITTEN_S - quiet) > deadline:
            return None
        time.sleep(WRITTEN_S - quiet + 0.05)
    try:
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            newline = f.read(1) == b"\n"
            f.write((b"" if newline else b"\n") + ENDLIST.encode() + b"\n")
    except OSError:
        return False
    return True


class OpenPlaylists:
    """The records of the playlists sessions are streaming to, one JSON file per session in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _record(self, sid: str) -> Path:
        return self.folder / f"{sid}.json"

    def add(self, sid: str, playlist: str) -> None:
        """Session `sid` streams to `playlist` from now on (recorded before its stream starts)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self._record(sid), {"session": sid, "playlist": str(Path(playlist).absolute()),
                                       "since": round(time.time(), 3)})

    def recorded(self) -> list[str]:
        """The sessions with a record."""
        return sorted(p.stem for p in self.folder.glob("*.json")) if self.folder.is_dir() else []

    def playlist(self, sid: str) -> str | None:
        """The playlist session `sid` recorded (None: no record, or one that cannot be read)."""
        try:
            playlist = json.loads(self._record(sid).read_text("utf-8")).get("playlist")
        except (OSError, ValueError, AttributeError):
            return None
        return playlist if isinstance(playlist, str) else None

    def done(self, sid: str, wait_s: float = 0.0) -> bool | None:
        """Session `sid` has ended: its playlist closed if its writer left it open (close_playlist), its record
        removed; True when the playlist had to be closed here, None (the record kept, to look again) while it is
        still being written."""
        playlist = self.playlist(sid)
        closed = close_playlist(playlist, wait_s) if playlist is not None else False
        if closed is not None:
            self._record(sid).unlink(missing_ok=True)
        return closed

    def recover(self, log: Callable[[dict], None]) -> None:
        """At a server's start (its home held): close the playlists a server that is gone left recorded, each said
        in the log; one that another writer keeps writing is left to it."""
        for sid in self.recorded():
            playlist = self.playlist(sid)
            closed = self.done(sid, wait_s=WRITTEN_S + 1)
            if closed:
                log({"live": sid, "event": "playlist closed", "playlist": playlist,
                     "why": f"its server stopped without ending the session: {ENDLIST} added, so that players "
                            "stop waiting for more of it"})
            elif closed is None:
                self._record(sid).unlink(missing_ok=True)
                log({"live": sid, "event": "playlist left open", "playlist": playlist,
                     "why": "its server stopped without ending the session, and something writes it still"})
