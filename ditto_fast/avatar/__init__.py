"""Avatar stage: registration and the avatar cache."""

from .cache import Avatar, list_avatars, load_avatar, remove_avatar

__all__ = ["Avatar", "list_avatars", "load_avatar", "remove_avatar"]
