"""Avatars opened once for one set of checkpoints, and opened again when replaced in the store since."""

from __future__ import annotations

from ditto_fast.avatar import Avatar, load_avatar
from ditto_fast.avatar.store import avatars_dir
from ditto_fast.checkpoints import CheckpointSet
from ditto_fast.engine.clip import avatar_identity


class OpenAvatars:
    """The avatars a process renders from, each opened (and checked against `checkpoints`) once."""

    def __init__(self, checkpoints: CheckpointSet):
        self.checkpoints = checkpoints
        self._open: dict[str, tuple[tuple[int, int, int] | None, Avatar]] = {}

    def get(self, name: str) -> Avatar:
        """The avatar `name`; reopened if its record was replaced since it was opened."""
        cached = self._open.get(name)
        if cached is not None and avatar_identity(cached[1].dir) == cached[0]:
            return cached[1]
        key = avatar_identity(avatars_dir() / name)
        avatar = load_avatar(name, checkpoints=self.checkpoints)
        self._open[name] = (key, avatar)
        return avatar
