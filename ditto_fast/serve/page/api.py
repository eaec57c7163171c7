"""The newsroom page's routes: the page itself (`GET /`, open: it shows nothing until it has the token), the avatars
and delivery profiles to choose from, a job's preview PNG and output file, an avatar's contact sheet, and speech
uploads. Every file served lies under the roots (an output, links followed as they are now) or is the server's own
(previews under its home, by job id); the JSON and files are under the token like every other route."""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from starlette.concurrency import run_in_threadpool

from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.serve.auth import BodyTooSlow, too_slow
from ditto_fast.serve.checks import confine
from ditto_fast.serve.answers import busy
from ditto_fast.serve.decoded import DecodedMemo, DecodersBusy
from ditto_fast.serve.page.uploads import UploadsFull, UploadsOutside, UploadTooLarge, check_upload, receive_upload

PAGE_DIR = Path(__file__).parent / "static"
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/page/page.css": ("page.css", "text/css; charset=utf-8"),
              "/page/page.js": ("page.js", "text/javascript; charset=utf-8")}
JOB_ID = re.compile(r"[0-9a-f]{16}")
UPLOAD_PATH = "/v1/uploads"


@dataclass
class PageFiles:
    """Where the page's files are: `uploads` (under the roots), `previews` (the server's: <job id>.png and
    avatars/), the upload limit in bytes and the roots outputs are served from."""

    roots: list[Path]
    uploads: Path
    previews: Path
    max_upload: int = 500 << 20

    def job_preview(self, job_id: str) -> Path:
        return self.previews / f"{job_id}.png"


def job_links(view: dict, files: PageFiles) -> dict:
    """A job's view with the page's links: its preview (once written) and its output (once done)."""
    links = {}
    if files.job_preview(view["id"]).is_file():
        links["preview"] = f"/v1/jobs/{view['id']}/preview"
    if view["status"] == "done" and view["output"]:
        links["output"] = f"/v1/jobs/{view['id']}/output"
    return {**view, "links": links}


def profile_rows() -> list[dict[str, Any]]:
    """The shipped delivery profiles: name, container, video codec, size, rate, loudness target."""
    from ditto_fast.delivery.profiles import load_profile, shipped_profiles

    rows = []
    for name in shipped_profiles():
        p = load_profile(name)
        size, rate = p.video.size, p.video.rate
        rows.append({"name": name, "container": p.container, "extension": p.extension, "video": p.video.codec,
                     "size": "x".join(map(str, size)) if size else "the avatar's",
                     "rate": (f"{float(rate):g}" + ("i" if p.video.interlaced else "p")) if rate else "the avatar's",
                     "loudness": None if p.loudness is None else {"lufs": p.loudness[0], "true_peak": p.loudness[1]}})
    return rows


class AvatarSheets:
    """Avatar contact sheets (`avatars show --preview`), drawn once per version of the avatar and kept."""

    def __init__(self, folder: Path):
        self.folder, self._lock = folder, threading.Lock()

    def get(self, name: str) -> Path:
        from ditto_fast.avatar import load_avatar
        from ditto_fast.avatar.store import avatar_signature, avatars_dir, validate_name
        from ditto_fast.preview.avatar_sheet import write_avatar_preview

        validate_name(name)
        signature = avatar_signature(avatars_dir() / name)
        if signature is None:
            raise UsageError(f"no avatar {name}")
        key = hashlib.sha256(repr(signature).encode()).hexdigest()[:12]
        path = self.folder / f"{name}-{key}.png"
        with self._lock:
            if not path.is_file():
                self.folder.mkdir(parents=True, exist_ok=True)
                write_avatar_preview(load_avatar(name, verify="light"), path)
        return path


def add_page_routes(app: FastAPI, find_job: Callable[[str], dict | None], files: PageFiles, refusal: Callable,
                    error: Callable, decoded: DecodedMemo) -> None:
    """The page, its JSON (avatars, profiles, settings), the job preview and output files, avatar contact sheets and
    uploads, on `app` (whose RequestGate checks the token and streams UPLOAD_PATH's body); `find_job`: a job by its id
    (None if there is none: the queue's get); an upload's decoded audio is kept in `decoded` (the acceptor's), for the
    job that names it."""
    sheets = AvatarSheets(files.previews / "avatars")

    def page_file(path: str) -> Callable:
        name, media = PAGE_FILES[path]

        def serve_page_file():
            return Response((PAGE_DIR / name).read_bytes(), media_type=media,
                            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
                                     "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; "
                                                                "frame-ancestors 'none'"})
        return serve_page_file

    for path in PAGE_FILES:
        app.add_api_route(path, page_file(path), methods=["GET"], include_in_schema=path != "/")

    @app.get("/v1/avatars")
    def avatars():
        from ditto_fast.avatar import list_avatars

        return {"avatars": [{k: a[k] for k in ("name", "frames", "resolution", "is_image", "random_weights", "error")
                             if k in a} for a in list_avatars()]}

    @app.get("/v1/avatars/{name}/preview")
    def avatar_preview(name: str):
        try:
            path = sheets.get(name)
        except DittoError as e:
            return refusal(str(e), 404, e.exit_code)
        return FileResponse(path, media_type="image/png")

    @app.get("/v1/profiles")
    def profiles():
        return {"profiles": profile_rows()}

    @app.get("/v1/settings")
    def settings():
        from ditto_fast.motion.emotions import EMOTIONS

        return {"uploads": str(files.uploads), "roots": [str(r) for r in files.roots],
                "max_upload_mb": files.max_upload >> 20, "emotions": list(EMOTIONS),
                "priorities": ["normal", "breaking"]}

    def finished_job(job_id: str) -> dict | Response:
        job = find_job(job_id) if JOB_ID.fullmatch(job_id) else None
        return job if job is not None else refusal(f"no job {job_id}", 404)

    @app.get("/v1/jobs/{job_id}/preview")
    def job_preview(job_id: str):
        job = finished_job(job_id)
        if isinstance(job, Response):
            return job
        path = files.job_preview(job["id"])
        if not path.is_file():
            return refusal(f"job {job_id} has no preview (it is {job['status']}; a preview is drawn once it is done)",
                           404)
        return FileResponse(path, media_type="image/png")

    @app.get("/v1/jobs/{job_id}/output")
    def job_output(job_id: str):
        job = finished_job(job_id)
        if isinstance(job, Response):
            return job
        if job["status"] != "done" or not job["output"]:
            return refusal(f"job {job_id} is {job['status']}; its output is served once it is done", 409)
        output = Path(job["output"])
        try:
            confine(output, files.roots, "output")
        except DittoError as e:
            return refusal(str(e), 403, e.exit_code)
        if not output.resolve().is_file():
            return refusal(f"{output}: the output of job {job_id} is gone (moved or deleted)", 404)
        return FileResponse(output.resolve(), filename=output.name, media_type="application/octet-stream")

    @app.post(UPLOAD_PATH, status_code=201)
    async def upload(request: Request):
        try:
            length = request.headers.get("content-length", "")
            stored = await receive_upload(request.receive, request.headers.get("content-type", ""), files.uploads,
                                          files.max_upload, int(length) if length.isdigit() else None, files.roots)
            decoded.put(stored, await run_in_threadpool(check_upload, stored, decoded))
        except DecodersBusy as e:
            return busy(e)
        except UploadTooLarge as e:
            return refusal(str(e), 413, e.exit_code)
        except BodyTooSlow as e:
            return too_slow(e)
        except UploadsOutside as e:
            return refusal(str(e), 403, e.exit_code)
        except UploadsFull as e:
            return refusal(str(e), 507, e.exit_code)
        except DittoError as e:
            return error(e)
        return {"path": str(stored)}
