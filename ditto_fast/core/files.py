"""Reading a user's small file safely: a regular file only (a FIFO or a device would block or never end), read
with a limit that fits what it is, and values cut short before they go into a message; paths no file can have
refused by name, and a file name's bytes that are not UTF-8 shown readably."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ditto_fast.core.errors import InputError, UsageError

KIB, MIB = 1 << 10, 1 << 20
SHOWN_CHARS = 80            # the most of a user's value a message repeats
NAME_MAX, PATH_MAX = 255, 4095      # bytes: the longest file name and path Linux takes (PATH_MAX less its NUL)


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr(value) for a message, cut to `limit` characters (a 50 MB value is not echoed whole)."""
    if isinstance(value, (list, dict, tuple, set)) and len(value) > limit:
        return f"<a {type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 12]}... ({len(text)} chars)"


def printable(text: str) -> str:
    """`text` with the bytes of a file name that are not UTF-8 (Python's surrogate escapes) written as \\xNN, and
    any other lone surrogate as \\uNNNN: text any UTF-8 writer takes."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    return "".join(c if not "\ud800" <= c <= "\udfff" else
                   f"\\x{ord(c) - 0xdc00:02x}" if "\udc80" <= c <= "\udcff" else f"\\u{ord(c):04x}" for c in text)


def check_path_text(path: str | os.PathLike, what: str) -> None:
    """A path some file could have, before any OS call meets it half-way: UsageError (exit 2) naming `what` for a NUL
    byte; InputError (exit 3, check_path_length) for a name or a path longer than the disk allows."""
    text = os.fspath(path)
    if "\0" in text:
        raise UsageError(f"{what} {shown(printable(text))}: a file path cannot hold a NUL byte; give a real path")
    check_path_length(text, what)


def check_path_length(path: str | os.PathLike, what: str = "") -> None:
    """InputError (exit 3) when no file system here holds `path`: a name (any part) longer than the disk allows
    (NAME_MAX, 255 bytes on most) or a whole path longer than the system's PATH_MAX (4096)."""
    text = os.fspath(path)
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:          # a lone surrogate no byte of a file name makes (JSON's "\\ud800")
        encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= NAME_MAX:
        return                          # the common case: nothing to look up
    full = os.path.abspath(text) if "\0" not in text else text
    ancestor = next((p for p in Path(full).parents if os.path.isdir(p)), Path("/"))
    name_max, path_max = _limit(ancestor, "PC_NAME_MAX", NAME_MAX), _limit(ancestor, "PC_PATH_MAX", PATH_MAX + 1)
    named = f"{what} {shown(printable(text))}" if what else shown(printable(text))
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > name_max:
        raise InputError(f"{named}: a name in the path is {len(longest)} bytes, more than the {name_max} the disk "
                         "allows; choose a shorter name")
    whole = len(os.fsencode(full)) if full is not text else len(encoded)
    if whole >= path_max:
        raise InputError(f"{named}: the path is {whole} bytes, more than the {path_max - 1} the system allows; "
                         "choose a shorter path")


def _limit(folder: Path, name: str, usual: int) -> int:
    """The file system's limit `name` (os.pathconf) at `folder`, or `usual` where it cannot say."""
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return usual


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n / KIB:g} KiB" if n >= KIB else f"{n} bytes"


def check_regular(path: Path, what: str) -> os.stat_result:
    """The file's stat; InputError (exit 3) when `path` is a directory, a FIFO, a device or a socket.
    FileNotFoundError passes through for the caller's own message."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory; give {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise InputError(f"{path}: is {kind}, not a regular file; give {what}")
    return st


def read_bounded(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; InputError (exit 3) naming the file for a
    directory, FIFO, device or a file larger than `limit`. FileNotFoundError passes through."""
    path = Path(path)
    st = check_regular(path, what)
    if st.st_size > limit:
        raise InputError(f"{path}: is {_size(st.st_size)}, more than {what} can be (at most {_size(limit)}); "
                         "check the path")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # never blocks, even if swapped for a FIFO
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: is not a regular file; give {what}")
        chunks, total = [], 0
        while block := os.read(fd, min(limit + 1 - total, 1 << 20) or 1):
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise InputError(f"{path}: is more than {what} can be (at most {_size(limit)}); check the path")
    finally:
        os.close(fd)
    return b"".join(chunks)


def unreadable(path: str | os.PathLike, exc: OSError, what: str) -> InputError:
    """The InputError (exit 3) for a file a user named that is missing or cannot be read (`exc`, from opening or
    stat-ing it); `what` names the expected file in the fix, e.g. "a config file"."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return InputError(f"{path}: file not found; give {what}")
    if isinstance(exc, PermissionError):
        return InputError(f"{path}: cannot read the file (permission denied); check its permissions")
    return InputError(f"{path}: cannot read the file ({exc.strerror or exc}); give {what}")


def read_input(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """read_bounded for a file a user named (a config, a jobs file, a token file ...): InputError (exit 3) naming
    it when it is missing or unreadable too."""
    try:
        return read_bounded(path, limit, what)
    except OSError as e:
        raise unreadable(path, e, what) from None


def file_signature(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """A file's inode, size and modification time (None if it is gone): what changes when it is replaced or grows."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
