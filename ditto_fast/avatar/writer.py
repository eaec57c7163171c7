"""Writing one avatar: f_s rows streamed to a temporary directory, then the record, then a rename into place.

The avatar appears under its name only when complete: everything is written and fsync'd in
``<avatars>/.tmp-<name>-<random>`` (flock'd, so stale-temporary cleanup leaves a live writer
alone) and renamed to ``<avatars>/<name>``. With ``force`` the old avatar is first renamed aside and
put back if the new one cannot be moved in; a crash between those two renames leaves no avatar
under the name, never a half-written one. Any exception in the with-block removes the temporary.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ditto_fast.avatar.format import (
    F_S_DTYPE, F_S_HEADER_BYTES, F_S_NAME, F_S_TAIL_FULL, PKL_NAME, PLATE_IMAGE, PLATE_VIDEO, AvatarRecord,
    check_record, encode_pkl, file_record, npy_header, plain, record_body,
)
from ditto_fast.avatar.store import (
    TMP_PREFIX, aside_path, avatars_dir, check_no_case_twin, clean_stale_tmp, ensure_writable_store, fsync_path,
    lock_dir, remove_tree, unlock, validate_name,
)
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.rates import from_stream, rate_text


def stored_record(record: AvatarRecord, n: int) -> AvatarRecord:
    """The record of n frames as avatar.pkl keeps it: arrays as declared, plain data, exact types, defaults filled
    in; ValueError or TypeError naming what cannot be kept."""
    source = plain(dict(record.source), "source")
    source.setdefault("n_frames", n)
    size = tuple(int(v) for v in (record.size if record.size is not None else source["size"]))
    if len(size) != 2:
        raise ValueError(f"frame size must be (w, h), got {size}")
    fps = float(record.fps)
    return dataclasses.replace(
        record, **record.arrays(n), is_image=bool(record.is_image), fps=fps, size=size, source=source,
        rate=str(record.rate if record.rate is not None else rate_text(from_stream(fps))),
        fingerprints={str(k): str(v) for k, v in dict(record.fingerprints).items()},
        random_weights=bool(record.random_weights), crop=plain(dict(record.crop), "crop"),
        extra=plain(dict(record.extra), "extra"))


class _FeatureFile:
    """f_s.npy being written: float16 rows appended in order (buffered writes), a CRC-32 of each, the header last."""

    def __init__(self, path: Path, max_rows: int, tail: tuple[int, ...]) -> None:
        self.max_rows, self.tail = max_rows, tail
        self.row_bytes = int(np.prod(tail)) * F_S_DTYPE.itemsize
        self.rows = 0
        self.crcs: list[int] = []
        self._scratch: np.ndarray | None = None
        self._file = open(path, "wb")
        self._file.write(bytes(F_S_HEADER_BYTES))  # the header is written by finish(), once N is known

    def buffer(self, n_rows: int) -> np.ndarray:
        """A float16 [n_rows, *tail] scratch array to fill and append() (reused: valid until the next call)."""
        if self._scratch is None or len(self._scratch) < n_rows:
            self._scratch = np.empty((n_rows, *self.tail), F_S_DTYPE)
        return self._scratch[:n_rows]

    def append(self, start: int, batch: np.ndarray) -> None:
        """Write rows [start, start + B) (start == rows so far) as float16 and keep each row's CRC-32."""
        rows = np.ascontiguousarray(batch, dtype=F_S_DTYPE)
        if rows.shape[1:] != self.tail:
            raise ValueError(f"f_s rows must be [B, {', '.join(map(str, self.tail))}], got {list(rows.shape)}")
        stop = start + len(rows)
        if start != self.rows:
            raise IndexError(f"f_s rows are written in order: expected row {self.rows}, got {start}")
        if stop > self.max_rows:
            raise IndexError(f"rows {start}:{stop} out of range for {self.max_rows} frames")
        self.crcs.extend(zlib.crc32(row) for row in rows)
        self._file.write(rows)
        self.rows = stop
        if hasattr(os, "posix_fadvise"):  # start writing the rows back now, so finish()'s fsync is short
            self._file.flush()
            os.posix_fadvise(self._file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def finish(self, n: int) -> dict[str, Any]:
        """Write the header for n rows (n must equal the rows written), fsync, close; return the checksum record."""
        try:
            if n != self.rows:
                raise ValueError(f"meta has {n} frames but f_s has {self.rows} rows written "
                                 f"(opened for at most {self.max_rows})")
            self._file.seek(0)
            self._file.write(npy_header((n, *self.tail), F_S_DTYPE))
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self.close()
        return {"size": F_S_HEADER_BYTES + n * self.row_bytes, "offset": F_S_HEADER_BYTES,
                "block_bytes": self.row_bytes, "crc32": np.array(self.crcs, np.uint32)}

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()


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
        ensure_writable_store(self.adir)
        clean_stale_tmp(self.adir)
        check_no_case_twin(self.adir, self.name)
        if os.path.lexists(self.final_dir) and not self.force:
            raise UsageError(f"avatar {self.name} exists in {self.adir}; use --force to replace it")
        try:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.name}-", dir=self.adir))
            give_usual_mode(self.tmp_dir, directory=True)
            self._lock_fd = lock_dir(self.tmp_dir)
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
            try:
                self._f_s.close()
            except OSError:     # its buffer cannot be flushed (a full disk): the file is going anyway
                pass
        self._f_s = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None
        unlock(self._lock_fd)
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
        """A float16 [n_rows, C, D, H, W] array to fill and pass to write_f_s() without a cast (reused per call)."""
        if self._f_s is None:
            raise RuntimeError("f_s_buffer() before open_f_s()")
        return self._f_s.buffer(n_rows)

    def write_f_s(self, start: int, batch: np.ndarray) -> None:
        """Append f_s rows [start, start + B); start must be the number of rows written so far.

        batch: [B, C, D, 64, 64] (any float dtype; cast to float16). Written before this returns,
        with each row's CRC-32 kept for the record.
        """
        if self._f_s is None:
            raise RuntimeError("write_f_s() before open_f_s()")
        self._f_s.append(start, batch)

    def plate_path(self, is_image: bool) -> Path:
        """Where registration writes the background plate (plate.png for an image, else plate.mp4)."""
        return self._need_tmp() / (PLATE_IMAGE if is_image else PLATE_VIDEO)

    def finish(self, record: AvatarRecord) -> Path:
        """Check the record, checksum, write avatar.pkl, fsync and rename into place; return the avatar directory.

        The record's arrays may be of any dtype and carry extra singleton dims (numpy values are fine anywhere);
        its frame count N (M_c2o's) must equal the f_s rows written (at most the frames given to open_f_s()).
        """
        tmp = self._need_tmp()
        if self._f_s is None:
            raise RuntimeError("finish() before open_f_s(): f_s.npy was not written")
        body = self._build_record(tmp, record)
        with open(tmp / PKL_NAME, "wb") as f:
            f.write(encode_pkl(body))
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp)
        self._install(tmp)
        return self.final_dir

    def _build_record(self, tmp: Path, record: AvatarRecord) -> dict[str, Any]:
        """Check and complete the record, complete and sync f_s, checksum the plate; return avatar.pkl's dict."""
        n = int(np.asarray(record.M_c2o).shape[0])
        record = stored_record(record, n)
        plate_name = PLATE_IMAGE if record.is_image else PLATE_VIDEO
        other = PLATE_VIDEO if record.is_image else PLATE_IMAGE
        plate = tmp / plate_name
        if not plate.is_file():
            raise ValueError(f"the plate was not written to {plate}")
        if (tmp / other).exists():
            raise ValueError(f"both plate files exist in {tmp}; write only {plate_name}")
        fsync_path(plate)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        f_s, self._f_s = self._f_s, None
        # f_s: header for n rows, fsync'd, CRC-32 of each row as written; the plate: read once here
        checksums = {F_S_NAME: f_s.finish(n), plate_name: file_record(plate)}
        body = record_body(record, self.name, created, (n, *f_s.tail), plate_name, checksums)
        check_record(body)
        return body

    def _install(self, tmp: Path) -> None:
        """Move tmp to the final name: plain rename, or (force) replace the old avatar."""
        check_no_case_twin(self.adir, self.name)           # again: one may have been registered meanwhile
        try:
            os.rename(tmp, self.final_dir)
        except OSError as exc:
            if not os.path.lexists(self.final_dir):
                raise
            if not self.force:
                raise UsageError(f"avatar {self.name} exists in {self.adir}; use --force to replace it") from exc
            self._replace(tmp)
        else:
            self._mark_installed()
        fsync_path(self.adir)

    def _replace(self, tmp: Path) -> None:
        """Rename the existing avatar aside, tmp into its place (the old one back on failure), delete the old."""
        old_fd = lock_dir(self.final_dir) if self.final_dir.exists() else None   # a dangling link: nothing to lock
        try:
            old = aside_path(self.adir, "old", self.name)
            os.rename(self.final_dir, old)
            try:
                os.rename(tmp, self.final_dir)
            except BaseException:
                os.rename(old, self.final_dir)
                raise
            self._mark_installed()
            fsync_path(self.adir)
            remove_tree(old)
        finally:
            unlock(old_fd)

    def _mark_installed(self) -> None:
        self._finished = True
        self.tmp_dir = None
        unlock(self._lock_fd)
        self._lock_fd = None
