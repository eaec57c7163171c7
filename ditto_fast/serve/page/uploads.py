"""`POST /v1/uploads`: a speech file sent from the newsroom page, streamed (multipart, field `file`) into the server's
uploads folder under the roots: at most `limit` bytes (nothing half-written is left beyond it), its name reduced to
safe characters and made unique, then checked as any job's audio is (a file that does not decode is removed). The
folder is confined to the roots as it is written, as a job's paths are when it starts: opened once, its real path
checked before and after the file is written in it, the file created there and never through a link."""

from __future__ import annotations

import errno
import os
import re
import time
import uuid
from pathlib import Path
from typing import Awaitable, Callable

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.serve.auth import drain
from ditto_fast.serve.checks import confine, inside
from ditto_fast.serve.decoded import DecodedMemo

NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
NAME_MAX = 80



class UploadTooLarge(UsageError):
    """The upload is over the server's --max-upload-mb."""


class UploadsOutside(UsageError):
    """The uploads folder lies outside the roots now (moved, or swapped for a link, while the server runs)."""


class UploadsFull(InputError):
    """The uploads folder's disk (or the user's quota on it) is full."""


def disk_full(error: OSError, folder: Path, seen: int) -> UploadsFull | None:
    """The UploadsFull for an OSError that says the disk or quota is full (None for any other)."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return UploadsFull(f"{folder}: no space left on its disk for the upload ({error.strerror}, after "
                       f"{seen / (1 << 20):.1f} MB received); free space there, or start serve with --uploads on "
                       "another disk; nothing was kept")


def too_large(limit: int) -> UploadTooLarge:
    return UploadTooLarge(f"the upload is over this server's limit of {limit >> 20} MB (serve --max-upload-mb); "
                          "send a shorter file, or give the job a path on the server")


def safe_name(sent: str | None) -> str:
    """A file name made from the one a client sent: its last path part, safe characters only (others as _), no
    leading dots, at most NAME_MAX characters, prefixed with the time and a random part so it is unique."""
    base = re.split(r"[\\/]", sent or "")[-1]
    base = NAME_CHARS.sub("_", base).lstrip(".-_")[-NAME_MAX:] or "speech"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}_{base}"


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a Content-Type header; UsageError if it is not multipart/form-data."""
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data" or not params.get(b"boundary"):
        raise UsageError("an upload is multipart/form-data with the speech file in the field \"file\"")
    return params[b"boundary"]


def open_folder(folder: Path, roots: list[Path]) -> int:
    """The uploads folder opened (a descriptor to create files in), made if missing; UploadsOutside unless its real
    path lies under `roots` (checked before anything is made, and on the folder as opened)."""
    try:
        confine(folder, roots, "uploads folder")        # before mkdir: a link out makes nothing out there
    except UsageError as e:
        raise UploadsOutside(f"{e} (was it moved, or swapped for a link?); nothing was stored") from None
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_opened(fd, folder, roots)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_opened(fd: int, folder: Path, roots: list[Path]) -> Path:
    """The real path of the folder open at `fd`; UploadsOutside unless it lies under `roots`."""
    real = Path(os.readlink(f"/proc/self/fd/{fd}")) if os.path.exists(f"/proc/self/fd/{fd}") else folder.resolve()
    if not inside(real, roots):
        raise UploadsOutside(f"{folder}: the uploads folder is now {real}, outside the folders this server may use "
                             f"({', '.join(map(str, roots))}) (was it moved, or swapped for a link?); nothing was "
                             "stored")
    return real


async def receive_upload(receive: Callable[[], Awaitable[dict]], content_type: str, folder: Path,
                         limit: int, declared: int | None = None, roots: list[Path] | None = None) -> Path:
    """Stream the multipart field `file` of a request's body (ASGI `receive`) into `folder` (a temporary name,
    renamed once whole), which must lie under `roots` (default: the folder itself) as it is written; returns the
    stored file (named under `folder`, or under the folder's real path if `folder` no longer leads there).
    UploadTooLarge past `limit` bytes of body (the rest of the body read and dropped, up to auth.DRAIN_LIMIT, so that
    its client gets the answer; at once when its Content-Length, `declared`, says so), UsageError for no file field,
    UploadsOutside for a folder outside the roots, UploadsFull for a full disk, auth.BodyTooSlow from a paced
    `receive` whose body trickles; nothing is left behind on any."""
    boundary = boundary_of(content_type)
    roots = roots if roots is not None else [folder.resolve()]
    tmp = f".upload-{uuid.uuid4().hex}.part"
    try:
        dir_fd = open_folder(folder, roots)
        try:
            out = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    0o666, dir_fd=dir_fd), "wb")
        except BaseException:
            os.close(dir_fd)
            raise
    except (UploadsOutside, OSError) as e:
        full = disk_full(e, folder, 0) if isinstance(e, OSError) else e
        if full is None:
            raise
        await drain(receive)
        raise full from None
    state: dict = {"headers": {}, "field": b"", "value": b"", "name": None, "in_file": False, "found": False}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_headers_finished() -> None:
        _, params = parse_options_header(state["headers"].get(b"content-disposition", b""))
        state["in_file"] = params.get(b"name") == b"file" and not state["found"]
        if state["in_file"]:
            state["found"] = True
            state["name"] = params.get(b"filename", b"").decode("utf-8", "replace")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state["in_file"]:
            out.write(data[start:end])

    def on_part_begin() -> None:
        state["headers"], state["in_file"] = {}, False

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_headers_finished": on_headers_finished, "on_part_data": on_part_data})
    seen, more = 0, True
    try:
        while more:
            message = await receive()
            if message["type"] != "http.request":       # the client went away
                raise UsageError("the upload was cut off: the client went away")
            chunk, more = message.get("body", b""), message.get("more_body", False)
            seen += len(chunk)
            if seen > limit or (declared or 0) > limit:
                if more:
                    await drain(receive, seen - limit)
                raise too_large(limit)
            parser.write(chunk)
        parser.finalize()
        out.close()
        if not state["found"]:
            raise UsageError("the upload has no field \"file\"; send the speech file as multipart field \"file\"")
        name = safe_name(state["name"])
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = name                                      # what to remove if the folder is found outside now
        real = check_opened(dir_fd, folder, roots)      # not moved out of the roots while it was written
        stored = folder / name
        try:
            same = os.path.samestat(os.stat(stored), os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
        except OSError:
            same = False
        return stored if same else real / name
    except OSError as e:
        _discard(out, tmp, dir_fd)
        full = disk_full(e, folder, seen)
        if full is None:
            raise
        if more:
            await drain(receive)
        raise full from None
    except BaseException:
        _discard(out, tmp, dir_fd)
        raise
    finally:
        os.close(dir_fd)


def _discard(out, name: str, dir_fd: int) -> None:
    """Close the upload's file (what it could not write is dropped) and remove it."""
    try:
        out.close()
    except OSError:             # the buffer's last flush failed too (a full disk): nothing of it is kept anyway
        pass
    _unlink(name, dir_fd)


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def check_upload(path: Path, decoded: DecodedMemo) -> DecodedAudio:
    """The audio check every job's audio has (it decodes, whole, and lasts at most `decoded.longest`: no more of it
    is decoded), in turn with the server's other decodings (DecodersBusy when their line is full): its decoding,
    which the job's own check then takes instead of decoding again; the file is removed if it fails (DittoError)."""
    try:
        return decoded.decode(path)
    except DittoError:
        path.unlink(missing_ok=True)
        raise
