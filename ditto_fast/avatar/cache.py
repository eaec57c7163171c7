"""Avatar cache: write, read, list and remove the per-avatar directories of the store.

Layout (DESIGN.md "Avatar cache"): ``<store_root()>/avatars/<name>/`` holds

- ``avatar.pkl``  light pickle: an envelope ``{"kind", "format_version", "body_sha256", "body"}``
  whose ``body`` is the pickled metadata dict (format version, source metadata, checkpoint
  fingerprints, crop parameters, per-frame ``x_s_info`` / ``M_c2o`` / ``eye_open`` / ``eye_ball``,
  ``sc``, ``is_image``, created time, ``random_weights``, checksums of the other files). The
  envelope's sha256 makes any edit of the pickle detectable; both levels are read with
  ``safe_pickle`` (numpy arrays and plain containers only).
- ``f_s.npy``     ``[N, C, D, 64, 64]`` float16 appearance features, memory-mapped when loaded.
- ``plate.mp4`` (video) or ``plate.png`` (image): the background plate, written by registration.

Public API
- ``store_root() -> Path``: ``$DITTO_FAST_HOME`` or ``~/.cache/ditto-fast`` (read on every call).
- ``validate_name(name) -> str``: ``[A-Za-z0-9_-]{1,64}`` or UsageError.
- ``AvatarWriter(name, force=False, root=None)``: context manager writing one avatar into a
  temporary sibling ``<root>/avatars/.tmp-<name>-<random>``; ``tmp_dir``,
  ``open_f_s(max_frames, shape_tail=(32, 16, 64, 64))``, ``write_f_s(start, batch)`` (rows in order,
  streamed to the file with flat memory, CRC-32 per row, on a writer thread), ``plate_path(is_image)``,
  ``finish(meta)`` (see ``AvatarWriter.finish`` for the keys of ``meta``). The avatar appears
  under its name only when complete (rename; with ``force`` an atomic exchange where the OS
  supports it). Any exception in the with-block removes the temporary directory.
- ``load_avatar(name_or_dir, expected_fingerprints=None, verify="size", root=None) -> Avatar``.
  ``verify``: ``"light"`` (structure and file sizes), ``"size"`` (+ f_s header and a sampled
  "quick" sha256 of each file; the default, a few MB read), ``"full"`` (+ every byte: the plate's
  sha256, and for f_s.npy a CRC-32 per frame row, ``row_crc32`` [N] uint32, of the rows after the
  fixed 4096-byte header (``rows_offset``), so a damaged cache names its first bad frame; caches
  written before per-row CRCs carry one sha256 of the rows instead, checked the same way).
- ``list_avatars(root=None) -> list[dict]``, ``avatar_info(name, verify="size", root=None) -> dict``,
  ``remove_avatar(name, root=None) -> Path``.

Unfinished ``.tmp-*`` directories of crashed registrations are never listed; those older than
an hour and not locked by a live writer are deleted by ``list_avatars`` and ``AvatarWriter``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import pickle
import re
import shlex
import shutil
import tempfile
import time
import uuid
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ditto_fast.avatar import safe_pickle
from ditto_fast.errors import AvatarError, InputError, UsageError

FORMAT_VERSION = 1
ENVELOPE_KIND = "ditto-fast-avatar"
PKL_NAME = "avatar.pkl"
F_S_NAME = "f_s.npy"
PLATE_VIDEO = "plate.mp4"
PLATE_IMAGE = "plate.png"
TMP_PREFIX = ".tmp-"
STALE_TMP_AGE_S = 3600.0
F_S_DTYPE = np.dtype(np.float16)
F_S_TAIL_FULL = (32, 16, 64, 64)
VERIFY_LEVELS = ("light", "size", "full")
CACHE_FPS = 25.0  # registration streams source frames at 25 fps (DESIGN.md data flow)

# per-frame x_s_info arrays: name -> trailing shape (leading dim is the frame count N)
X_S_INFO_SHAPES: dict[str, tuple[int, ...]] = {
    "pitch": (66,), "yaw": (66,), "roll": (66,), "t": (3,), "exp": (63,), "scale": (1,), "kp": (63,),
}
# other per-frame arrays: name -> (trailing shape, dtype)
FRAME_ARRAYS: dict[str, tuple[tuple[int, ...], np.dtype]] = {
    "M_c2o": ((3, 3), np.dtype(np.float64)),
    "eye_open": ((2,), np.dtype(np.float32)),
    "eye_ball": ((6,), np.dtype(np.float32)),
}
SC_SHAPE = (63,)
# meta keys finish() interprets or sets itself; any other key is kept under body["extra"]
_META_KEYS = frozenset({"source", "fingerprints", "crop", "x_s_info", *FRAME_ARRAYS, "sc", "is_image",
                        "random_weights", "fps", "size", "extra", "format_version", "created"})

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_QUICK_EDGE = 1 << 20  # bytes hashed at the head and the tail of a file
_QUICK_BLOCK = 1 << 16  # bytes of each sampled block in between
_QUICK_SAMPLES = 16
_HASH_CHUNK = 1 << 22
_RELEASE_BYTES = 64 << 20  # buffered f_s writes start write-back and drop written pages after this many bytes
F_S_HEADER_BYTES = 4096    # f_s.npy header (magic, version, dict padded with spaces): the rows start on a
                           # page boundary, as direct I/O needs
_DIRECT_IO = hasattr(os, "O_DIRECT")   # write f_s rows past the page cache where the file system allows


# ----------------------------------------------------------------------------- paths and names
def store_root() -> Path:
    """The store root: $DITTO_FAST_HOME, else ~/.cache/ditto-fast (read on every call)."""
    env = os.environ.get("DITTO_FAST_HOME")
    return Path(env).expanduser() if env else Path("~/.cache/ditto-fast").expanduser()


def avatars_dir(root: str | os.PathLike | None = None) -> Path:
    """The directory holding one sub-directory per avatar."""
    return (Path(root) if root is not None else store_root()) / "avatars"


def validate_name(name: str) -> str:
    """Return name if it is 1-64 characters of [A-Za-z0-9_-], else raise UsageError."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise UsageError(
            f"invalid avatar name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ - (e.g. --name ruby_2)"
        )
    return name


def _existing_names(adir: Path) -> list[str]:
    """Names of the avatar directories in adir (no temporaries), sorted."""
    if not adir.is_dir():
        return []
    return sorted(p.name for p in adir.iterdir() if _NAME_RE.fullmatch(p.name) and p.is_dir())


def _register_hint(name: str, source: str | None = None) -> str:
    src = shlex.quote(source) if source else "SOURCE"
    return f"re-register with `ditto-fast register {src} --name {name} --force`"


def _missing_error(name: str, adir: Path) -> AvatarError:
    names = _existing_names(adir)
    listed = ", ".join(names) if names else "none"
    return AvatarError(
        f"avatar '{name}' not found in {adir} (existing: {listed}); "
        f"create it with `ditto-fast register SOURCE --name {name}`"
    )


def _damaged(name: str, adir: Path, detail: str, source: str | None = None) -> AvatarError:
    return AvatarError(f"avatar '{name}' at {adir} is damaged ({detail}); {_register_hint(name, source)}")


# ----------------------------------------------------------------------------- checksums
def file_sha256(path: Path, offset: int = 0) -> str:
    """sha256 of a file from byte `offset` to its end, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def row_crc32(path: Path, offset: int, row_bytes: int, n_rows: int) -> np.ndarray:
    """CRC-32 of each of n_rows rows of row_bytes bytes from byte `offset` of a file: [n_rows] uint32."""
    out = np.zeros(n_rows, np.uint32)
    with open(path, "rb") as f:
        f.seek(offset)
        buf = bytearray(row_bytes)
        for i in range(n_rows):
            if f.readinto(buf) != row_bytes:     # a buffered file reads until full or at the end
                raise EOFError(f"{path} ends inside row {i}")
            out[i] = zlib.crc32(buf)
    return out


def quick_hash(path: Path) -> str:
    """sha256 over the size, first and last MiB and 16 sampled 64 KiB blocks of a file."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        h.update(str(size).encode())
        spans = [(0, min(size, _QUICK_EDGE))]
        for k in range(1, _QUICK_SAMPLES + 1):
            spans.append((k * size // (_QUICK_SAMPLES + 1), _QUICK_BLOCK))
        spans.append((max(0, size - _QUICK_EDGE), _QUICK_EDGE))
        for off, n in spans:
            h.update(os.pread(fd, n, off))
    finally:
        os.close(fd)
    return h.hexdigest()


def _file_record(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": file_sha256(path), "quick": quick_hash(path)}


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """An .npy version 1.0 header for a C-order array, padded to exactly F_S_HEADER_BYTES."""
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                 "shape": tuple(int(v) for v in shape)}).encode("latin1")
    room = F_S_HEADER_BYTES - 10          # magic (6) + version (2) + header length (2)
    if len(text) + 1 > room:
        raise ValueError(f"f_s shape {shape} does not fit a {F_S_HEADER_BYTES}-byte header")
    return b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + text + b" " * (room - len(text) - 1) + b"\n"


def combined_fingerprint(fingerprints: dict[str, str]) -> str:
    """One short hash standing for a dict of per-network fingerprints."""
    text = "\n".join(f"{k}={fingerprints[k]}" for k in sorted(fingerprints))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- filesystem helpers
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_dir(path: Path, blocking: bool = True) -> int | None:
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


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


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
                fd = _lock_dir(p, blocking=False)
                if fd is None:  # a live writer holds it
                    continue
                try:
                    shutil.rmtree(p, ignore_errors=True)
                finally:
                    _unlock(fd)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            continue
    return removed


def _ensure_writable_store(adir: Path) -> None:
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


# ----------------------------------------------------------------------------- metadata checks
def _plain(obj: Any, where: str) -> Any:
    """Copy obj into numpy arrays and plain containers only (numpy scalars -> Python, Path -> str)."""
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: object arrays cannot be cached")
        return np.array(obj)  # a plain owned copy, never a memmap or a view
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, dict):
        return {_plain(k, where): _plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [_plain(v, f"{where}[]") for v in obj]
        return type(obj)(items) if not isinstance(obj, list) else items
    raise TypeError(f"{where}: {type(obj).__name__} cannot be cached (numpy arrays and plain containers only)")


def _frame_array(value: Any, n: int, tail: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
    if arr.shape != (n, *tail):
        # accept [N, *tail] given with extra singleton dims, e.g. [N,1,66] or [N,21,3] for kp
        if arr.size == n * int(np.prod(tail)) and arr.ndim >= 1 and arr.shape[0] == n:
            arr = arr.reshape(n, *tail)
        else:
            raise ValueError(f"{what}: expected shape {(n, *tail)}, got {arr.shape}")
    return arr


def _check_body(body: Any) -> None:
    """Raise ValueError/KeyError/TypeError if a decoded body is not a complete avatar record."""
    if not isinstance(body, dict):
        raise TypeError("metadata is not a dict")
    n = int(body["n_frames"])
    if n < 1:
        raise ValueError("no frames")
    for k, tail in X_S_INFO_SHAPES.items():
        a = body["x_s_info"][k]
        if not isinstance(a, np.ndarray) or a.shape != (n, *tail):
            raise ValueError(f"x_s_info[{k}] has the wrong shape")
    for k, (tail, dtype) in FRAME_ARRAYS.items():
        a = body[k]
        if not isinstance(a, np.ndarray) or a.shape != (n, *tail) or a.dtype != dtype:
            raise ValueError(f"{k} has the wrong shape or dtype")
    if not isinstance(body["sc"], np.ndarray) or body["sc"].shape != SC_SHAPE:
        raise ValueError("sc has the wrong shape")
    shape = tuple(body["f_s_shape"])
    if len(shape) != 5 or shape[0] != n:
        raise ValueError("f_s shape record is wrong")
    for key in ("checksums", "fingerprints", "source", "crop"):
        if not isinstance(body[key], dict):
            raise TypeError(f"{key} is not a dict")
    if body["plate"] not in (PLATE_VIDEO, PLATE_IMAGE) or body["plate"] != (
        PLATE_IMAGE if body["is_image"] else PLATE_VIDEO
    ):
        raise ValueError("plate record is wrong")
    for fname in (F_S_NAME, body["plate"]):
        rec = body["checksums"][fname]
        if not isinstance(rec, dict):
            raise TypeError(f"checksum record of {fname} is not a dict")
        crcs = rec.get("row_crc32")
        if crcs is not None:   # per-row CRCs (f_s.npy); else one sha256 of the file or of its rows
            ok = fname == F_S_NAME and isinstance(crcs, np.ndarray) and crcs.dtype == np.uint32 \
                and crcs.shape == (n,) and isinstance(rec.get("rows_offset"), int)
        else:
            ok = isinstance(rec.get("sha256"), str) and isinstance(rec.get("sha256_offset", 0), int)
        if not (isinstance(rec["size"], int) and isinstance(rec["quick"], str) and ok):
            raise ValueError(f"checksum record of {fname} is wrong")
    if len(body["size"]) != 2 or float(body["fps"]) <= 0:
        raise ValueError("size or fps is wrong")


# ----------------------------------------------------------------------------- writing
class _FeatureFile:
    """f_s.npy being written: rows appended in order, each row's CRC-32 taken as it goes, the header set at the end.

    Rows go out with direct I/O (O_DIRECT, from a page-aligned staging buffer) where the file
    system allows it: 4 MiB a frame then costs no page-cache copy, no write-back later and no long
    fsync at the end. Elsewhere they are written through the page cache, with write-back started
    and written pages dropped every _RELEASE_BYTES.

    The CRCs and the write of one batch run on a single writer thread while the caller goes on (both
    release the GIL); at most one batch is in flight, the caller fills the other of two staging
    buffers meanwhile, and a write error is raised by the next append() or by finish().
    """

    def __init__(self, path: Path, max_rows: int, tail: tuple[int, ...]) -> None:
        self.path, self.max_rows, self.tail = path, max_rows, tail
        self.row_bytes = int(np.prod(tail)) * F_S_DTYPE.itemsize
        self.rows = 0
        self._crcs: list[int] = []
        self._unreleased = 0
        self._stages: list[mmap.mmap | None] = [None, None]
        self._free = 0                          # the staging buffer buffer() hands out next
        self._pending: Future | None = None     # the batch being written
        self._writer: ThreadPoolExecutor | None = None
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._direct = -1
        if _DIRECT_IO and self.row_bytes % F_S_HEADER_BYTES == 0:
            try:
                self._direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError:
                pass   # e.g. tmpfs: buffered writes
        os.pwrite(self._fd, _npy_header((max_rows, *tail), F_S_DTYPE), 0)

    def append(self, start: int, batch: np.ndarray) -> None:
        """Queue rows [start, start + B) (start == rows so far) for writing as float16; returns at once."""
        rows = np.ascontiguousarray(batch, dtype=F_S_DTYPE)
        if rows.shape[1:] != self.tail:
            raise ValueError(f"f_s rows must be [B, {', '.join(map(str, self.tail))}], got {list(rows.shape)}")
        stop = start + len(rows)
        if start != self.rows:
            raise IndexError(f"f_s rows are written in order: expected row {self.rows}, got {start}")
        if stop > self.max_rows:
            raise IndexError(f"rows {start}:{stop} out of range for {self.max_rows} frames")
        n = len(rows) * self.row_bytes
        k = self._free
        if self._pending is not None and self._overlaps(1 - k, rows):
            raise ValueError("these f_s rows are in the buffer still being written; take a fresh f_s_buffer() "
                             "for every batch")
        if not self._holds(k, rows):            # the caller's own array: it may change it once we return
            stage = self.buffer(len(rows))
            np.copyto(stage, rows)
        self._wait()                            # the other buffer's write is done: at most one in flight
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="f_s-writer")
        view = memoryview(self._stages[k])[:n]
        self._pending = self._writer.submit(self._write, view, F_S_HEADER_BYTES + start * self.row_bytes)
        self._free = 1 - k
        self.rows = stop

    def _stage_address(self, k: int) -> int | None:
        """Memory address of staging buffer k, None if it was never made."""
        stage = self._stages[k]
        return None if stage is None else np.frombuffer(stage, np.uint8).ctypes.data

    def _overlaps(self, k: int, rows: np.ndarray) -> bool:
        """True if rows lie (partly) in staging buffer k."""
        lo = self._stage_address(k)
        return lo is not None and rows.ctypes.data < lo + len(self._stages[k]) and lo < rows.ctypes.data + rows.nbytes

    def _holds(self, k: int, rows: np.ndarray) -> bool:
        """True if rows start at the beginning of staging buffer k."""
        return rows.ctypes.data == self._stage_address(k)

    def buffer(self, n_rows: int) -> np.ndarray:
        """A page-aligned float16 [n_rows, *tail] staging array: rows filled in place are written without a copy.

        Valid until the next append(); two buffers alternate, so one fills while the other is written.
        """
        n = n_rows * self.row_bytes
        k = self._free
        if self._stages[k] is None or len(self._stages[k]) < n:
            self._stages[k] = mmap.mmap(-1, n)          # anonymous mappings start on a page boundary
        return np.frombuffer(self._stages[k], F_S_DTYPE, count=n // F_S_DTYPE.itemsize).reshape(n_rows, *self.tail)

    def _write(self, data: memoryview, offset: int) -> list[int]:
        """(writer thread) The rows' CRC-32s, then the rows to the file: direct I/O, else the page cache."""
        rb = self.row_bytes
        crcs = [zlib.crc32(data[k:k + rb]) for k in range(0, len(data), rb)]
        if self._direct >= 0:
            try:
                _pwrite_all(self._direct, data, offset)
                return crcs
            except OSError:    # the file system refused direct I/O after all
                os.close(self._direct)
                self._direct = -1
        _pwrite_all(self._fd, data, offset)
        self._unreleased += len(data)
        if self._unreleased >= _RELEASE_BYTES:
            self._release()
        return crcs

    def _wait(self) -> None:
        """Wait for the batch in flight; keep its CRCs or raise its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._crcs.extend(pending.result())

    def _release(self) -> None:
        """Start write-back of what was written and drop clean pages from the page cache."""
        self._unreleased = 0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def finish(self, n: int) -> dict[str, Any]:
        """Write the header for n rows (n must equal the rows written), fsync, close; the checksum record."""
        try:
            self._wait()
            if n != self.rows:
                raise ValueError(f"meta has {n} frames but f_s has {self.rows} rows written "
                                 f"(opened for at most {self.max_rows})")
            os.pwrite(self._fd, _npy_header((n, *self.tail), F_S_DTYPE), 0)
            os.fsync(self._fd)
        finally:
            self.close()
        return {"size": F_S_HEADER_BYTES + n * self.row_bytes, "row_crc32": np.array(self._crcs, np.uint32),
                "rows_offset": F_S_HEADER_BYTES, "quick": quick_hash(self.path)}

    def close(self) -> None:
        """Let a write in flight end (its error is dropped), stop the writer thread, close the file."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self._pending = None
        for fd in (self._fd, self._direct):
            if fd >= 0:
                os.close(fd)
        self._fd = self._direct = -1
        self._stages = [None, None]   # unmapped once no array handed out by buffer() refers to them


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


class AvatarWriter:
    """Context manager that writes one avatar to a temporary directory and renames it into place."""

    def __init__(self, name: str, force: bool = False, root: str | os.PathLike | None = None) -> None:
        self.name = validate_name(name)
        self.force = force
        self.adir = avatars_dir(root)
        self.final_dir = self.adir / self.name
        self.tmp_dir: Path | None = None
        self._lock_fd: int | None = None
        self._f_s: _FeatureFile | None = None
        self._finished = False

    def __enter__(self) -> "AvatarWriter":
        _ensure_writable_store(self.adir)
        clean_stale_tmp(self.adir)
        if self.final_dir.exists() and not self.force:
            raise UsageError(f"avatar {self.name} exists in {self.adir}; use --force to replace it")
        try:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.name}-", dir=self.adir))
            os.chmod(self.tmp_dir, 0o755)
            self._lock_fd = _lock_dir(self.tmp_dir)
        except OSError as exc:
            self._discard()
            raise InputError(
                f"avatar store {self.adir} is not writable ({exc.strerror or exc}); "
                "set DITTO_FAST_HOME to a writable directory"
            ) from exc
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self._finished:
            self._discard()
            if exc_type is None:
                raise RuntimeError(f"AvatarWriter({self.name!r}) ended without finish(); nothing was written")
        return False

    def _discard(self) -> None:
        """Remove the temporary directory and release its lock."""
        if self._f_s is not None:
            self._f_s.close()
        self._f_s = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
        _unlock(self._lock_fd)
        self._lock_fd = None

    def _need_tmp(self) -> Path:
        if self.tmp_dir is None or self._finished:
            raise RuntimeError("AvatarWriter is not open; use it as a context manager")
        return self.tmp_dir

    def open_f_s(self, max_frames: int, shape_tail: tuple[int, ...] = F_S_TAIL_FULL) -> None:
        """Start f_s.npy for at most max_frames rows [*shape_tail] float16, filled by write_f_s().

        max_frames may be an upper bound: the file holds the rows written, and finish() records
        that count (which must equal the meta's frame count) in its header.
        """
        tmp = self._need_tmp()
        if self._f_s is not None:
            raise RuntimeError("open_f_s() was already called")
        shape_tail = tuple(int(s) for s in shape_tail)
        if int(max_frames) < 1 or len(shape_tail) != 4 or min(shape_tail) < 1:
            raise ValueError(f"f_s shape must be [N>=1, C, D, H, W], got {(max_frames, *shape_tail)}")
        self._f_s = _FeatureFile(tmp / F_S_NAME, int(max_frames), shape_tail)

    def f_s_buffer(self, n_rows: int) -> np.ndarray:
        """A float16 [n_rows, C, D, H, W] array to fill and pass to write_f_s(), which then writes it without a copy.

        Ask for a fresh one for every batch: the array handed to write_f_s() is still being written
        until the next write_f_s() returns, and passing it again is refused.
        """
        if self._f_s is None:
            raise RuntimeError("f_s_buffer() before open_f_s()")
        return self._f_s.buffer(n_rows)

    def write_f_s(self, start: int, batch: np.ndarray) -> None:
        """Append f_s rows [start, start + B); start must be the number of rows written so far.

        batch: [B, C, D, 64, 64] (any float dtype; cast to float16). The rows' CRC-32s and their
        write run on a writer thread while the caller goes on (an array not from f_s_buffer() is
        copied first, so the caller may change it at once); finish() neither re-reads nor re-hashes
        the file. A failed write is raised by the next write_f_s() or by finish().
        """
        if self._f_s is None:
            raise RuntimeError("write_f_s() before open_f_s()")
        self._f_s.append(start, batch)

    def plate_path(self, is_image: bool) -> Path:
        """Where registration writes the background plate (plate.png for an image, else plate.mp4)."""
        return self._need_tmp() / (PLATE_IMAGE if is_image else PLATE_VIDEO)

    def finish(self, meta: dict[str, Any]) -> Path:
        """Checksum, write avatar.pkl, fsync and rename into place; return the avatar directory.

        meta keys (numpy values are fine; N = number of frames):
          source: {path, sha256, fps, size: (w, h), n_frames, ...} (stored as given)
          fingerprints: {network: short hash} (e.g. CheckpointSet.avatar_fingerprints())
          fps: rate of the cached frames and plate (optional, default 25)
          size: (w, h) of the cached frames and plate (optional, default source["size"])
          crop: dict   x_s_info: {pitch, yaw, roll [N,66], t [N,3], exp [N,63], scale [N,1], kp [N,63]}
          M_c2o [N,3,3]   eye_open [N,2]   eye_ball [N,6]   sc [63]   is_image: bool
          random_weights: bool   extra: dict (optional, plain data; unknown keys are added to it)
        format_version and created are set here (values given in meta are ignored).
        N must equal the f_s rows written (at most the frames given to open_f_s()).
        """
        tmp = self._need_tmp()
        if self._f_s is None:
            raise RuntimeError("finish() before open_f_s(): f_s.npy was not written")
        body = self._build_body(tmp, meta)
        pkl = tmp / PKL_NAME
        with open(pkl, "wb") as f:
            f.write(_envelope(body))
            f.flush()
            os.fsync(f.fileno())
        _fsync_path(tmp)
        self._install(tmp)
        return self.final_dir

    def _build_body(self, tmp: Path, meta: dict[str, Any]) -> dict[str, Any]:
        """Validate meta, complete and sync f_s, checksum files; return the pickle body."""
        x_in = meta["x_s_info"]
        n = int(np.asarray(meta["M_c2o"]).shape[0])
        x_s_info = {k: _frame_array(x_in[k], n, t, np.dtype(np.float32), f"x_s_info[{k}]")
                    for k, t in X_S_INFO_SHAPES.items()}
        frame = {k: _frame_array(meta[k], n, t, d, k) for k, (t, d) in FRAME_ARRAYS.items()}
        sc = np.asarray(meta["sc"], dtype=np.float32).reshape(SC_SHAPE)
        is_image = bool(meta["is_image"])

        plate_name = PLATE_IMAGE if is_image else PLATE_VIDEO
        other = PLATE_VIDEO if is_image else PLATE_IMAGE
        plate = tmp / plate_name
        if not plate.is_file():
            raise ValueError(f"the plate was not written to {plate}")
        if (tmp / other).exists():
            raise ValueError(f"both plate files exist in {tmp}; write only {plate_name}")
        _fsync_path(plate)

        source = _plain(dict(meta["source"]), "source")
        source.setdefault("n_frames", n)
        size = tuple(int(v) for v in meta.get("size", source["size"]))
        if len(size) != 2:
            raise ValueError(f"frame size must be (w, h), got {size}")
        fps = float(meta.get("fps", CACHE_FPS))
        extra = _plain(dict(meta.get("extra", {})), "extra")
        extra.update({k: _plain(v, k) for k, v in meta.items() if k not in _META_KEYS})
        crop = _plain(dict(meta.get("crop", {})), "crop")
        fingerprints = {str(k): str(v) for k, v in dict(meta["fingerprints"]).items()}
        f_s = self._f_s
        self._f_s = None
        f_s_record = f_s.finish(n)          # header for n rows, fsync'd; CRC-32 of each row as written
        f_s_shape = (n, *f_s.tail)
        body = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "n_frames": n,
            "f_s_shape": f_s_shape,
            "is_image": is_image,
            "fps": fps,
            "size": size,
            "source": source,
            "fingerprints": fingerprints,
            "random_weights": bool(meta.get("random_weights", False)),
            "crop": crop,
            "x_s_info": x_s_info,
            **frame,
            "sc": sc,
            "plate": plate_name,
            "checksums": {F_S_NAME: f_s_record, plate_name: _file_record(plate)},
            "extra": extra,
        }
        _check_body(body)
        return body

    def _install(self, tmp: Path) -> None:
        """Move tmp to the final name: plain rename, or (force) atomic replace of the old avatar."""
        try:
            os.rename(tmp, self.final_dir)
        except OSError as exc:
            if not self.final_dir.exists():
                raise
            if not self.force:
                raise UsageError(f"avatar {self.name} exists in {self.adir}; use --force to replace it") from exc
            self._replace(tmp)
        else:
            self._mark_installed()
        _fsync_path(self.adir)

    def _replace(self, tmp: Path) -> None:
        """Swap tmp with the existing avatar directory, then delete the old one."""
        old_fd = _lock_dir(self.final_dir)
        try:
            if _exchange(tmp, self.final_dir):
                old = tmp  # tmp's path now holds the old avatar
                self._mark_installed()
            else:
                old = self.adir / f"{TMP_PREFIX}old-{self.name}-{uuid.uuid4().hex[:8]}"
                os.rename(self.final_dir, old)
                try:
                    os.rename(tmp, self.final_dir)
                except BaseException:
                    os.rename(old, self.final_dir)
                    raise
                self._mark_installed()
            _fsync_path(self.adir)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            _unlock(old_fd)

    def _mark_installed(self) -> None:
        self._finished = True
        self.tmp_dir = None
        _unlock(self._lock_fd)
        self._lock_fd = None


def _envelope(body: dict[str, Any]) -> bytes:
    """Pickle body inside an envelope carrying the format version and the body's sha256."""
    raw = pickle.dumps(body, protocol=5)
    env = {"kind": ENVELOPE_KIND, "format_version": FORMAT_VERSION,
           "body_sha256": hashlib.sha256(raw).hexdigest(), "body": raw}
    return pickle.dumps(env, protocol=5)


# ----------------------------------------------------------------------------- reading
@dataclass
class Avatar:
    """A loaded avatar: light metadata in memory, f_s memory-mapped, the plate left on disk."""

    name: str
    dir: Path
    n_frames: int
    is_image: bool
    fps: float  # rate of the cached frames and the plate
    size: tuple[int, int]  # (w, h) of the cached frames and the plate
    x_s_info: dict[str, np.ndarray]  # pitch/yaw/roll [N,66], t [N,3], exp [N,63], scale [N,1], kp [N,63]
    M_c2o: np.ndarray  # [N, 3, 3] float64
    eye_open: np.ndarray  # [N, 2]
    eye_ball: np.ndarray  # [N, 6]
    sc: np.ndarray  # [63]
    f_s: np.ndarray  # [N, C, D, 64, 64] float16 memmap (read-only)
    plate_path: Path
    fingerprints: dict[str, str]
    random_weights: bool
    meta: dict[str, Any] = field(repr=False)

    def frame_info(self, i: int) -> dict[str, np.ndarray]:
        """x_s_info rows of frame i, each with leading dim 1 ([1, 66], [1, 3], ...)."""
        if not 0 <= i < self.n_frames:
            raise IndexError(f"frame {i} out of range for {self.n_frames} frames")
        return {k: v[i : i + 1] for k, v in self.x_s_info.items()}


def _resolve(name_or_dir: str | os.PathLike, root: str | os.PathLike | None) -> tuple[str, Path, Path]:
    """(name, avatar dir, avatars dir) for a store name or a directory path."""
    if isinstance(name_or_dir, os.PathLike) or os.sep in str(name_or_dir):
        d = Path(name_or_dir).expanduser()
        return d.name, d, d.parent
    name = validate_name(str(name_or_dir))
    adir = avatars_dir(root)
    return name, adir / name, adir


def _read_body(name: str, d: Path) -> dict[str, Any]:
    """Read and check avatar.pkl of directory d; AvatarError when stale or damaged."""
    pkl = d / PKL_NAME
    try:
        with open(pkl, "rb") as f:
            env = safe_pickle.load(f, what=str(pkl), hint=_register_hint(name))
    except FileNotFoundError:
        raise _damaged(name, d, f"{PKL_NAME} is missing") from None
    except OSError as exc:
        raise _damaged(name, d, f"{PKL_NAME} unreadable: {exc.strerror or exc}") from exc
    if not isinstance(env, dict) or env.get("kind") != ENVELOPE_KIND:
        raise _damaged(name, d, f"{PKL_NAME} is not a ditto-fast avatar file")
    version = env.get("format_version")
    if version != FORMAT_VERSION:
        raise AvatarError(
            f"avatar '{name}' at {d} has cache format {version}, this ditto-fast reads format "
            f"{FORMAT_VERSION}; {_register_hint(name)}"
        )
    raw = env.get("body")
    if not isinstance(raw, bytes) or hashlib.sha256(raw).hexdigest() != env.get("body_sha256"):
        raise _damaged(name, d, f"{PKL_NAME} fails its checksum")
    body = safe_pickle.loads(raw, what=str(pkl), hint=_register_hint(name))
    try:
        _check_body(body)
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged(name, d, f"{PKL_NAME} incomplete: {exc}") from exc
    return body


def _check_files(name: str, d: Path, body: dict[str, Any], verify: str) -> np.ndarray:
    """Check f_s and the plate against the pickle at the given level; return the f_s memmap."""
    src = body["source"].get("path")
    checks = body["checksums"]
    for fname in (F_S_NAME, body["plate"]):
        rec = checks.get(fname)
        p = d / fname
        if rec is None:
            raise _damaged(name, d, f"no checksum for {fname}", src)
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise _damaged(name, d, f"{fname} is missing", src) from None
        if size != rec["size"]:
            raise _damaged(name, d, f"{fname} has {size} bytes, expected {rec['size']}", src)
        if verify == "size" and quick_hash(p) != rec["quick"]:
            raise _damaged(name, d, f"{fname} fails its checksum", src)
        if verify == "full":
            _check_full(name, d, p, rec, body, src)
    try:
        f_s = np.load(d / F_S_NAME, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # bad header, truncated data
        raise _damaged(name, d, f"{F_S_NAME} unreadable: {exc}", src) from exc
    if not isinstance(f_s, np.memmap) or f_s.dtype != F_S_DTYPE or f_s.shape != tuple(body["f_s_shape"]):
        raise _damaged(
            name, d, f"{F_S_NAME} is {f_s.dtype}{list(f_s.shape)}, expected float16{list(body['f_s_shape'])}", src
        )
    return f_s  # [N, C, D, 64, 64] float16, read-only memmap


def _check_full(name: str, d: Path, p: Path, rec: dict[str, Any], body: dict[str, Any], src: str | None) -> None:
    """Every byte of one file against its record: per-row CRC-32s (f_s.npy) or one sha256."""
    if isinstance(rec.get("row_crc32"), np.ndarray):
        want = rec["row_crc32"]
        shape = tuple(body["f_s_shape"])
        row_bytes = int(np.prod(shape[1:])) * F_S_DTYPE.itemsize
        try:
            got = row_crc32(p, rec["rows_offset"], row_bytes, len(want))
        except EOFError:
            raise _damaged(name, d, f"{p.name} is cut short", src) from None
        bad = np.flatnonzero(got != want)
        if len(bad):
            raise _damaged(name, d, f"{p.name} fails its checksum at frame {bad[0]}"
                           + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""), src)
    elif file_sha256(p, rec.get("sha256_offset", 0)) != rec["sha256"]:
        raise _damaged(name, d, f"{p.name} fails its checksum", src)


def _check_level(verify: str | bool) -> str:
    if verify is True:
        return "full"
    if verify is False:
        return "size"
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
    return verify


def load_avatar(
    name_or_dir: str | os.PathLike,
    expected_fingerprints: dict[str, str] | None = None,
    verify: str = "size",
    root: str | os.PathLike | None = None,
) -> Avatar:
    """Open an avatar for rendering: safe-unpickle avatar.pkl, check it, memory-map f_s.npy.

    expected_fingerprints: every key given must match the fingerprint stored at registration.
    """
    verify = _check_level(verify)
    name, d, adir = _resolve(name_or_dir, root)
    if not d.is_dir():
        raise _missing_error(name, adir)
    body = _read_body(name, d)
    src = body["source"].get("path")
    if expected_fingerprints is not None:
        stored = body["fingerprints"]
        diff = sorted(k for k, v in expected_fingerprints.items() if stored.get(k) != v)
        if diff:
            raise AvatarError(
                f"avatar '{name}' at {d} was made with other checkpoints ({', '.join(diff)}); "
                f"{_register_hint(name, src)}"
            )
    f_s = _check_files(name, d, body, verify)
    return Avatar(
        name=name, dir=d, n_frames=int(body["n_frames"]), is_image=bool(body["is_image"]),
        fps=float(body["fps"]), size=tuple(body["size"]), x_s_info=body["x_s_info"],
        M_c2o=body["M_c2o"], eye_open=body["eye_open"], eye_ball=body["eye_ball"], sc=body["sc"],
        f_s=f_s, plate_path=d / body["plate"], fingerprints=dict(body["fingerprints"]),
        random_weights=bool(body["random_weights"]), meta=body,
    )


# ----------------------------------------------------------------------------- listing
def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _summary(av: Avatar) -> dict[str, Any]:
    w, h = av.size
    return {
        "name": av.name,
        "frames": av.n_frames,
        "resolution": f"{w}x{h}",
        "size_bytes": _dir_bytes(av.dir),
        "created": av.meta["created"],
        "checkpoints": combined_fingerprint(av.fingerprints),
        "is_image": av.is_image,
        "random_weights": av.random_weights,
    }


def list_avatars(root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One summary dict per avatar, sorted by name; damaged ones carry an "error" field instead."""
    adir = avatars_dir(root)
    if not adir.is_dir():
        return []
    if os.access(adir, os.W_OK):
        clean_stale_tmp(adir)
    rows: list[dict[str, Any]] = []
    for name in _existing_names(adir):
        try:
            av = load_avatar(adir / name, verify="light")
            rows.append(_summary(av))
        except AvatarError as exc:
            rows.append({"name": name, "error": str(exc)})
        except OSError as exc:
            rows.append({"name": name, "error": f"unreadable: {exc}"})
    return rows


def _checksum_summary(rec: dict[str, Any]) -> dict[str, Any]:
    """A checksum record for display: per-row CRCs shown as their count."""
    out = {k: v for k, v in rec.items() if k != "row_crc32"}
    if "row_crc32" in rec:
        out["row_crc32"] = f"{len(rec['row_crc32'])} rows"
    return out


def avatar_info(name: str, verify: str | bool = "size", root: str | os.PathLike | None = None) -> dict[str, Any]:
    """Details of one avatar (verify True or "full" checks every byte: the plate's sha256, f_s.npy's row CRCs)."""
    level = _check_level(verify)
    av = load_avatar(name, verify=level, root=root)
    b = av.meta
    info = _summary(av)
    info.update(
        dir=str(av.dir),
        format_version=b["format_version"],
        fps=av.fps,
        f_s_shape=list(b["f_s_shape"]),
        plate=b["plate"],
        source=b["source"],
        crop=b["crop"],
        fingerprints=av.fingerprints,
        checksums={f: _checksum_summary(rec) for f, rec in b["checksums"].items()},
        verified=level,
    )
    return info


def remove_avatar(name: str, root: str | os.PathLike | None = None) -> Path:
    """Delete an avatar directory (renamed aside first, so the name vanishes atomically)."""
    name = validate_name(name)
    adir = avatars_dir(root)
    d = adir / name
    if not d.is_dir():
        raise _missing_error(name, adir)
    aside = adir / f"{TMP_PREFIX}rm-{name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(d, aside)
    except OSError as exc:
        raise InputError(f"cannot remove {d} ({exc.strerror or exc}); check the permissions of {adir}") from exc
    shutil.rmtree(aside, ignore_errors=True)
    return d
