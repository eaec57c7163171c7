"""Progress of all of a render's long work: HuBERT and the LMDM report from their start, before the first frame;
in a log (stderr not a terminal) one plain line a stage's 10 % or 30 s, never a carriage return; --quiet silent."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, store_env
from ditto_fast.engine.progress import ProgressReport, counted

LINE = re.compile(r"^ditto-fast: (\w+): ([\w /]+?) (\d+)/(\d+) frames \((\d+) %\)(, [\d.]+ fps, ETA \d+:\d\d:\d\d)?$")


class Clock:
    """A clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _plain(clock: Clock) -> tuple[ProgressReport, io.StringIO]:
    out = io.StringIO()
    return ProgressReport("render", out, tty=False, clock=clock), out


def test_plain_lines_come_at_the_start_and_each_10_percent_with_fps_and_eta():
    clock = Clock()
    report, out = _plain(clock)
    for done in range(0, 1001):
        clock.now = done / 100                          # 100 frames a second
        report("frames", done, 1000)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [int(LINE.match(ln).group(5)) for ln in lines] == list(range(0, 101, 10))
    assert lines[0] == "ditto-fast: render: frames 0/1000 frames (0 %)"
    assert lines[5] == "ditto-fast: render: frames 500/1000 frames (50 %), 100.0 fps, ETA 0:00:05"


def test_a_slow_stage_gets_a_line_every_30_seconds_and_a_new_stage_its_own():
    clock = Clock()
    report, out = _plain(clock)
    for done in range(0, 91):
        clock.now = done * 10.0                         # a frame every 10 s of a 10 000-frame stage
        report("motion", done, 10_000)
    clock.now += 1
    report("frames", 0, 50)
    lines = out.getvalue().splitlines()
    assert [int(LINE.match(ln).group(3)) for ln in lines[:-1]] == list(range(0, 91, 3))   # every 30 s
    assert lines[-1] == "ditto-fast: render: frames 0/50 frames (0 %)"
    assert lines[-2].endswith("0.1 fps, ETA 27:31:40")      # 9910 frames to go at 0.1 fps: 99 100 s


def test_no_rate_until_the_stage_has_run_a_second():
    """A stage first heard of part-done (a batch's finished frames) said "6287726.3 fps" over ~0 s."""
    clock = Clock()
    report, out = _plain(clock)
    clock.now = 100.0
    report("frames of finished jobs", 10, 38)           # its first call: 10 frames in no time
    clock.now += 0.5
    report("frames of finished jobs", 25, 38)
    clock.now += 1.5
    report("frames of finished jobs", 38, 38)
    assert out.getvalue().splitlines() == [
        "ditto-fast: render: frames of finished jobs 10/38 frames (26 %)",
        "ditto-fast: render: frames of finished jobs 25/38 frames (65 %)",
        "ditto-fast: render: frames of finished jobs 38/38 frames (100 %), 19.0 fps, ETA 0:00:00"]


def test_registration_steps_report_through_the_same_lines():
    clock = Clock()
    out = io.StringIO()
    step = counted(ProgressReport("register", out, tty=False, clock=clock))(20, "register")
    for _ in range(20):
        step(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "ditto-fast: register: 0/20 frames (0 %)" and lines[-1].startswith("ditto-fast: register: 20/20")
    assert len(lines) == 11


@pytest.mark.slow
def test_hubert_and_the_lmdm_report_from_their_start(engine, clips):
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.engine.stages import AUDIO_FEATURES, FRAMES, MOTION

    calls: list[tuple[str, int, int]] = []
    request = RenderRequest("anchor", clips[1], clips[1].parent / "progress.mp4")
    result = engine.render(request, progress=lambda stage, done, total: calls.append((stage, done, total)))
    stages = [c[0] for c in calls]
    first_frame = stages.index(FRAMES)
    assert stages[:first_frame] == sorted(stages[:first_frame], key=[AUDIO_FEATURES, MOTION].index)
    motion_frames = -(-len(np.arange(int(0.6 * 16000))) // 640)        # 15 motion frames of 0.6 s
    for stage in (AUDIO_FEATURES, MOTION):
        mine = [c for c in calls if c[0] == stage]
        assert mine[0] == (stage, 0, motion_frames) and mine[-1] == (stage, motion_frames, motion_frames)
    frames = [c for c in calls if c[0] == FRAMES]
    assert frames[0] == (FRAMES, 0, result.timings["frames"]) and frames[-1][1] == result.timings["frames"]
    assert [c[1] for c in frames] == sorted(c[1] for c in frames)


def test_hubert_reports_each_batch_of_a_long_signal(tiny_checkpoints):
    from ditto_fast.audio.hubert import HubertFeatures
    from ditto_fast.checkpoints import find_checkpoints

    hubert = HubertFeatures(find_checkpoints(tiny_checkpoints).hubert_dir, batch_size=4)
    seen: list[tuple[int, int]] = []
    feats = hubert(np.zeros(16000 * 3, np.float32), progress=lambda d, n: seen.append((d, n)))
    assert seen == [(0, 75), *((min(75, 20 * k), 75) for k in range(1, 5))] and len(feats) == 75


def test_motion_reports_each_window():
    from ditto_fast.motion.sampling import MotionSampler

    sampler = MotionSampler(lambda frame, cond, gen: torch.zeros(1, 8, 3), window=8, overlap=2, smooth_window=1,
                            smooth_dims=3)
    seen: list[tuple[int, int]] = []
    sampler(np.zeros((20, 4), np.float32), np.zeros(3, np.float32), torch.Generator(),
            progress=lambda d, n: seen.append((d, n)))
    assert seen == [(0, 20), (8, 20), (14, 20), (20, 20), (20, 20)]


def _render(tmp_path, session_home, tiny_checkpoints, audio, *extra) -> tuple[subprocess.CompletedProcess, str]:
    """`ditto-fast render` in its own process, stderr into a file (as cron or CI would keep it)."""
    log = tmp_path / "render.log"
    with open(log, "w") as err:
        res = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "render", "--avatar", "anchor", "--audio",
                              audio, "-o", tmp_path / "out.mp4", "--device", "cpu", "--batch-size", "1", *extra],
                             stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, timeout=600,
                             env={**__import__("os").environ, **store_env(session_home, tiny_checkpoints)})
    return res, log.read_text()


@pytest.mark.slow
def test_a_render_logged_to_a_file_writes_plain_lines_per_10_percent(video_avatar, session_home, tiny_checkpoints,
                                                                    clips, tmp_path):
    res, log = _render(tmp_path, session_home, tiny_checkpoints, clips[1])
    assert res.returncode == 0, log
    assert "\r" not in log
    progress = [LINE.match(ln) for ln in log.splitlines() if LINE.match(ln)]
    stages = [m.group(2) for m in progress]
    assert stages.index("audio features") < stages.index("motion") < stages.index("frames")   # before any frame
    frames = [m for m in progress if m.group(2) == "frames"]
    steps = [int(m.group(3)) * 10 // int(m.group(4)) for m in frames]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 10     # one line per 10 % step
    assert len(frames) == 11                                                      # 15 frames
    eta = [bool(m.group(6)) for m in frames[1:]]        # no rate or ETA until the stage has run a second, then always
    assert eta == sorted(eta), eta


@pytest.mark.slow
def test_quiet_stays_silent(video_avatar, session_home, tiny_checkpoints, clips, tmp_path):
    res, log = _render(tmp_path, session_home, tiny_checkpoints, clips[1], "--quiet")
    assert res.returncode == 0 and log == "" and res.stdout.strip() == str(tmp_path / "out.mp4")
