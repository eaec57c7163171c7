"""The on-disk avatar format: file names, the record in avatar.pkl, and how each file is checksummed.

An avatar directory holds ``avatar.pkl``, ``f_s.npy`` ([N, C, D, 64, 64] float16) and ``plate.mp4``
(video) or ``plate.png`` (image). ``avatar.pkl`` is one text line,
``ditto-fast-avatar format 2 crc32 <hex>``, then one pickle, whose CRC-32 that line carries, of a plain
dict (numpy arrays and plain containers only; read with ``safe_pickle``): the writer's fields (name,
time, frame count, f_s shape), the fields of `AvatarRecord` (what registration measured: source
metadata, checkpoint fingerprints, crop parameters, per-frame ``x_s_info`` / ``M_c2o`` / ``eye_open``
/ ``eye_ball``, ``sc``, ``is_image``), the plate's name and, for each of the other two files, its size
and a CRC-32 per block. A block of ``f_s.npy`` is one frame's row after the fixed 4096-byte header, so damage is
named by frame; the plate is cut into 1 MiB blocks. Any other format version is refused as stale.
"""

from __future__ import annotations

import os
import pickle
import zlib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from ditto_fast.avatar import safe_pickle
from ditto_fast.avatar.store import damaged_error, register_hint
from ditto_fast.core.errors import AvatarError, InputError
from ditto_fast.core.files import MIB, read_bounded
from ditto_fast.core.keypoint_info import X_S_INFO_WIDTHS

FORMAT_VERSION = 2
PKL_MAGIC = b"ditto-fast-avatar"
PKL_NAME = "avatar.pkl"
F_S_NAME = "f_s.npy"
PLATE_VIDEO = "plate.mp4"
PLATE_IMAGE = "plate.png"
F_S_DTYPE = np.dtype(np.float16)
F_S_TAIL_FULL = (32, 16, 64, 64)
F_S_HEADER_BYTES = 4096  # f_s.npy header (magic, version, dict padded with spaces); the rows follow
PLATE_BLOCK_BYTES = 1 << 20
# avatar.pkl's largest size: its record is about 2 KB a frame, so this is some 100,000 frames (over an hour at
# 25 fps, whose f_s.npy would be 400 GB at full size)
PKL_MAX_BYTES = 256 * MIB
CACHE_FPS = 25.0  # the rate of image avatars (and of records that give none)


# ----------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Stored:
    """How the record keeps one array: [N, *tail] if per frame (N = frames), else [*tail], written as `dtype`. It is
    read back with exactly that dtype, or where `any_float` with any float dtype (as records have always been)."""

    tail: tuple[int, ...]
    dtype: np.dtype = np.dtype(np.float32)
    per_frame: bool = True
    any_float: bool = False

    def shape(self, n: int) -> tuple[int, ...]:
        """The array's shape in a record of n frames."""
        return (n, *self.tail) if self.per_frame else self.tail

    def conform(self, value: Any, n: int, what: str) -> np.ndarray:
        """value as the record keeps it: a C-contiguous array of this shape and dtype (the values given with extra
        singleton dims are accepted, e.g. [N,1,66], or [N,21,3] for kp); ValueError otherwise."""
        shape = self.shape(n)
        arr = np.ascontiguousarray(np.asarray(value, dtype=self.dtype))
        if arr.shape != shape:
            if arr.size == int(np.prod(shape)) and arr.ndim >= 1 and (not self.per_frame or arr.shape[0] == n):
                arr = arr.reshape(shape)
            else:
                raise ValueError(f"{what}: expected shape {shape}, got {arr.shape}")
        return arr

    def check(self, a: Any, n: int, what: str) -> None:
        """ValueError unless `a`, read from a record of n frames, is such an array of finite values."""
        dtype_ok = isinstance(a, np.ndarray) and (a.dtype.kind == "f" if self.any_float else a.dtype == self.dtype)
        if not dtype_ok or a.shape != self.shape(n):
            raise ValueError(f"{what} has the wrong shape" + ("" if self.any_float else " or dtype"))
        _check_finite(a, what)


# the keypoint info per frame, part by part
X_S_INFO: dict[str, Stored] = {k: Stored((w,), any_float=True) for k, w in X_S_INFO_WIDTHS.items()}


def _arrays(declared: Stored | dict[str, Stored]) -> Any:
    """A record field holding an array as declared (or, for a dict of declarations, a dict of such arrays)."""
    return field(metadata={"stored": declared})


@dataclass(frozen=True, kw_only=True)
class AvatarRecord:
    """What registration measured about a source, field by field in avatar.pkl's order (N = frames). The writer
    checks and completes it (see AvatarWriter.finish) and adds its own fields and the files' checksums."""

    is_image: bool
    fps: float = CACHE_FPS                  # the rate of the cached frames and the plate
    rate: str | None = None                 # the same exactly ("30000/1001"); None: the standard rate nearest fps
    size: tuple[int, int] | None = None     # (w, h) of the cached frames and the plate; None: the source's size
    source: dict[str, Any]                  # path, sha256, fps, size, source_size, frames (a video's picture too)
    fingerprints: dict[str, str]            # network -> fingerprint of the checkpoint the features came from
    random_weights: bool                    # made with random checkpoints: its renders are noise
    crop: dict[str, Any] = field(default_factory=dict)   # dsize, scale, vx, vy, smooth_window, params [N, 4]
    x_s_info: dict[str, np.ndarray] = _arrays(X_S_INFO)
    M_c2o: np.ndarray = _arrays(Stored((3, 3), np.dtype(np.float64)))    # crop -> frame, per frame
    eye_open: np.ndarray = _arrays(Stored((2,)))
    eye_ball: np.ndarray = _arrays(Stored((6,)))
    sc: np.ndarray = _arrays(Stored((X_S_INFO_WIDTHS["kp"],), per_frame=False, any_float=True))   # frame 0's kp
    extra: dict[str, Any] = field(default_factory=dict)  # plain data rendering does not read (registration's
    #                                                      time, warnings, mouth check, landmarks)

    @classmethod
    def read(cls, body: Mapping[str, Any]) -> AvatarRecord:
        """The record in a checked avatar.pkl dict (one written before exact rates has no "rate")."""
        return cls(**{f.name: body[f.name] for f in fields(cls) if f.name in body})

    def arrays(self, n: int) -> dict[str, Any]:
        """The record's arrays as avatar.pkl keeps them (x_s_info a dict of them), n frames each; ValueError naming
        the first that cannot be."""
        out: dict[str, Any] = {}
        for f in fields(self):
            declared, value = f.metadata.get("stored"), getattr(self, f.name)
            if isinstance(declared, Stored):
                out[f.name] = declared.conform(value, n, f.name)
            elif declared is not None:
                out[f.name] = {k: d.conform(value[k], n, f"{f.name}[{k}]") for k, d in declared.items()}
        return out


def _stored_arrays(body: Mapping[str, Any]) -> Iterator[tuple[str, Stored, Any]]:
    """(name, declaration, value) of each array in an avatar.pkl dict, x_s_info's one by one ("x_s_info[t]")."""
    for f in fields(AvatarRecord):
        declared = f.metadata.get("stored")
        if isinstance(declared, Stored):
            yield f.name, declared, body[f.name]
        elif declared is not None:
            yield from ((f"{f.name}[{k}]", d, body[f.name][k]) for k, d in declared.items())


def record_body(record: AvatarRecord, name: str, created: str, f_s_shape: tuple[int, ...], plate: str,
                checksums: dict[str, Any]) -> dict[str, Any]:
    """The dict avatar.pkl holds: the writer's fields, the record's as given (checked and completed), the plate's
    name, the files' checksums, the record's extra."""
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    extra = values.pop("extra")
    return {"format_version": FORMAT_VERSION, "name": name, "created": created, "n_frames": f_s_shape[0],
            "f_s_shape": f_s_shape, **values, "plate": plate, "checksums": checksums, "extra": extra}


# ----------------------------------------------------------------------------- record contents
def plain(obj: Any, where: str) -> Any:
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
        return {plain(k, where): plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [plain(v, f"{where}[]") for v in obj]
        return type(obj)(items) if not isinstance(obj, list) else items
    raise TypeError(f"{where}: {type(obj).__name__} cannot be cached (numpy arrays and plain containers only)")


def n_blocks(rec: dict[str, Any]) -> int:
    """Number of checksummed blocks a file record covers."""
    return -(-(rec["size"] - rec["offset"]) // rec["block_bytes"])


def _check_record(rec: Any, fname: str) -> None:
    """Raise ValueError/TypeError unless rec is a complete block-checksum record."""
    if not isinstance(rec, dict):
        raise TypeError(f"checksum record of {fname} is not a dict")
    ints = all(isinstance(rec[k], int) for k in ("size", "offset", "block_bytes"))
    crcs = rec["crc32"]
    if not (ints and rec["block_bytes"] > 0 and 0 <= rec["offset"] <= rec["size"]
            and isinstance(crcs, np.ndarray) and crcs.dtype == np.uint32 and crcs.shape == (n_blocks(rec),)):
        raise ValueError(f"checksum record of {fname} is wrong")


def _check_finite(a: np.ndarray, what: str) -> None:
    """ValueError naming the array and its first bad frame if it holds NaN or infinite values."""
    bad = ~np.isfinite(a)
    if bad.any():
        frame = int(np.argwhere(bad)[0][0]) if a.ndim > 1 else 0
        raise ValueError(f"{what} holds NaN or infinite values (frame {frame})")


def nonfinite_rows(rows: np.ndarray) -> np.ndarray:
    """[B] bool: which float16 rows [B, ...] hold a NaN or an infinity (all five exponent bits set: a tenth of
    np.isfinite's time on float16)."""
    bits = np.ascontiguousarray(rows, F_S_DTYPE).reshape(len(rows), int(np.prod(rows.shape[1:]))).view(np.uint16) & 0x7C00
    return bits.max(axis=1, initial=0) == 0x7C00


def check_record(body: Any) -> None:
    """Raise ValueError/KeyError/TypeError if a decoded record is not a complete avatar."""
    if not isinstance(body, dict):
        raise TypeError("metadata is not a dict")
    n = int(body["n_frames"])
    if n < 1:
        raise ValueError("no frames")
    missing = [f.name for f in fields(AvatarRecord)
               if f.name not in body and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise KeyError(missing[0])
    for what, declared, a in _stored_arrays(body):
        declared.check(a, n, what)
    shape = tuple(body["f_s_shape"])
    if len(shape) != 5 or shape[0] != n:
        raise ValueError("f_s shape record is wrong")
    for key in ("checksums", "fingerprints", "source", "crop"):
        if not isinstance(body[key], dict):
            raise TypeError(f"{key} is not a dict")
    if body["plate"] != (PLATE_IMAGE if body["is_image"] else PLATE_VIDEO):
        raise ValueError("plate record is wrong")
    for fname in (F_S_NAME, body["plate"]):
        _check_record(body["checksums"][fname], fname)
    f_s_rec = body["checksums"][F_S_NAME]
    if f_s_rec["block_bytes"] != int(np.prod(shape[1:])) * F_S_DTYPE.itemsize or n_blocks(f_s_rec) != n:
        raise ValueError(f"checksum record of {F_S_NAME} does not match its shape")
    if len(body["size"]) != 2 or float(body["fps"]) <= 0:
        raise ValueError("size or fps is wrong")


# ----------------------------------------------------------------------------- avatar.pkl
def encode_pkl(body: dict[str, Any]) -> bytes:
    """The bytes of avatar.pkl: the format line carrying the pickle's CRC-32, then the pickle."""
    raw = pickle.dumps(body, protocol=5)
    return b"%s format %d crc32 %08x\n" % (PKL_MAGIC, FORMAT_VERSION, zlib.crc32(raw)) + raw


def _read_pkl_bytes(name: str, d: Path, pkl: Path) -> bytes:
    """The bytes of avatar.pkl if it is a regular file of at most PKL_MAX_BYTES (a FIFO or a device is refused
    without opening it, so nothing blocks); AvatarError naming the avatar otherwise."""
    try:
        return read_bounded(pkl, PKL_MAX_BYTES, "an avatar's record")
    except FileNotFoundError:
        raise damaged_error(name, d, f"{PKL_NAME} is missing") from None
    except InputError as exc:        # "PATH: is a FIFO (named pipe), not a regular file; give ..."
        detail = str(exc).removeprefix(f"{pkl}: ").split("; ")[0]
        raise damaged_error(name, d, f"{PKL_NAME} {detail}") from None
    except OSError as exc:
        raise damaged_error(name, d, f"{PKL_NAME} unreadable: {exc.strerror or exc}") from exc


def read_pkl(name: str, d: Path) -> dict[str, Any]:
    """Read and check avatar.pkl of directory d: format, CRC-32, safe unpickling, completeness."""
    pkl = d / PKL_NAME
    data = _read_pkl_bytes(name, d, pkl)
    line, _, raw = data.partition(b"\n")
    fields = line.split()
    if data.startswith(b"\x80"):  # format 1 was a bare pickle (protocol 2+ opens with 0x80)
        version = "1"
    elif len(fields) == 5 and fields[0] == PKL_MAGIC and (fields[1], fields[3]) == (b"format", b"crc32"):
        version = fields[2].decode("ascii", "replace")
    else:
        raise damaged_error(name, d, f"{PKL_NAME} is not a ditto-fast avatar file")
    if version != str(FORMAT_VERSION):
        raise AvatarError(
            f"avatar '{name}' at {d} has cache format {version}, this ditto-fast reads format "
            f"{FORMAT_VERSION}; {register_hint(name)}"
        )
    try:
        crc = int(fields[4], 16)
    except ValueError:
        crc = -1
    if zlib.crc32(raw) != crc:
        raise damaged_error(name, d, f"{PKL_NAME} fails its checksum")
    body = safe_pickle.loads(raw, what=str(pkl), hint=register_hint(name))
    try:
        check_record(body)
    except (KeyError, TypeError, ValueError) as exc:
        raise damaged_error(name, d, f"{PKL_NAME} incomplete: {exc}") from exc
    return body


# ----------------------------------------------------------------------------- f_s.npy
def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """An .npy version 1.0 header for a C-order array, padded to exactly F_S_HEADER_BYTES."""
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                 "shape": tuple(int(v) for v in shape)}).encode("latin1")
    room = F_S_HEADER_BYTES - 10          # magic (6) + version (2) + header length (2)
    if len(text) + 1 > room:
        raise ValueError(f"f_s shape {shape} does not fit a {F_S_HEADER_BYTES}-byte header")
    return b"\x93NUMPY\x01\x00" + room.to_bytes(2, "little") + text + b" " * (room - len(text) - 1) + b"\n"


# ----------------------------------------------------------------------------- checksums
def block_crc32(path: Path, offset: int, block_bytes: int, blocks: list[int] | range) -> np.ndarray:
    """CRC-32s [len(blocks)] uint32 of blocks of a file; block k is block_bytes bytes at offset + k * block_bytes."""
    out = np.zeros(len(blocks), np.uint32)
    buf = bytearray(block_bytes)
    with open(path, "rb") as f:
        for j, k in enumerate(blocks):
            f.seek(offset + k * block_bytes)
            got = f.readinto(buf)  # a buffered file reads until full or at the end
            out[j] = zlib.crc32(memoryview(buf)[:got])
    return out


def file_record(path: Path, offset: int = 0, block_bytes: int = PLATE_BLOCK_BYTES) -> dict[str, Any]:
    """Size and per-block CRC-32s of a file as written (the record bad_blocks() checks against)."""
    rec = {"size": path.stat().st_size, "offset": offset, "block_bytes": block_bytes}
    rec["crc32"] = block_crc32(path, offset, block_bytes, range(n_blocks(rec)))
    return rec


def bad_blocks(path: Path, rec: dict[str, Any], every: bool) -> np.ndarray:
    """Indices of blocks whose CRC-32 differs from rec: all blocks if every, else the first and the last."""
    n = n_blocks(rec)
    blocks = range(n) if every else sorted({0, n - 1} if n else set())
    got = block_crc32(path, rec["offset"], rec["block_bytes"], blocks)
    return np.asarray(blocks, np.int64)[got != rec["crc32"][list(blocks)]]
