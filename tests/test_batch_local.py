"""The engine and `ditto-fast batch` end to end with tiny checkpoints: same bytes as `render`, a broken job
reported alone with exit 7, reruns skip finished jobs, interrupts leave a report and no partial output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ditto_fast.engine.request import RenderRequest
from ditto_fast.batch.jobs import Job, read_jobs
from ditto_fast.batch.local import run_batch
from ditto_fast.cli import main
from ditto_fast.media.ffpipe import container_comment
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup

pytestmark = pytest.mark.slow


def test_engine_gives_the_same_bytes_first_or_again_and_as_the_cli(engine, clips, tmp_path, session_home,
                                                                   tiny_checkpoints):
    a = engine.render(RenderRequest("anchor", clips[0], tmp_path / "a.mp4", seed=3))
    engine.render(RenderRequest("anchor", clips[1], tmp_path / "other.mp4"))
    b = engine.render(RenderRequest("anchor", clips[0], tmp_path / "b.mp4", seed=3))
    assert a.timings["frames"] == 10 and a.output.read_bytes() == b.output.read_bytes()
    assert container_comment(a.output) == a.timings["digest"]
    env = dict(os.environ, DITTO_FAST_HOME=str(session_home), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints))
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "render", "--avatar", "anchor", "--audio",
                        str(clips[0]), "-o", str(tmp_path / "cli.mp4"), "--seed", "3", "--device", "cpu", "--quiet"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cli.mp4").read_bytes() == a.output.read_bytes()
    c = engine.render(RenderRequest("anchor", clips[0], tmp_path / "c.mp4", seed=4))
    assert c.timings["digest"] != a.timings["digest"] and c.output.read_bytes() != a.output.read_bytes()


def _manifest(path, clips, extra=()):
    rows = [{"avatar": "anchor", "audio": str(clips[0]), "output": "out/zero.mp4", "seed": 3},
            {"avatar": "nobody", "audio": str(clips[1]), "output": "out/broken.mp4"},
            {"avatar": "anchor", "audio": str(clips[2]), "output": "out/two.mp4", "emotion": "happy"}, *extra]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path.parent / "out").mkdir(exist_ok=True)
    return path


def _batch(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(["batch", *args])
        raise SystemExit(0)
    return e.value.code, capsys.readouterr()


def test_batch_renders_good_jobs_reports_the_broken_one_and_resumes(engine, clips, tmp_path, tiny_checkpoints,
                                                                    capsys):
    jobs = _manifest(tmp_path / "jobs.jsonl", clips)
    report = tmp_path / "report.json"
    common = ["--checkpoints", str(tiny_checkpoints), "--device", "cpu", "--report", str(report)]
    code, out = _batch([str(jobs), *common, "--quiet"], capsys)
    assert code == 7 and out.out.strip() == "done 2, skipped 0, failed 1"
    rows = json.loads(report.read_text())
    assert rows["summary"] == {"done": 2, "skipped": 0, "failed": 1}
    broken = rows["jobs"][1]
    assert broken["status"] == "failed" and broken["exit_code"] == 5 and "nobody" in broken["error"]
    assert "\n" not in broken["error"] and not (tmp_path / "out" / "broken.mp4").exists()
    assert [r["frames"] for r in rows["jobs"]] == [10, 0, 13]
    # the same job rendered by the engine gives the same bytes
    ref = engine.render(RenderRequest("anchor", clips[0], tmp_path / "ref.mp4", seed=3))
    assert (tmp_path / "out" / "zero.mp4").read_bytes() == ref.output.read_bytes()
    # a rerun skips what is finished and loads no network
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    code, out = _batch([str(jobs), *common, "--quiet"], capsys)
    assert code == 7 and out.out.strip() == "done 0, skipped 2, failed 1"
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == before
    # another seed for one job renders that job again; --force renders all again
    _manifest(jobs, clips)
    jobs.write_text(jobs.read_text().replace('"seed": 3', '"seed": 4'))
    code, out = _batch([str(jobs), *common, "--quiet"], capsys)
    assert out.out.strip() == "done 1, skipped 1, failed 1"
    code, out = _batch([str(jobs), *common, "--quiet", "--force"], capsys)
    assert out.out.strip() == "done 2, skipped 0, failed 1"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["two.mp4", "zero.mp4"]


def test_batch_creates_a_missing_out_dir(clips, tmp_path, video_avatar, tiny_checkpoints, capsys):
    """`--out-dir` that does not exist yet is made (as mkdir -p): every job renders into it."""
    (tmp_path / "in").mkdir()
    for c in clips[:2]:
        (tmp_path / "in" / c.name).write_bytes(c.read_bytes())
    out = tmp_path / "night" / "mp4"
    code, _ = _batch(["--avatar", "anchor", "--audio-dir", str(tmp_path / "in"), "--out-dir", str(out),
                      "--checkpoints", str(tiny_checkpoints), "--device", "cpu", "--quiet"], capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["clip0.mp4", "clip1.mp4"]

def test_batch_refuses_outputs_that_are_inputs_or_shared(clips, tmp_path, video_avatar, tiny_checkpoints):
    import shutil

    wav = [shutil.copy(c, tmp_path / f"in{i}.wav") for i, c in enumerate(clips)]
    jobs = tmp_path / "jobs.jsonl"
    rows = [{"avatar": "anchor", "audio": str(wav[0]), "output": str(wav[0])},           # its own input
            {"avatar": "anchor", "audio": str(wav[0]), "output": str(wav[1])},           # another job's input
            {"avatar": "anchor", "audio": str(wav[1]), "output": "same.mp4", "steps": 2},
            {"avatar": "anchor", "audio": str(wav[2]), "output": "same.mp4", "steps": 2}]
    jobs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_batch(read_jobs(jobs), RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints)))
    assert [j.status for j in out] == ["failed", "failed", "done", "failed"]
    assert "overwrite an input" in out[0].error and "is an input of this batch" in out[1].error
    assert "also the output of job 2" in out[3].error and all(j.exit_code == 2 for j in (out[0], out[1], out[3]))
    assert all(open(w, "rb").read(4) == b"RIFF" for w in wav)


def test_an_interrupted_batch_leaves_its_report_and_no_partial_output(clips, tmp_path, video_avatar,
                                                                      tiny_checkpoints):
    jobs = [Job(0, RenderRequest("anchor", clips[0], tmp_path / "a.mp4")),
            Job(1, RenderRequest("anchor", clips[1], tmp_path / "b.mp4"))]
    seen = []

    def progress(stage, done, total):
        seen.append((stage, done))
        if stage == "job 2/2 frames" and done > 2:      # inside the second job's frames
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_batch(jobs, RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints)),
                  report=tmp_path / "r.json", progress=progress)
    rows = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert [r["status"] for r in rows] == ["done", "failed"] and rows[1]["exit_code"] == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4", "r.json"]


def _engine_processes() -> list[int]:
    """The engine processes (handles/child.py) this process started."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"ditto_fast.handles.child" in command:
            found.append(int(entry))
    return found


def test_an_engine_that_dies_under_a_batch_job_is_a_warning_and_its_cause_is_in_the_row(clips, tmp_path, video_avatar,
                                                                                       tiny_checkpoints):
    import signal

    jobs = [Job(0, RenderRequest("anchor", clips[0], tmp_path / "a.mp4")),
            Job(1, RenderRequest("anchor", clips[1], tmp_path / "b.mp4"))]
    killed, warnings = [], []

    def progress(stage, done, total):
        if stage == "job 1/2 frames" and done > 0 and not killed:      # inside the first job's frames, once
            killed.extend(_engine_processes())
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    run_batch(jobs, RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints)),
              report=tmp_path / "r.json", progress=progress, warn=warnings.append)
    assert len(killed) == 1
    rows = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert [r["status"] for r in rows] == ["done", "done"] and rows[0]["attempts"] == 2, rows
    assert len(rows[0]["crash_causes"]) == 1 and "SIGKILL" in rows[0]["crash_causes"][0], rows[0]
    assert "crash_causes" not in rows[1]
    assert len(warnings) == 1 and warnings[0].startswith("job 0: engine-0 ") and "SIGKILL" in warnings[0] and \
        "once more" in warnings[0], warnings


@pytest.mark.register
def test_a_render_reads_the_avatar_it_opened_while_register_force_replaces_it(engine, tmp_path, anchor_video,
                                                                              tiny_checkpoints, clips):
    import imageio_ffmpeg
    import numpy as np

    from conftest import REPO
    from ditto_fast.avatar import load_avatar
    from ditto_fast.avatar.plate import PlateReader
    from ditto_fast.avatar.register import Registrar
    from synthetic import Motion, write_anchor_video

    reg = Registrar(tiny_checkpoints, "cpu")
    reg.register(anchor_video, "race", force=True)                      # 25 frames, 1920x1080
    old = load_avatar("race")
    other = tmp_path / "other.mp4"
    write_anchor_video(other, 10, size=(1280, 720), face_px=120,
                       motion=Motion(center=(640.0, 370.0), velocity=(0.0, 0.0), spin_deg=0.0))
    replaced = []

    def replace_once(stage, done, total):
        if stage == "frames" and done and not replaced:     # after the first frames, `register --force` swaps it
            replaced.append(reg.register(other, "race", force=True))

    out = engine.render(RenderRequest("race", REPO / "tests" / "data" / "speech_en_44k_stereo_2s.wav", tmp_path / "out.mp4"),
                        progress=replace_once).output
    # the store now holds other files under the same names
    assert replaced and old.plate_path.stat().st_ino != os.fstat(old.plate_fd).st_ino
    gen = imageio_ffmpeg.read_frames(str(out))
    meta = next(gen)
    assert tuple(meta["size"]) == (1920, 1080)
    frames = [np.frombuffer(f, np.uint8).reshape(1080, 1920, 3) for f in gen]
    assert len(frames) == 50
    with PlateReader(old.plate_source, old.n_frames, is_image=False) as plate:
        for i in (0, 24, 30, 49):           # mirror-looped plate frames, read long after the swap
            corner = np.abs(frames[i][:120, :160].astype(int) - plate[i][:120, :160].astype(int)).mean()
            assert corner < 3, (i, corner)
    new = engine.render(RenderRequest("race", clips[0], tmp_path / "new.mp4")).output   # the next render sees the new avatar
    gen = imageio_ffmpeg.read_frames(str(new))
    assert tuple(next(gen)["size"]) == (1280, 720)
    gen.close()
    # a Clip checked before the store's avatar was replaced (a batch's later job) renders the new one too
    from ditto_fast.engine.clip import check_clip

    checked = check_clip(RenderRequest("race", clips[0], tmp_path / "later.mp4"), engine.avatar("race"), engine.config)
    reg.register(anchor_video, "race", force=True)
    gen = imageio_ffmpeg.read_frames(str(engine.render(checked).output))
    assert tuple(next(gen)["size"]) == (1920, 1080)
    gen.close()


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3])
def test_lookahead_gives_the_same_bytes(video_avatar, clips, tmp_path, tiny_checkpoints, batch_size):
    """Launching batch k+1 before writing batch k changes nothing in the output (10 frames: 3+3+3+1)."""
    import dataclasses

    from ditto_fast.core.config import load_config
    from ditto_fast.engine.renderer import Renderer

    outs = {}
    for ahead in (True, False):
        cfg = load_config()
        cfg = dataclasses.replace(cfg, render=dataclasses.replace(cfg.render, lookahead=ahead))
        r = Renderer(tiny_checkpoints, device="cpu", config=cfg, batch_size=batch_size)
        res = r.render(RenderRequest("anchor", clips[0], tmp_path / f"{ahead}.mp4", seed=5))
        assert res.timings["batch_size"] == batch_size and res.timings["stages"]["stitch"] > 0
        outs[ahead] = res.output.read_bytes()
    assert outs[True] == outs[False]


@pytest.mark.slow
def test_batched_stitching_gives_the_same_bytes(video_avatar, clips, tmp_path, tiny_checkpoints, monkeypatch):
    """Stitching a batch of 3 at once writes the same file as stitching its frames one by one (at 30 fps, so
    frames between motion frames are blended too)."""
    from ditto_fast.motion.stitch import MotionStitch
    from ditto_fast.engine.renderer import Renderer

    r = Renderer(tiny_checkpoints, device="cpu", batch_size=3)
    batched = r.render(RenderRequest("anchor", clips[1], tmp_path / "b.mp4", seed=2, fps=30)).output.read_bytes()
    whole = MotionStitch.batch

    def frame_by_frame(self, s, d, d_next=None, w=None):
        row = lambda x, i: {k: v[i:i + 1] for k, v in x.items()}          # noqa: E731
        outs = [whole(self, row(s, i), row(d, i), row(d_next, i), w[i:i + 1]) for i in range(len(w))]
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])

    monkeypatch.setattr(MotionStitch, "batch", frame_by_frame)
    assert r.render(RenderRequest("anchor", clips[1], tmp_path / "s.mp4", seed=2, fps=30)).output.read_bytes() == batched
