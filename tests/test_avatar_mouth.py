"""Mouth openness at registration: measured on every frame, an open mouth warned about (exit 4 with --strict),
the closed-mouth anchor left alone, and `avatars show` lists the figure."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from conftest import store_env
from ditto_fast.avatar import load_avatar
from ditto_fast.avatar.mouth_check import MouthCheck, frame_ranges, mouth_check_of
from ditto_fast.core.config import load_config
from ditto_fast.face.mouth import MOUTH_CORNERS, mouth_openness
from synthetic import Motion, astronaut, open_mouth_astronaut, write_anchor_video

pytestmark = pytest.mark.register      # mediapipe: registration and its landmarks


def _mouth_landmarks(gap: float, width: float = 100.0) -> np.ndarray:
    lmk = np.zeros((1, 478, 3), np.float32)
    lmk[0, MOUTH_CORNERS[0], :2] = (200 - width / 2, 300)
    lmk[0, MOUTH_CORNERS[1], :2] = (200 + width / 2, 300)
    for up, lo in ((13, 14), (82, 87), (312, 317)):
        lmk[0, up, :2] = (200, 300 - gap / 2)
        lmk[0, lo, :2] = (200, 300 + gap / 2)
    return lmk


def test_openness_is_the_inner_lip_gap_over_the_mouth_width_at_any_scale():
    assert mouth_openness(_mouth_landmarks(0.0))[0] == pytest.approx(0.0, abs=1e-6)
    assert mouth_openness(_mouth_landmarks(30.0))[0] == pytest.approx(0.3, rel=1e-4)
    assert mouth_openness(_mouth_landmarks(60.0, 200.0))[0] == pytest.approx(0.3, rel=1e-4)


def test_rule_flags_frame_0_or_more_than_a_share_of_frames():
    closed = np.full(100, 0.02, np.float32)
    assert not MouthCheck(closed, 0.12, 0.05).flagged
    first = closed.copy()
    first[0] = 0.3
    assert MouthCheck(first, 0.12, 0.05).flagged                    # frame 0 alone is enough
    few = closed.copy()
    few[50:55] = 0.3
    assert not MouthCheck(few, 0.12, 0.05).flagged                  # 5 % is allowed
    few[55] = 0.3
    check = MouthCheck(few, 0.12, 0.05)
    assert check.flagged and list(check.open_frames) == list(range(50, 56))
    msg = check.message("a.mp4")
    assert "6 of 100 frames (50-55)" in msg and "teeth and lips" in msg and msg.startswith("a.mp4: ")


def test_frame_ranges():
    assert frame_ranges(np.array([0, 1, 2, 7, 9, 10])) == "0-2, 7, 9-10"
    assert frame_ranges(np.array([1, 3, 5, 7, 9, 11]), limit=4) == "1, 3, 5, 7 and 2 more ranges"
    assert frame_ranges(np.array([], np.int64)) == "none"


def test_synthetic_open_mouth_measures_open_and_the_astronaut_closed():
    from ditto_fast.face.landmarks import FaceTracker

    threshold = load_config().register.mouth_open_threshold
    with FaceTracker() as tracker:
        closed = mouth_openness(tracker(astronaut(), 0)[None])[0]
        tracker.reset()
        opened = mouth_openness(tracker(open_mouth_astronaut(), 0)[None])[0]
    assert closed + 0.05 < threshold < opened - 0.05, (closed, opened)      # her smile parts the lips a little


def test_the_closed_mouth_anchor_is_not_flagged(video_avatar, session_home, run_cli):
    check = mouth_check_of(load_avatar(video_avatar).meta)
    assert check is not None and len(check.openness) == 25 and not check.flagged
    assert check.openness.max() < check.threshold
    r = run_cli(["avatars", "show", "anchor"], {"DITTO_FAST_HOME": str(session_home)})
    assert r.returncode == 0, r.stderr
    mouth = json.loads(r.stdout)["mouth"]
    assert mouth["warning"] is False and mouth["open_frames"] == "none" and mouth["max"] < mouth["threshold"]


def test_register_warns_on_an_open_mouth_video_and_strict_refuses_an_open_image(tmp_path, tiny_checkpoints,
                                                                                 run_cli):
    video = write_anchor_video(tmp_path / "open.mp4", 6, size=(512, 512), motion=Motion(center=(256, 256)),
                               mouth=(0.0, 0.0, 0.35, 0.35, 0.35, 0.35))
    env = store_env(tmp_path / "home", tiny_checkpoints)
    r = run_cli(["register", video, "--name", "talking", "--quiet"], env)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("ditto-fast: warning:")]
    assert len(warnings) == 1 and "4 of 6 frames (2-5)" in warnings[0] and "teeth and lips" in warnings[0]
    shown = json.loads(run_cli(["avatars", "show", "talking"], env).stdout)["mouth"]
    assert shown["warning"] is True and shown["open_frames"] == "2-5" and shown["first_frame"] < shown["threshold"]

    image = tmp_path / "open.png"
    cv2.imwrite(str(image), cv2.cvtColor(open_mouth_astronaut(), cv2.COLOR_RGB2BGR))
    r = run_cli(["register", image, "--name", "open_image", "--quiet", "--strict"], env)
    assert r.returncode == 4, r.stderr
    assert "--strict" in r.stderr and "teeth and lips" in r.stderr
    assert not (tmp_path / "home" / "avatars" / "open_image").exists()
    r = run_cli(["register", image, "--name", "open_image", "--quiet"], env)   # without --strict: registered
    assert r.returncode == 0 and "in the image" in r.stderr
    r = run_cli(["avatars", "show", "open_image", "--preview", tmp_path / "open.png"], env)   # an image avatar
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mouth"]["warning"] is True
    assert cv2.imread(str(tmp_path / "open.png"), cv2.IMREAD_COLOR).shape[1] == 1600
