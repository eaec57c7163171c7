"""Avatar stage: registration and the avatar store (store: names and locks, format: the files and their
checksums, writer: writing one avatar, reader: loading and listing).

The names below are imported when first asked for (`from ditto_fast.avatar import load_avatar`), so that what
needs only the store's names (a request's check) does not load numpy or the writer."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ditto_fast.avatar.reader import Avatar, avatar_info, list_avatars, load_avatar
    from ditto_fast.avatar.store import remove_avatar, store_root, validate_name
    from ditto_fast.avatar.writer import AvatarWriter

_HOMES = {"Avatar": "reader", "avatar_info": "reader", "list_avatars": "reader", "load_avatar": "reader",
          "remove_avatar": "store", "store_root": "store", "validate_name": "store", "AvatarWriter": "writer"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """One of __all__, from its module (imported now); AttributeError for anything else (a submodule is then
    imported by the import system itself)."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
