"""The avatar store: where it lives, avatar names, directory locks, leftover temporaries, removal.

``<store_root()>/avatars/<name>/`` holds one avatar; ``.tmp-*`` siblings are avatars being
written (or replaced, or removed) and are never listed. Errors that name an avatar and the fix
are built here so every module words them the same way.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import time
import uuid
from pathlib import Path

from ditto_fast.core.files import file_signature
from ditto_fast.core.home import store_root
from ditto_fast.core.errors import AvatarError, InputError, UsageError

TMP_PREFIX = ".tmp-"
STALE_TMP_AGE_S = 3600.0
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")   # never a leading "-": it would read as an option


# ----------------------------------------------------------------------------- paths and names
def avatars_dir(root: str | os.PathLike | None = None) -> Path:
    """The directory holding one sub-directory per avatar."""
    return (Path(root) if root is not None else store_root()) / "avatars"


def avatar_signature(avatar_dir: Path) -> tuple | None:
    """What changes when any file of an avatar is replaced, rewritten in place or cut short (`cp`/`rsync --inplace`
    over it): each file's name and signature; None when the folder is gone."""
    try:
        names = sorted(e.name for e in os.scandir(avatar_dir) if e.is_file(follow_symlinks=False))
    except OSError:
        return None
    return tuple((name, file_signature(avatar_dir / name)) for name in names)


def validate_name(name: str) -> str:
    """Return name if it is 1-64 characters of [A-Za-z0-9_-] not starting with "-", else raise UsageError."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UsageError(
            f"invalid avatar name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ - , not starting with - "
            "(e.g. --name ruby_2)"
        )
    return name


def existing_names(adir: Path) -> list[str]:
    """Names of the avatar directories in adir (no temporaries), sorted."""
    if not adir.is_dir():
        return []
    return sorted(p.name for p in adir.iterdir() if NAME_RE.fullmatch(p.name) and p.is_dir())


def case_twin(adir: Path, name: str) -> str | None:
    """An avatar in adir whose name differs from `name` only in case (on SMB or macOS the two are one folder)."""
    folded = name.casefold()
    return next((n for n in existing_names(adir) if n != name and n.casefold() == folded), None)


def check_no_case_twin(adir: Path, name: str) -> None:
    """UsageError if adir holds an avatar whose name differs from `name` only in case."""
    twin = case_twin(adir, name)
    if twin is not None:
        raise UsageError(f"avatar name {name} differs from the existing avatar {twin} in {adir} only in case, and a "
                         f"case-insensitive disk (SMB, macOS) would hold both in one folder; choose another name, "
                         f"or replace that avatar with --name {twin} --force")


# ----------------------------------------------------------------------------- errors
def register_hint(name: str, source: str | None = None) -> str:
    """The command that rebuilds an avatar, for the end of an error message."""
    src = shlex.quote(source) if source else "SOURCE"
    return f"re-register with `ditto-fast register {src} --name {name} --force`"


def missing_error(name: str, adir: Path) -> AvatarError:
    """AvatarError for an avatar not in the store, listing the ones that are."""
    names = existing_names(adir)
    listed = ", ".join(names) if names else "none"
    return AvatarError(
        f"avatar '{name}' not found in {adir} (existing: {listed}); "
        f"create it with `ditto-fast register SOURCE --name {name}`"
    )


def damaged_error(name: str, d: Path, detail: str, source: str | None = None) -> AvatarError:
    """AvatarError for an avatar whose files fail a check."""
    return AvatarError(f"avatar '{name}' at {d} is damaged ({detail}); {register_hint(name, source)}")


# ----------------------------------------------------------------------------- locks and durability
def fsync_path(path: Path) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_dir(path: Path, blocking: bool = True) -> int | None:
    """Open a directory and take an exclusive flock on it; None if non-blocking and held elsewhere."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int | None) -> None:
    """Release a lock from lock_dir() (closing the descriptor releases the flock)."""
    if fd is not None:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Delete a directory moved aside, or just the link if it is a symlink (its target is left alone)."""
    if path.is_symlink():
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


def aside_path(adir: Path, what: str, name: str) -> Path:
    """A fresh temporary name in adir for an avatar directory moved out of the way."""
    return adir / f"{TMP_PREFIX}{what}-{name}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- the store directory
def ensure_writable_store(adir: Path) -> None:
    """Create adir if needed and raise InputError unless it is a writable directory."""
    fix = "set DITTO_FAST_HOME to a writable directory"
    try:
        adir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"avatar store {adir} cannot be created ({exc.strerror or exc}); {fix}") from exc
    if not adir.is_dir():
        raise InputError(f"avatar store {adir} is not a directory; {fix}")
    if not os.access(adir, os.W_OK | os.X_OK):
        raise InputError(f"avatar store {adir} is not writable; {fix}")


def clean_stale_tmp(adir: Path, max_age_s: float = STALE_TMP_AGE_S) -> list[Path]:
    """Delete .tmp-* entries of adir older than max_age_s that no live writer holds; return them."""
    removed: list[Path] = []
    if not adir.is_dir():
        return removed
    now = time.time()
    for p in adir.iterdir():
        if not p.name.startswith(TMP_PREFIX):
            continue
        try:
            if now - p.lstat().st_mtime < max_age_s:
                continue
            if p.is_dir() and not p.is_symlink():
                fd = lock_dir(p, blocking=False)
                if fd is None:  # a live writer holds it
                    continue
                try:
                    shutil.rmtree(p, ignore_errors=True)
                finally:
                    unlock(fd)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            continue
    return removed


def remove_avatar(name: str, root: str | os.PathLike | None = None) -> Path:
    """Delete an avatar directory (renamed aside first, so the name vanishes atomically)."""
    name = validate_name(name)
    adir = avatars_dir(root)
    d = adir / name
    if not d.is_dir():
        raise missing_error(name, adir)
    aside = aside_path(adir, "rm", name)
    try:
        os.rename(d, aside)
    except OSError as exc:
        raise InputError(f"cannot remove {d} ({exc.strerror or exc}); check the permissions of {adir}") from exc
    remove_tree(aside)
    return d
