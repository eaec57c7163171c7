"""`POST /v1/uploads`: a speech file sent from the newsroom page, streamed (multipart, field `file`) into the server's
uploads folder under the roots: at most `limit` bytes (nothing half-written is left beyond it), its name reduced to
safe characters and made unique, then checked as any job's audio is (a file that does not decode is removed)."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Awaitable, Callable

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from ditto_fast.audio.decode import DecodedAudio, decode_audio
from ditto_fast.core.errors import DittoError, UsageError

NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
NAME_MAX = 80


DRAIN_LIMIT = 64 << 20          # of a refused upload's body, read and dropped


class UploadTooLarge(UsageError):
    """The upload is over the server's --max-upload-mb."""


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


async def receive_upload(receive: Callable[[], Awaitable[dict]], content_type: str, folder: Path,
                         limit: int, declared: int | None = None) -> Path:
    """Stream the multipart field `file` of a request's body (ASGI `receive`) into `folder` (a temporary name,
    renamed once whole); returns the stored file. UploadTooLarge past `limit` bytes of body (the rest of the body
    read and dropped, up to DRAIN_LIMIT, so that its client gets the answer; at once when its Content-Length,
    `declared`, says so), UsageError for no file field; nothing is left behind on either."""
    boundary = boundary_of(content_type)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".upload-{uuid.uuid4().hex}.part"
    state: dict = {"headers": {}, "field": b"", "value": b"", "name": None, "in_file": False, "found": False}
    out = open(tmp, "wb")

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
                while more and seen <= DRAIN_LIMIT + limit:
                    message = await receive()
                    seen += len(message.get("body", b""))
                    more = message["type"] == "http.request" and message.get("more_body", False)
                raise too_large(limit)
            parser.write(chunk)
        parser.finalize()
        out.close()
        if not state["found"]:
            raise UsageError("the upload has no field \"file\"; send the speech file as multipart field \"file\"")
        stored = folder / safe_name(state["name"])
        os.replace(tmp, stored)
        return stored
    except BaseException:
        out.close()
        tmp.unlink(missing_ok=True)
        raise


def check_upload(path: Path) -> DecodedAudio:
    """The audio check every job's audio has (it decodes, whole): its decoding, which the job's own check then takes
    instead of decoding again; the file is removed if it fails (DittoError)."""
    try:
        return decode_audio(path)
    except DittoError:
        path.unlink(missing_ok=True)
        raise
