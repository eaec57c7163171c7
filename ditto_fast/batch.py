"""`ditto-fast batch`: jobs from JSON lines or a folder of audio, all checked first, finished ones skipped,
the rest rendered by one engine, and a report of every job's outcome."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .avatar import Avatar, load_avatar, validate_name
from .errors import DittoError, Terminated, UsageError
from .ffpipe import container_comment
from .motion.conditions import schedule_file
from .filemode import give_usual_mode
from .partfiles import create_locked
from .pipeline import Clip, Progress, Renderer, RenderResult, RenderSetup, check_clip
from .preview.paths import preview_paths

JOB_KEYS = ("avatar", "audio", "output", "seed", "emotion", "controls", "steps", "fps", "codec")
AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".m4a", ".aac", ".ogg", ".opus")
EXIT_SOME_FAILED = 7


@dataclass
class Job:
    """One clip to render and what became of it (status: pending, done, skipped or failed)."""

    index: int
    avatar: str = ""
    audio: Path | None = None
    output: Path | None = None
    seed: int = 0
    emotion: str = "neutral"
    controls: Path | None = None
    steps: int | None = None
    fps: str | None = None              # output rate (default: the avatar's)
    codec: str | None = None            # h264, hevc or prores (default h264)
    status: str = "pending"
    error: str | None = None
    exit_code: int = 0
    frames: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def fail(self, error: DittoError | str, exit_code: int | None = None) -> None:
        """Mark the job failed with a one-line error."""
        self.status, self.error = "failed", str(error).splitlines()[0] if str(error) else type(error).__name__
        self.exit_code = exit_code if exit_code is not None else getattr(error, "exit_code", 1)

    def options(self) -> dict[str, Any]:
        """The job's keyword arguments for Renderer.render and check_clip."""
        return {"seed": self.seed, "emotion": self.emotion, "controls": self.controls, "steps": self.steps,
                "fps": self.fps, "codec": self.codec}

    def row(self) -> dict[str, Any]:
        """The job's entry in the report."""
        return {"index": self.index, "avatar": self.avatar, "audio": _str(self.audio), "output": _str(self.output),
                "status": self.status, "error": self.error, "exit_code": self.exit_code, "frames": self.frames,
                "seconds": round(self.seconds, 3), **self.extra}


def _str(p: Path | None) -> str | None:
    return None if p is None else str(p)


def _job_from_line(index: int, line: str, base: Path, where: str) -> Job:
    """A job from one JSON line; paths relative to `base`. A bad line gives a failed job, not an exception."""
    job = Job(index)
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        job.fail(UsageError(f"{where}: not valid JSON ({e.msg}); write one JSON object per line"))
        return job
    if not isinstance(data, dict):
        job.fail(UsageError(f"{where}: expected a JSON object like "
                            '{"avatar": "ruby", "audio": "a.wav", "output": "a.mp4"}'))
        return job
    unknown = sorted(set(data) - set(JOB_KEYS))
    missing = [k for k in ("avatar", "audio", "output") if not isinstance(data.get(k), str) or not data.get(k)]
    if unknown or missing:
        job.avatar = str(data.get("avatar", ""))
        what = f"unknown key {unknown[0]!r} (known: {', '.join(JOB_KEYS)})" if unknown else \
            f"{missing[0]!r} is missing or not a string"
        job.fail(UsageError(f"{where}: {what}"))
        return job
    job.avatar = data["avatar"]
    job.audio, job.output = base / data["audio"], base / data["output"]
    if data.get("controls") is not None:
        job.controls = base / str(data["controls"])
    emotion = data.get("emotion", "neutral")
    if isinstance(emotion, dict):              # a schedule written inline in the job line
        emotion = json.dumps(emotion, sort_keys=True)
    if isinstance(emotion, str) and emotion.endswith(".json") and not Path(emotion).is_absolute():
        emotion = str(base / emotion)
    seed, steps = data.get("seed", 0), data.get("steps")
    if not isinstance(emotion, str):
        job.fail(UsageError(f"{where}: emotion must be a label, a mix like happy+surprise, a schedule object or "
                            "a .json file"))
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        job.fail(UsageError(f"{where}: seed must be an integer in 0..{2**63 - 1}"))
    elif steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000):
        job.fail(UsageError(f"{where}: steps must be an integer in 1..1000"))
    for key in ("fps", "codec"):
        value = data.get(key)
        if value is not None and not isinstance(value, (str, int, float)) or isinstance(value, bool):
            job.fail(UsageError(f"{where}: {key} must be a string such as " + ('"30000/1001"' if key == "fps" else '"h264"')))
        elif value is not None:
            setattr(job, key, str(value))
    job.emotion, job.seed, job.steps = str(emotion), seed if isinstance(seed, int) else 0, steps
    return job


def read_jobs(path: str | Path) -> list[Job]:
    """Jobs from a JSON-lines file (blank lines and lines starting with # are passed over)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: jobs file not found; give a JSON-lines file or --audio-dir") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the jobs file ({getattr(e, 'strerror', None) or e})") from None
    base = path.resolve().parent
    jobs: list[Job] = []
    for no, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            jobs.append(_job_from_line(len(jobs), line, base, f"{path}:{no}"))
    if not jobs:
        raise UsageError(f"{path}: no jobs in the file; write one JSON object per line")
    return jobs


def jobs_from_dir(avatar: str, audio_dir: str | Path, out_dir: str | Path, suffix: str = ".mp4") -> list[Job]:
    """One job per audio file in `audio_dir` (sorted by name), output `<out_dir>/<stem><suffix>`."""
    audio_dir, out_dir = Path(audio_dir), Path(out_dir)
    if not audio_dir.is_dir():
        raise UsageError(f"{audio_dir}: --audio-dir is not a directory")
    files = sorted(p for p in audio_dir.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not files:
        raise UsageError(f"{audio_dir}: no audio files ({', '.join(AUDIO_SUFFIXES)}) in the directory")
    return [Job(i, avatar, p, out_dir / f"{p.stem}{suffix}") for i, p in enumerate(files)]


def summary(jobs: list[Job]) -> dict[str, int]:
    """Counts of done, skipped and failed jobs."""
    return {s: sum(j.status == s for j in jobs) for s in ("done", "skipped", "failed")}


def write_report(path: str | Path, jobs: list[Job]) -> None:
    """The report JSON, replaced atomically (a reader never sees half of it)."""
    path = Path(path)
    tmp, lock = create_locked(path, "tmp")         # a killed batch's leftover is removed by the next write
    try:
        with open(tmp, "w") as f:
            json.dump({"jobs": [j.row() for j in jobs], "summary": summary(jobs)}, f, indent=2)
            f.write("\n")
        give_usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(lock)


def check_jobs(jobs: list[Job], setup: RenderSetup) -> dict[int, Clip]:
    """Check every pending job without loading a network; failed ones are marked, the rest get their Clip."""
    avatars: dict[str, Avatar | DittoError] = {}
    inputs = {p.resolve() for j in jobs for p in (j.audio, j.controls, schedule_file(j.emotion)) if p is not None}
    outputs: dict[Path, int] = {}
    clips: dict[int, Clip] = {}
    for job in jobs:
        if job.status != "pending":
            continue
        try:
            validate_name(job.avatar)
            if job.avatar not in avatars:
                try:
                    avatars[job.avatar] = load_avatar(job.avatar,
                                                      expected_fingerprints=setup.checkpoints.avatar_fingerprints())
                except DittoError as e:
                    avatars[job.avatar] = e
            avatar = avatars[job.avatar]
            if isinstance(avatar, DittoError):
                raise avatar
            out = job.output.resolve()
            own = {p.resolve() for p in (job.audio, job.controls, schedule_file(job.emotion)) if p is not None}
            others = {a.dir.resolve() for a in avatars.values() if isinstance(a, Avatar) and a is not avatar}
            if out in inputs - own or others & set(out.parents):   # the job's own inputs: check_clip says so
                raise UsageError(f"{job.output}: is an input of this batch; choose another output path")
            clip = check_clip(avatar, job.audio, job.output, config=setup.config, **job.options())
            if out in outputs:
                raise UsageError(f"{job.output}: also the output of job {outputs[out]}; give each job its own output")
            clips[job.index], outputs[out] = clip, job.index
        except DittoError as e:
            job.fail(e)
    return clips


def _preview(job: Job, path: Path, result: RenderResult, avatar: Avatar) -> None:
    """Write a done job's preview; a failure is noted in its report row ("preview_error"), the job stays done."""
    from .preview.render_strip import write_render_preview

    try:
        job.extra["preview"] = str(write_render_preview(
            path, result.output, job.audio, result.profile["frames"], result.profile["rate"], mouth=result.mouth,
            M_c2o=avatar.M_c2o, size=avatar.size, random_weights=result.profile["random_weights"]))
    except Exception as e:  # noqa: BLE001 - the clip itself is fine; say what went wrong with its picture
        job.extra["preview_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__


def run_batch(jobs: list[Job], setup: RenderSetup, *, force: bool = False, fail_fast: bool = False,
              report: str | Path | None = None, progress: Progress | None = None,
              on_job: Callable[[Job], None] | None = None, previews: str | Path | None = None) -> list[Job]:
    """Check all jobs, skip those whose output was made from the same inputs (unless `force`), render the rest
    with one engine. The report (if any) is rewritten after every job and when interrupted. With `previews`
    (a folder) each rendered job also gets a preview PNG there, named in its report row."""
    targets = preview_paths(previews, {j.index: j.output for j in jobs if j.output}) if previews else {}
    clips = check_jobs(jobs, setup)
    for job in jobs:
        clip = clips.get(job.index)
        if clip is not None and not force and job.output.exists() and \
                container_comment(job.output) == setup.digest(clip, job.emotion, job.controls):
            job.status, job.frames = "skipped", clip.frames
            if job.index in targets and targets[job.index].exists():
                job.extra["preview"] = str(targets[job.index])
    todo = [j for j in jobs if j.status == "pending"]
    total = sum(clips[j.index].frames for j in todo)
    done_frames = 0
    try:
        if report:
            write_report(report, jobs)
        renderer = Renderer(setup=setup) if todo else None
        for job in todo:
            if fail_fast and any(j.status == "failed" for j in jobs):
                job.fail(f"not run: an earlier job failed (--fail-fast)", EXIT_SOME_FAILED)
                continue
            t0 = time.perf_counter()
            base = done_frames
            tick = (lambda d, n, b=base: progress(b + d, total)) if progress else None
            try:
                result = renderer.render(job.avatar, job.audio, job.output, progress=tick, **job.options())
                job.status, job.frames = "done", result.profile["frames"]
                job.extra["stages"] = result.profile["stages"]
                if job.index in targets:
                    _preview(job, targets[job.index], result, renderer.avatar(job.avatar))
            except DittoError as e:
                job.fail(e)
            except Exception as e:  # noqa: BLE001 - a bug in one job must not lose the night's other jobs
                job.fail(f"internal error: {type(e).__name__}: {e}; rerun that job alone with DITTO_FAST_DEBUG=1", 1)
            job.seconds = time.perf_counter() - t0
            done_frames = base + clips[job.index].frames
            if on_job:
                on_job(job)
            if report:
                write_report(report, jobs)
    except BaseException as e:
        if isinstance(e, DittoError):
            why, code = str(e), e.exit_code
        else:
            code = 130 if isinstance(e, KeyboardInterrupt) else 143 if isinstance(e, Terminated) else 1
            why = "interrupted before it finished; run the batch again to resume" if code != 1 else \
                f"not run: internal error {type(e).__name__}: {e}"
        for job in jobs:
            if job.status == "pending":
                job.fail(why, code)
        raise
    finally:
        if report:
            write_report(report, jobs)
    return jobs
