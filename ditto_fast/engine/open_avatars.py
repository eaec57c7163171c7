"""The avatars a process renders from or checks jobs against, each opened once and opened again when any of its
files changed since (a re-registration, or a file copied over in place)."""

from __future__ import annotations

import threading

from ditto_fast.avatar import Avatar, load_avatar
from ditto_fast.avatar.store import avatar_signature, avatars_dir
from ditto_fast.checkpoints import CheckpointSet


class OpenAvatars:
    """Avatars opened (and checked against `checkpoints`) once each, keyed by the signature of their files;
    thread-safe (a server's request threads and render threads share one)."""

    def __init__(self, checkpoints: CheckpointSet):
        self.checkpoints = checkpoints
        self._open: dict[str, tuple[tuple | None, Avatar]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Avatar:
        """The avatar `name`; opened again if any of its files changed since it was opened."""
        with self._lock:
            cached = self._open.get(name)
            if cached is not None and avatar_signature(cached[1].dir) == cached[0]:
                return cached[1]
            signature = avatar_signature(avatars_dir() / name)
            avatar = load_avatar(name, checkpoints=self.checkpoints)
            self._open[name] = (signature, avatar)
            return avatar

    def signature(self, name: str) -> tuple | None:
        """The signature of the files of `name` as opened (None if not open)."""
        cached = self._open.get(name)
        return cached[0] if cached else None
