"""`render --preview` and `batch --previews`: the generated lip opening comes back with the render, the PNG
decodes at 1600 px wide and is the same for the same inputs, and batch reports each job's preview."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from conftest import store_env
from ditto_fast.engine.request import RenderRequest
from ditto_fast.motion.keypoints import MOTION_DIM, NUM_KP
from ditto_fast.motion.lips import lip_opening
from ditto_fast.motion.stitch import LIP_KP
from ditto_fast.preview.render_strip import render_strip


def test_lip_opening_grows_as_the_lip_keypoints_part():
    kp = np.zeros(3 * NUM_KP, np.float32)
    kp.reshape(NUM_KP, 3)[list(LIP_KP), 1] = np.linspace(0.0, 0.05, len(LIP_KP))
    motion = np.zeros((3, MOTION_DIM), np.float32)
    exp = motion[:, -3 * NUM_KP:].reshape(3, NUM_KP, 3)
    exp[1, LIP_KP[-1], 1] = 0.05          # the lowest lip keypoint moves down
    exp[2, LIP_KP[-1], 1] = 0.10
    exp[:, 0, 1] = 0.5                    # a keypoint that is no lip moves: no effect
    got = lip_opening(motion, kp)
    np.testing.assert_allclose(got, [0.05, 0.10, 0.15], atol=1e-6)


@pytest.mark.slow
def test_render_returns_the_lip_opening_and_the_preview_is_the_same_each_time(engine, clips, tmp_path):
    result = engine.render(RenderRequest("anchor", clips[0], tmp_path / "a.mp4", seed=3))
    n = result.timings["frames"]
    assert result.mouth is not None and result.mouth.shape == (n,) and np.isfinite(result.mouth).all()
    assert np.ptp(result.mouth) > 0                                  # the generated motion moves the lips
    av = engine.avatar("anchor")
    from ditto_fast.preview.render_strip import face_square

    face = face_square(av.M_c2o, av.size)
    a = render_strip(result.output, clips[0], n, result.timings["rate"], mouth=result.mouth, face=face)
    b = render_strip(result.output, clips[0], n, result.timings["rate"], mouth=result.mouth, face=face)
    assert a.shape[1] == 1600 and a.shape[0] > 600
    np.testing.assert_array_equal(a, b)
    without = render_strip(result.output, clips[0], n, result.timings["rate"])
    assert without.shape[0] < a.shape[0]                             # no face close-ups without the avatar


@pytest.mark.slow
def test_render_preview_and_batch_previews(video_avatar, session_home, tiny_checkpoints, clips, tmp_path, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    png = tmp_path / "a.png"
    r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "a.mp4", "--device", "cpu",
                 "--quiet", "--preview", png], env)
    assert r.returncode == 0, r.stderr
    img = cv2.imread(str(png), cv2.IMREAD_COLOR)
    assert img is not None and img.shape[1] == 1600
    r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "b.mp4", "--quiet",
                 "--preview", tmp_path / "b.gif"], env)
    assert r.returncode == 2 and not (tmp_path / "b.mp4").exists()   # refused before rendering

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[1]), "output": "out/one.mp4"}) + "\n")
    (tmp_path / "out").mkdir()
    args = ["batch", jobs, "--device", "cpu", "--quiet", "--previews", tmp_path / "previews",
            "--report", tmp_path / "report.json"]
    assert run_cli(args, env).returncode == 0
    row = json.loads((tmp_path / "report.json").read_text())["jobs"][0]
    assert row["status"] == "done" and row["preview"] == str(tmp_path / "previews" / "one.png"), row
    assert cv2.imread(row["preview"], cv2.IMREAD_COLOR).shape[1] == 1600
    assert run_cli(args, env).returncode == 0                        # a rerun skips the job, keeps its preview
    row = json.loads((tmp_path / "report.json").read_text())["jobs"][0]
    assert row["status"] == "skipped" and row["preview"] == str(tmp_path / "previews" / "one.png")


def test_batch_previews_are_refused_with_ray_before_anything_starts(tmp_path, run_cli):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": "a.wav", "output": "a.mp4"}) + "\n")
    r = run_cli(["batch", jobs, "--previews", tmp_path / "p", "--ray", "local"])
    assert r.returncode == 2 and "--previews" in r.stderr and not (tmp_path / "p").exists()


@pytest.mark.parametrize("sequential", [True, False])
def test_video_frames_are_the_frames_asked_for(sequential, tmp_path, monkeypatch):
    from synthetic import write_plate

    from ditto_fast.preview import video_frames as vf

    levels = [(40 + 5 * i) for i in range(40)]                      # frame i is all one level
    write_plate((np.full((64, 96, 3), v, np.uint8) for v in levels), tmp_path / "v.mp4")
    if not sequential:
        monkeypatch.setattr(vf, "SEQUENTIAL_LIMIT", 0)              # a seek per frame
    got = vf.video_frames(tmp_path / "v.mp4", np.array([0, 7, 26, 39, 45]))
    assert [f.shape for f in got] == [(64, 96, 3)] * 5
    means = [float(f.mean()) for f in got]
    np.testing.assert_allclose(means, [levels[0], levels[7], levels[26], levels[39], levels[39]], atol=1.5)
