"""The on-disk avatar format: file names, the record in avatar.pkl, and how each file is checksummed.

An avatar directory holds ``avatar.pkl``, ``f_s.npy`` ([N, C, D, 64, 64] float16) and ``plate.mp4``
(video) or ``plate.png`` (image). ``avatar.pkl`` is one text line,
``ditto-fast-avatar format 2 crc32 <hex>``, then one pickle, whose CRC-32 that line carries, of the
record: source metadata, checkpoint fingerprints, crop parameters, per-frame ``x_s_info`` /
``M_c2o`` / ``eye_open`` / ``eye_ball``, ``sc``, ``is_image`` (numpy arrays and plain containers
only; read with ``safe_pickle``) and, for each of the other two files, its size and a CRC-32 per
block. A block of ``f_s.npy`` is one frame's row after the fixed 4096-byte header, so damage is
named by frame; the plate is cut into 1 MiB blocks. Any other format version is refused as stale.
"""

from __future__ import annotations

import os
import pickle
import zlib
from pathlib import Path
from typing import Any

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

# per-frame x_s_info arrays: name -> trailing shape (leading dim is the frame count N)
X_S_INFO_SHAPES: dict[str, tuple[int, ...]] = {k: (w,) for k, w in X_S_INFO_WIDTHS.items()}
# other per-frame arrays: name -> (trailing shape, dtype)
FRAME_ARRAYS: dict[str, tuple[tuple[int, ...], np.dtype]] = {
    "M_c2o": ((3, 3), np.dtype(np.float64)),
    "eye_open": ((2,), np.dtype(np.float32)),
    "eye_ball": ((6,), np.dtype(np.float32)),
}
SC_SHAPE = (63,)


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


def frame_array(value: Any, n: int, tail: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """value as a C-contiguous [n, *tail] array of dtype (extra singleton dims accepted); ValueError otherwise."""
    arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
    if arr.shape != (n, *tail):
        # accept [N, *tail] given with extra singleton dims, e.g. [N,1,66] or [N,21,3] for kp
        if arr.size == n * int(np.prod(tail)) and arr.ndim >= 1 and arr.shape[0] == n:
            arr = arr.reshape(n, *tail)
        else:
            raise ValueError(f"{what}: expected shape {(n, *tail)}, got {arr.shape}")
    return arr


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
    for k, tail in X_S_INFO_SHAPES.items():
        a = body["x_s_info"][k]
        if not isinstance(a, np.ndarray) or a.shape != (n, *tail) or a.dtype.kind != "f":
            raise ValueError(f"x_s_info[{k}] has the wrong shape")
        _check_finite(a, f"x_s_info[{k}]")
    for k, (tail, dtype) in FRAME_ARRAYS.items():
        a = body[k]
        if not isinstance(a, np.ndarray) or a.shape != (n, *tail) or a.dtype != dtype:
            raise ValueError(f"{k} has the wrong shape or dtype")
        _check_finite(a, k)
    if not isinstance(body["sc"], np.ndarray) or body["sc"].shape != SC_SHAPE or body["sc"].dtype.kind != "f":
        raise ValueError("sc has the wrong shape")
    _check_finite(body["sc"], "sc")
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
