"""Reading the store: open an avatar for rendering, list the avatars, describe one.

Verification levels, each adding to the one before:
``"light"``: avatar.pkl's format line, CRC-32 and record; the other files' sizes; f_s.npy's header.
``"sampled"`` (the default): the CRC-32 of the first and the last block of f_s.npy and the plate.
``"full"``: every block, so a damaged f_s.npy names its first bad frame.
"""

from __future__ import annotations

import hashlib
import os
import stat
import weakref
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ditto_fast.avatar.format import (
    F_S_DTYPE, F_S_NAME, PKL_NAME, AvatarRecord, bad_blocks, nonfinite_rows, read_pkl,
)
from ditto_fast.avatar.mouth_check import mouth_check_of
from ditto_fast.avatar.store import (
    avatars_dir, damaged_error, existing_names, missing_error, register_hint, validate_name,
)
from ditto_fast.core.errors import AvatarError
from ditto_fast.media.rates import from_stream

if TYPE_CHECKING:       # the checkpoints import torch: a listing of the store does without it
    from ditto_fast.checkpoints import CheckpointSet

VERIFY_LEVELS = ("light", "sampled", "full")


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
    plate_fd: int | None = field(default=None, repr=False)   # the plate, held open from load time
    _checked: np.ndarray | None = field(default=None, repr=False)   # [N] bool: f_s rows features() has checked

    @property
    def rate(self) -> Fraction:
        """The exact rate of the cached frames and the plate (25 for an image avatar)."""
        text = self.meta.get("rate")
        return Fraction(text) if text else from_stream(self.fps)

    @property
    def plate_source(self) -> str:
        """A path that reads the plate this avatar was loaded with, even after the store's copy was replaced."""
        return f"/proc/{os.getpid()}/fd/{self.plate_fd}" if self.plate_fd is not None else str(self.plate_path)

    def features(self, frames: np.ndarray) -> np.ndarray:
        """f_s rows of several frames [B] (indices) as float16 [B, C, D, 64, 64]. Each frame is checked the first time
        it is read (its CRC-32 against the record, finite values); AvatarError naming the frame if it fails."""
        idx = np.asarray(frames, dtype=np.int64)
        rows = self.f_s[idx]                                  # a copy: what is checked is what the render gets
        if self._checked is None:
            self._checked = np.zeros(self.n_frames, bool)
        unseen = np.flatnonzero(~self._checked[idx])
        new = unseen[np.unique(idx[unseen], return_index=True)[1]]     # once each (an image avatar repeats one)
        if len(new):
            crcs = self.meta["checksums"][F_S_NAME]["crc32"]
            for p in new:
                if zlib.crc32(rows[p]) != crcs[idx[p]]:
                    raise self._bad_frame(int(idx[p]), "fails its checksum")
            bad = new[nonfinite_rows(rows[new])]
            if len(bad):
                raise self._bad_frame(int(idx[bad[0]]), "holds NaN or infinite values")
            self._checked[idx[new]] = True
        return rows

    def _bad_frame(self, i: int, what: str) -> AvatarError:
        """AvatarError for f_s frame i found damaged while rendering."""
        return damaged_error(self.name, self.dir, f"{F_S_NAME} {what} at frame {i}; `ditto-fast avatars show "
                                                  f"{self.name} --verify` checks every frame",
                             self.meta["source"].get("path"))

    def frame_info(self, i: int) -> dict[str, np.ndarray]:
        """x_s_info rows of frame i, each with leading dim 1 ([1, 66], [1, 3], ...)."""
        return self.frame_infos(np.array([i]))

    def frame_infos(self, frames: np.ndarray) -> dict[str, np.ndarray]:
        """x_s_info rows of several frames [B] (indices), each [B, ...]."""
        idx = np.asarray(frames, dtype=np.int64)
        if idx.size and not (0 <= idx.min() and idx.max() < self.n_frames):
            raise IndexError(f"frames {idx.min()}..{idx.max()} out of range for {self.n_frames} frames")
        return {k: v[idx] for k, v in self.x_s_info.items()}


def _resolve(name_or_dir: str | os.PathLike, root: str | os.PathLike | None) -> tuple[str, Path, Path]:
    """(name, avatar dir, avatars dir) for a store name or a directory path."""
    if isinstance(name_or_dir, os.PathLike) or os.sep in str(name_or_dir):
        d = Path(name_or_dir).expanduser()
        return d.name, d, d.parent
    name = validate_name(str(name_or_dir))
    adir = avatars_dir(root)
    return name, adir / name, adir


def _damage(fname: str, rec: dict[str, Any], bad: np.ndarray) -> str:
    """Where a file fails its block checksums: the first frame of f_s.npy, the first byte range elsewhere."""
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    k = int(bad[0])
    if fname == F_S_NAME:
        return f"{fname} fails its checksum at frame {k}{more}"
    lo = rec["offset"] + k * rec["block_bytes"]
    return f"{fname} fails its checksum at bytes {lo}-{min(lo + rec['block_bytes'], rec['size'])}{more}"


def _check_files(name: str, d: Path, body: dict[str, Any], level: str) -> np.ndarray:
    """Check f_s and the plate against the record at the given level; return the f_s memmap."""
    src = body["source"].get("path")
    for fname in (F_S_NAME, body["plate"]):
        rec = body["checksums"][fname]
        p = d / fname
        try:
            st = p.stat()
        except FileNotFoundError:
            raise damaged_error(name, d, f"{fname} is missing", src) from None
        if not stat.S_ISREG(st.st_mode):        # a FIFO or a device would block or never end
            raise damaged_error(name, d, f"{fname} is not a regular file", src)
        size = st.st_size
        if size != rec["size"]:
            raise damaged_error(name, d, f"{fname} has {size} bytes, expected {rec['size']}", src)
        if level != "light":
            bad = bad_blocks(p, rec, every=level == "full")
            if len(bad):
                raise damaged_error(name, d, _damage(fname, rec, bad), src)
    try:
        f_s = np.load(d / F_S_NAME, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # bad header, truncated data
        raise damaged_error(name, d, f"{F_S_NAME} unreadable: {exc}", src) from exc
    if not isinstance(f_s, np.memmap) or f_s.dtype != F_S_DTYPE or f_s.shape != tuple(body["f_s_shape"]):
        raise damaged_error(
            name, d, f"{F_S_NAME} is {f_s.dtype}{list(f_s.shape)}, expected float16{list(body['f_s_shape'])}", src
        )
    if level != "light":   # the frames whose checksums were read: finite too (a re-sealed file could hold NaN)
        rows = range(len(f_s)) if level == "full" else sorted({0, len(f_s) - 1})
        bad = next((i for i in rows if nonfinite_rows(f_s[i:i + 1])[0]), None)
        if bad is not None:
            raise damaged_error(name, d, f"{F_S_NAME} holds NaN or infinite values at frame {bad}", src)
    return f_s  # [N, C, D, 64, 64] float16, read-only memmap


def _check_level(verify: str | bool) -> str:
    """A verification level from a level name or a bool (True: "full", False: "sampled")."""
    if verify is True:
        return "full"
    if verify is False:
        return "sampled"
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
    return verify


def load_avatar(
    name_or_dir: str | os.PathLike,
    expected_fingerprints: dict[str, str] | None = None,
    verify: str | bool = "sampled",
    root: str | os.PathLike | None = None,
    checkpoints: CheckpointSet | None = None,
    _retry: bool = False,
) -> Avatar:
    """Open an avatar for rendering: check and safe-unpickle avatar.pkl, check the files, memory-map f_s.npy.

    expected_fingerprints: every key given must match the fingerprint stored at registration. checkpoints: the
    set to render with; its avatar fingerprints are expected, and a differing file that does not load raises its
    CheckpointError (the file is broken) rather than calling the avatar stale.
    """
    level = _check_level(verify)
    name, d, adir = _resolve(name_or_dir, root)
    if not d.is_dir():
        raise missing_error(name, adir)
    pkl_inode = _pkl_inode(d)
    body = read_pkl(name, d)
    if expected_fingerprints is None and checkpoints is not None:
        expected_fingerprints = checkpoints.avatar_fingerprints()
    if expected_fingerprints is not None:
        stored = body["fingerprints"]
        diff = sorted(k for k, v in expected_fingerprints.items() if stored.get(k) != v)
        if diff and checkpoints is not None:
            checkpoints.check_loads(diff)
        if diff:
            raise AvatarError(
                f"avatar '{name}' at {d} was made with other checkpoints ({', '.join(diff)}); "
                f"{register_hint(name, body['source'].get('path'))}"
            )
    f_s = _check_files(name, d, body, level)
    # f_s is mapped and the plate held open: a render reads this avatar's files even if `register --force`
    # or `avatars rm` replaces them; replaced while we were reading it here, it is read again
    try:
        plate_fd = os.open(d / body["plate"], os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        plate_fd = None
    if plate_fd is None or _pkl_inode(d) != pkl_inode:
        if plate_fd is not None:
            os.close(plate_fd)
        if _retry:
            raise AvatarError(f"avatar '{name}' at {d} keeps changing while it is opened; try again when "
                              "its registration has finished")
        return load_avatar(name_or_dir, expected_fingerprints, verify, root, checkpoints, _retry=True)
    rec = AvatarRecord.read(body)
    avatar = Avatar(
        name=name, dir=d, n_frames=int(body["n_frames"]), is_image=bool(rec.is_image), fps=float(rec.fps),
        size=tuple(rec.size), x_s_info=rec.x_s_info, M_c2o=rec.M_c2o, eye_open=rec.eye_open, eye_ball=rec.eye_ball,
        sc=rec.sc, f_s=f_s, plate_path=d / body["plate"], fingerprints=dict(rec.fingerprints),
        random_weights=bool(rec.random_weights), meta=body, plate_fd=plate_fd,
    )
    weakref.finalize(avatar, os.close, plate_fd)
    return avatar


def _pkl_inode(d: Path) -> int | None:
    """The inode of d/avatar.pkl (changes when the avatar is replaced), or None."""
    try:
        return os.stat(d / PKL_NAME).st_ino
    except OSError:
        return None


# ----------------------------------------------------------------------------- listing
def combined_fingerprint(fingerprints: dict[str, str]) -> str:
    """One short hash standing for a dict of per-network fingerprints."""
    text = "\n".join(f"{k}={fingerprints[k]}" for k in sorted(fingerprints))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _summary(av: Avatar) -> dict[str, Any]:
    w, h = av.size
    return {
        "name": av.name,
        "frames": av.n_frames,
        "resolution": f"{w}x{h}",
        "size_bytes": sum(p.stat().st_size for p in av.dir.iterdir() if p.is_file()),
        "created": av.meta["created"],
        "checkpoints": combined_fingerprint(av.fingerprints),
        "is_image": av.is_image,
        "random_weights": av.random_weights,
    }


def list_avatars(root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One summary dict per avatar, sorted by name; damaged ones carry an "error" field instead.

    Read-only: leftover temporaries are cleaned by the next `register`, never by a listing."""
    adir = avatars_dir(root)
    if not adir.is_dir():
        return []
    rows: list[dict[str, Any]] = []
    for name in existing_names(adir):
        try:
            rows.append(_summary(load_avatar(adir / name, verify="light")))
        except AvatarError as exc:
            rows.append({"name": name, "error": str(exc)})
        except OSError as exc:
            rows.append({"name": name, "error": f"unreadable: {exc}"})
    return rows


def avatar_info(name: str, verify: str | bool = "sampled", root: str | os.PathLike | None = None) -> dict[str, Any]:
    """Details of one avatar given by its store name, checked at the given level (True or "full": every block
    of every file)."""
    level = _check_level(verify)
    av = load_avatar(validate_name(name), verify=level, root=root)
    b = av.meta
    info = _summary(av)
    info.update(
        dir=str(av.dir),
        format_version=b["format_version"],
        fps=av.fps,
        rate=str(av.rate),
        f_s_shape=list(b["f_s_shape"]),
        plate=b["plate"],
        source=b["source"],
        crop=b["crop"],
        fingerprints=av.fingerprints,
        checksums={f: {**rec, "crc32": f"{len(rec['crc32'])} blocks"} for f, rec in b["checksums"].items()},
        verified=level,
    )
    mouth = mouth_check_of(b)
    info["mouth"] = mouth.summary() if mouth is not None else "not measured (registered before mouth checks)"
    return info
