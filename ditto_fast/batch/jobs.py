"""Batch jobs: read from JSON lines or a folder of audio, checked all first (each into its Clip), finished ones
found by their digest, and the report of every job's outcome."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditto_fast.audio.files import AUDIO_SUFFIXES
from ditto_fast.avatar import Avatar
from ditto_fast.avatar.store import NAME_RE, avatars_dir
from ditto_fast.core.errors import DittoError, InputError, UsageError, one_line
from ditto_fast.core.files import MIB, read_input
from ditto_fast.engine.clip import Clip, check_clip, request_inputs
from ditto_fast.engine.emotion_auto import check_emotion_model
from ditto_fast.engine.open_avatars import OpenAvatars
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.media.outputs import check_writes, write_json
from ditto_fast.motion.conditions import schedule_file
from ditto_fast.encoding.formats import default_suffix

JOBS_MAX_BYTES = 64 * MIB       # a night of jobs is kilobytes to a few megabytes


@dataclass
class Job:
    """One clip to render (its request; None for a job line that is not one) and what became of it
    (status: queued, done, skipped or failed: handles.base.JOB_STATES)."""

    index: int
    request: RenderRequest | None = None
    status: str = "queued"
    error: str | None = None
    exit_code: int = 0
    frames: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    named: dict[str, Any] = field(default_factory=dict)    # what a bad line named: its avatar, the files it reads
    where: str = ""                     # the job line it came from (jobs.jsonl:N), named in each of its errors

    @property
    def avatar(self) -> str:
        return self.request.avatar if self.request else self.named.get("avatar", "")

    @property
    def audio(self) -> Path | None:
        return self.request.audio if self.request else None

    @property
    def output(self) -> Path | None:
        return self.request.output if self.request else None

    def fail(self, error: DittoError | str, exit_code: int | None = None) -> None:
        """Mark the job failed with a one-line error."""
        text = str(error) if isinstance(error, DittoError) else str(error).split("\n")[0]
        if self.where and not text.startswith(self.where):
            text = f"{self.where}: {text}"
        self.status, self.error = "failed", one_line(text) or type(error).__name__
        self.exit_code = exit_code if exit_code is not None else getattr(error, "exit_code", 1)

    def row(self) -> dict[str, Any]:
        """The job's entry in the report."""
        return {"index": self.index, "avatar": self.avatar, "audio": _str(self.audio), "output": _str(self.output),
                "status": self.status, "error": self.error, "exit_code": self.exit_code, "frames": self.frames,
                "seconds": round(self.seconds, 3), **self.extra}


def _str(p: Path | None) -> str | None:
    return None if p is None else str(p)


def _job_from_line(index: int, line: str, base: Path, where: str, defaults: dict[str, Any]) -> Job:
    """A job from one JSON line; paths relative to `base`. A bad line gives a failed job, not an exception."""
    job = Job(index, where=where)
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deep"
        job.fail(UsageError(f"{where}: not valid JSON ({why}); write one JSON object per line"))
        return job
    try:
        job.request = RenderRequest.from_json(data, base, where, defaults)
    except UsageError as e:
        if isinstance(data, dict):      # its files stay inputs of the batch: no other job may write over them
            job.named = {"avatar": str(data.get("avatar", "")), "inputs": _named_files(data, base)}
        job.fail(e)
    return job


def _named_files(data: dict, base: Path) -> list[Path]:
    """The files a job line that is not a request names as inputs (audio, controls, an emotion schedule)."""
    named = [base / data[k] for k in ("audio", "controls") if isinstance(data.get(k), str) and data[k]]
    emotion = data.get("emotion")
    if isinstance(emotion, str) and emotion:
        schedule = schedule_file(str(base / emotion) if emotion.endswith(".json") else emotion)
        named += [schedule] if schedule is not None else []
    return named


def read_jobs(path: str | Path, defaults: dict[str, Any] | None = None) -> list[Job]:
    """Jobs from a JSON-lines file (blank lines and lines starting with # are passed over); `defaults` give the
    request fields a line leaves out (a line's own values win)."""
    path = Path(path)
    try:
        lines = read_input(path, JOBS_MAX_BYTES, "a JSON-lines jobs file (or --audio-dir)").decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: cannot read the jobs file ({e})") from None
    base = path.resolve().parent
    jobs: list[Job] = []
    for no, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            jobs.append(_job_from_line(len(jobs), line, base, f"{path}:{no}", defaults or {}))
    if not jobs:
        raise UsageError(f"{path}: no jobs in the file; write one JSON object per line")
    return jobs


def jobs_from_dir(avatar: str, audio_dir: str | Path, out_dir: str | Path, defaults: dict[str, Any] | None = None
                  ) -> list[Job]:
    """One job per audio file in `audio_dir` (sorted by name), output `<out_dir>/<stem>.mp4` (.mov for ProRes),
    the other request fields from `defaults`; `out_dir` is created if missing."""
    audio_dir, out_dir = Path(audio_dir), Path(out_dir)
    if not audio_dir.is_dir():
        raise InputError(f"{audio_dir}: --audio-dir is not a directory; give the folder of audio files")
    files = sorted(p for p in audio_dir.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not files:
        raise UsageError(f"{audio_dir}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in the directory")
    try:                                        # like mkdir -p, with the process's umask
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file of that name is in the way" if isinstance(e, FileExistsError) else e.strerror or str(e)
        raise InputError(f"{out_dir}: cannot create the --out-dir folder ({why}); choose another folder") from None
    defaults = defaults or {}
    if defaults.get("delivery"):                # the profile's container names the outputs
        from ditto_fast.delivery.profiles import load_profile

        suffix = load_profile(defaults["delivery"]).extension
    else:
        suffix = default_suffix(defaults.get("codec"))
    return [Job(i, RenderRequest(avatar=avatar, audio=p, output=out_dir / f"{p.stem}{suffix}", **defaults))
            for i, p in enumerate(files)]


def record_result(job: Job, timings: dict, warnings: tuple[str, ...] = ()) -> None:
    """A rendered job's report entries: done, its frames and stages, for a delivery its profile, QC and the
    loudness measured in and out, for `--emotion auto` the emotion track."""
    job.status, job.frames = "done", timings["frames"]
    job.extra["stages"] = timings["stages"]
    if "emotion" in timings:
        job.extra["emotion"] = timings["emotion"]
    if "delivery" in timings:
        d = timings["delivery"]
        job.extra["delivery"] = {"profile": d["profile"], "qc": d["qc"], "loudness": d["loudness"]}
    if warnings:
        job.extra["warnings"] = list(warnings)


def summary(jobs: list[Job]) -> dict[str, int]:
    """Counts of done, skipped and failed jobs."""
    return {s: sum(j.status == s for j in jobs) for s in ("done", "skipped", "failed")}


def write_report(path: str | Path, jobs: list[Job], extra: dict[str, Any] | None = None) -> None:
    """The report JSON (with `extra` entries beside the jobs and summary), replaced atomically (a reader never
    sees half of it)."""
    write_json(path, {"jobs": [j.row() for j in jobs], "summary": summary(jobs), **(extra or {})})


def check_side_files(jobs: list[Job], report: Path | None, previews: dict[int, Path], reads: list[Path | None],
                     default_emotion: str) -> None:
    """UsageError unless the report and the previews overwrite no input of the batch (`reads`: the jobs file, the
    config, the checkpoints; and every job's audio, controls, schedule, profile and avatar) and no job's output."""
    inputs = [*reads, *(p for j in jobs for p in (request_inputs(j.request, default_emotion) if j.request else
                                                   j.named.get("inputs", [])))]
    inputs += [avatars_dir() / name for name in {j.avatar for j in jobs} if name and NAME_RE.fullmatch(name)]
    check_writes([("report", report), *((f"preview of job {i}", p) for i, p in previews.items())], inputs,
                 [(f"output of job {j.index}", j.output) for j in jobs if j.output])


def check_jobs(jobs: list[Job], setup: RenderSetup) -> dict[int, Clip]:
    """Check every queued job without loading a network; failed ones are marked, the rest get their Clip."""
    opened = OpenAvatars(setup.checkpoints)
    avatars: dict[str, Avatar | DittoError] = {}        # this check's answer for each name, a refusal included
    emotion = setup.config.clip.emotion
    inputs = {p.resolve() for j in jobs for p in (request_inputs(j.request, emotion) if j.request else
                                                  j.named.get("inputs", []))}
    outputs: dict[Path, int] = {}
    clips: dict[int, Clip] = {}
    for job in jobs:
        if job.status != "queued":
            continue
        request = job.request
        try:
            if request.avatar not in avatars:
                try:
                    avatars[request.avatar] = opened.get(request.avatar)
                except DittoError as e:
                    avatars[request.avatar] = e
            avatar = avatars[request.avatar]
            if isinstance(avatar, DittoError):
                raise avatar
            out = request.output.resolve()
            own = {p.resolve() for p in request_inputs(request, emotion)}
            others = {a.dir.resolve() for a in avatars.values() if isinstance(a, Avatar) and a is not avatar}
            if out in inputs - own or others & set(out.parents):   # the job's own inputs: check_clip says so
                raise UsageError(f"{request.output}: is an input of this batch; choose another output path")
            clip = check_clip(request, avatar, setup.config)
            check_emotion_model(clip, setup.checkpoints)
            if out in outputs:
                raise UsageError(f"{request.output}: also the output of job {outputs[out]}; give each job its own "
                                 "output")
            clips[job.index], outputs[out] = clip, job.index
            if clip.notes:
                job.extra["notes"] = clip.notes
        except DittoError as e:
            job.fail(e)
    return clips
