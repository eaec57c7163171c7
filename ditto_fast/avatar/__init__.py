"""Avatar stage: registration and the avatar store (store: names and locks, format: the files and their
checksums, writer: writing one avatar, reader: loading and listing)."""

from ditto_fast.avatar.reader import Avatar, avatar_info, list_avatars, load_avatar
from ditto_fast.avatar.store import remove_avatar, store_root, validate_name
from ditto_fast.avatar.writer import AvatarWriter

__all__ = ["Avatar", "AvatarWriter", "avatar_info", "list_avatars", "load_avatar", "remove_avatar", "store_root",
           "validate_name"]
