"""`ditto-fast register` end to end on synthetic anchors: crops follow the known motion, the cache
round-trips, and every bad input gets one clear line and its exit code with nothing left in the store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import ANCHOR_MOTION, store_env
from ditto_fast.avatar import list_avatars, load_avatar
from ditto_fast.avatar.register import source_statistics
from synthetic import Motion, astronaut_canvas, write_anchor_video

pytestmark = pytest.mark.register      # mediapipe: registration and its landmarks


def _centre_and_angle(M: np.ndarray) -> tuple[np.ndarray, float]:
    c = M @ np.array([256.0, 256.0, 1.0])
    return c[:2], float(np.degrees(np.arctan2(M[1, 0], M[0, 0])))


def test_crops_follow_known_motion(video_avatar):
    av = load_avatar(video_avatar)
    assert av.n_frames == 25 and av.size == (1920, 1080) and not av.is_image
    c0, a0 = _centre_and_angle(av.M_c2o[0])
    pic_point = np.linalg.inv(ANCHOR_MOTION.matrix(0)) @ np.array([*c0, 1.0])   # crop centre, picture coords
    for i in range(av.n_frames):
        c, a = _centre_and_angle(av.M_c2o[i])
        expected = (ANCHOR_MOTION.matrix(i) @ pic_point)[:2]
        assert np.abs(c - expected).max() < 2.5, (i, c, expected)
        assert abs((a - a0) - ANCHOR_MOTION.spin_deg * i) < 0.6, (i, a - a0)
    scales = np.hypot(av.M_c2o[:, 0, 0], av.M_c2o[:, 1, 0])
    assert scales.std() / scales.mean() < 0.02


def test_cache_round_trip(video_avatar):
    av = load_avatar(video_avatar)
    assert isinstance(av.f_s, np.memmap) and av.f_s.dtype == np.float16 and av.f_s.shape[0] == 25
    assert np.isfinite(av.f_s[:]).all() and float(np.abs(av.f_s[:]).max()) > 0
    assert av.M_c2o.shape == (25, 3, 3) and av.eye_open.shape == (25, 2) and av.eye_ball.shape == (25, 6)
    assert av.x_s_info["pitch"].shape == (25, 66) and av.x_s_info["kp"].shape == (25, 63)
    assert av.sc.shape == (63,) and not np.allclose(av.sc, av.x_s_info["kp"][0])   # sc is frame 0 unsmoothed
    assert av.random_weights and av.plate_path.name == "plate.mp4"
    assert (av.eye_open > 0).all()                      # the astronaut's eyes are open
    import imageio_ffmpeg

    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(av.plate_path))
    assert frames == 25
    rows = {r["name"]: r for r in list_avatars()}
    assert rows["anchor"]["frames"] == 25 and rows["anchor"]["resolution"] == "1920x1080"


def test_source_statistics_cut_the_window_at_the_ends_and_keep_frame_0_raw():
    rng = np.random.default_rng(0)
    raw = {"kp": rng.normal(size=(20, 63)).astype(np.float32), "yaw": rng.normal(size=(20, 66)).astype(np.float32)}
    smoothed, sc = source_statistics(raw, 13)
    np.testing.assert_array_equal(sc, raw["kp"][0])
    for k, v in raw.items():
        np.testing.assert_allclose(smoothed[k][0], v[:7].mean(0), rtol=1e-5, atol=1e-6)     # frames 0..6
        np.testing.assert_allclose(smoothed[k][10], v[4:17].mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(smoothed[k][19], v[13:].mean(0), rtol=1e-5, atol=1e-6)    # frames 13..19
    one = {k: v[:1] for k, v in raw.items()}
    np.testing.assert_array_equal(source_statistics(one, 13)[0]["kp"], one["kp"])          # an image: as is


def _store_clean(home: Path) -> bool:
    adir = home / "avatars"
    return not adir.exists() or not any(adir.iterdir())


def _image(path: Path, img: np.ndarray) -> Path:
    cv2.imwrite(str(path), img)
    return path


@pytest.fixture(scope="module")
def bad_sources(tmp_path_factory, anchor_video) -> dict[str, tuple[Path, int, str]]:
    d = tmp_path_factory.mktemp("bad")
    ff = __import__("imageio_ffmpeg").get_ffmpeg_exe()
    (d / "empty.mp4").write_bytes(b"")
    (d / "text.mp4").write_text("this is not a video\n" * 20)
    data = anchor_video.read_bytes()
    (d / "truncated.mp4").write_bytes(data[: len(data) // 3])
    subprocess.run([ff, "-y", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=440:d=1", str(d / "audio_only.mp4")],
                   check=True)
    # moov at the front ("faststart"), then cut: the container still declares all 25 frames
    subprocess.run([ff, "-y", "-loglevel", "error", "-i", str(anchor_video), "-c", "copy", "-movflags", "+faststart",
                    str(d / "faststart.mp4")], check=True)
    whole = (d / "faststart.mp4").read_bytes()
    (d / "cut_short.mp4").write_bytes(whole[: len(whole) * 2 // 3])
    (d / "cut_to_nothing.mp4").write_bytes(whole[: len(whole) // 3])         # not even the first frame
    blank = np.full((1080, 1920, 3), 90, np.uint8)
    write_anchor_video(d / "noface_later.mp4", 6, size=(1280, 720), face_px=120,
                       motion=Motion(center=(500, 360), velocity=(300.0, 0.0)))
    tiny_face = astronaut_canvas(0, Motion.for_face(40, center=(960, 540)))
    return {
        "missing": (d / "missing.mp4", 3, "file not found"),
        "directory": (d, 3, "is a directory"),
        "empty": (d / "empty.mp4", 3, "empty"),
        "text": (d / "text.mp4", 3, "not a readable video or image"),
        "truncated": (d / "truncated.mp4", 3, "truncated|not a readable"),
        "audio_only": (d / "audio_only.mp4", 3, "has no video stream"),
        "cut_short": (d / "cut_short.mp4", 3, r"cut short: decoded \d+ frames \(.* s\) of the 1\.00 s \(25 frames\)"),
        "cut_to_nothing": (d / "cut_to_nothing.mp4", 3, r"cut short|not a readable video"),
        "noface": (_image(d / "blank.png", blank), 4, "frame 0"),
        "noface_later": (d / "noface_later.mp4", 4, r"frame [1-5]\b"),
        "small_face": (_image(d / "small.png", cv2.cvtColor(tiny_face, cv2.COLOR_RGB2BGR)), 4, "px"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "text", "truncated", "audio_only", "cut_short",
                                  "cut_to_nothing", "noface", "noface_later", "small_face"])
def test_bad_sources(case, bad_sources, tiny_checkpoints, tmp_path, run_cli):
    path, code, pattern = bad_sources[case]
    r = run_cli(["register", str(path), "--name", "bad", "--quiet"], store_env(tmp_path, tiny_checkpoints))
    assert r.returncode == code, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ditto-fast: error:"), r.stderr
    import re

    assert re.search(pattern, lines[0]), lines[0]
    assert _store_clean(tmp_path), list((tmp_path / "avatars").iterdir())


@pytest.mark.slow
def test_image_sources_gray_rgba_odd_and_4k(tmp_path, tiny_checkpoints, run_cli):
    face = cv2.cvtColor(astronaut_canvas(0, Motion.for_face(200, center=(700, 400)), size=(1401, 801)),
                        cv2.COLOR_RGB2BGR)   # odd dimensions
    big = cv2.resize(face, (3840, 2196))
    cases = {
        "gray": (_image(tmp_path / "gray.png", cv2.cvtColor(face, cv2.COLOR_BGR2GRAY)), (1400, 800)),
        "rgba": (_image(tmp_path / "rgba.png", cv2.cvtColor(face, cv2.COLOR_BGR2BGRA)), (1400, 800)),
        "odd": (_image(tmp_path / "odd.jpg", face), (1400, 800)),
        "fourk": (_image(tmp_path / "fourk.png", big), (1920, 1098)),
    }
    for name, (path, size) in cases.items():
        r = run_cli(["register", str(path), "--name", name, "--quiet"], store_env(tmp_path / "home", tiny_checkpoints))
        assert r.returncode == 0, (name, r.stderr)
        av = load_avatar(tmp_path / "home" / "avatars" / name)
        assert av.is_image and av.n_frames == 1 and av.size == size, (name, av.size)
        assert av.plate_path.name == "plate.png"


@pytest.mark.slow
def test_names_and_force(tmp_path, tiny_checkpoints, anchor_video, run_cli):
    home = tmp_path / "home"
    env = store_env(home, tiny_checkpoints)
    r = run_cli(["register", str(anchor_video), "--name", "bad name!", "--quiet"], env)
    assert r.returncode == 2 and "name" in r.stderr and _store_clean(home)
    r = run_cli(["register", str(anchor_video), "--name", "ruby", "--quiet", "--max-frames", "3"], env)
    assert r.returncode == 0, r.stderr
    before = (home / "avatars" / "ruby" / "avatar.pkl").read_bytes()
    r = run_cli(["register", str(anchor_video), "--name", "ruby", "--quiet", "--max-frames", "3"], env)
    assert r.returncode == 2 and "--force" in r.stderr
    assert (home / "avatars" / "ruby" / "avatar.pkl").read_bytes() == before
    r = run_cli(["register", str(anchor_video), "--name", "ruby", "--quiet", "--max-frames", "4", "--force"], env)
    assert r.returncode == 0, r.stderr
    assert load_avatar("ruby", root=home).n_frames == 4
    before = (home / "avatars" / "ruby" / "avatar.pkl").read_bytes()
    r = run_cli(["register", str(anchor_video), "--name", "RUBY", "--quiet", "--max-frames", "3", "--force"], env)
    assert r.returncode == 2 and "only in case" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in (home / "avatars").iterdir()) == ["ruby"]
    assert (home / "avatars" / "ruby" / "avatar.pkl").read_bytes() == before


@pytest.mark.slow
def test_two_faces_the_note_names_the_face_taken_and_face_picks_another(tmp_path, tiny_checkpoints, run_cli):
    """The astronaut twice side by side: small on the left, larger on the right. Registration says which face it
    took and where; --face left|right|N takes that one instead of the largest."""
    frame = astronaut_canvas(0, Motion(center=(500, 560), scale=0.8), extra=(Motion(center=(1300, 520), scale=1.2),))
    src = _image(tmp_path / "two.png", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    env = store_env(tmp_path / "home", tiny_checkpoints)
    centres = {}
    for name, extra, taken in (("dflt", [], 2), ("left", ["--face", "left"], 1), ("second", ["--face", "2"], 2)):
        r = run_cli(["register", str(src), "--name", name, "--quiet", *extra], env)
        assert r.returncode == 0, r.stderr
        note = next(ln for ln in r.stderr.splitlines() if "faces found" in ln)
        assert re.fullmatch(rf"ditto-fast: note: {re.escape(str(src))}: frame 0: 2 faces found \(boxes x0,y0-x1,y1 "
                            rf"from the left: \d+,\d+-\d+,\d+; \d+,\d+-\d+,\d+\); took face {taken} \(\d+,\d+-\d+,\d+\), "
                            r".*; choose the face with --face largest\|left\|right\|N \(N counted from the left\)",
                            note), note
        centres[name] = _centre_and_angle(load_avatar(tmp_path / "home" / "avatars" / name).M_c2o[0])[0][0]
    assert centres["left"] < 800 < centres["dflt"] and centres["second"] == centres["dflt"]
    r = run_cli(["register", str(src), "--name", "third", "--quiet", "--face", "3"], env)
    assert r.returncode == 4 and "--face 3 asks for face 3 from the left: only 2 faces found" in r.stderr, r.stderr
    r = run_cli(["register", str(src), "--name", "third", "--quiet", "--face", "middle"], env)
    assert r.returncode == 2 and "--face" in r.stderr


def test_store_not_writable(tmp_path, tiny_checkpoints, anchor_video, run_cli):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store should be")
    r = run_cli(["register", str(anchor_video), "--name", "x", "--quiet"], store_env(blocker, tiny_checkpoints))
    assert r.returncode == 3 and "DITTO_FAST_HOME" in r.stderr, r.stderr


@pytest.mark.slow
def test_ctrl_c_leaves_store_unchanged(tmp_path, tiny_checkpoints, tmp_path_factory):
    video = write_anchor_video(tmp_path / "long.mp4", 150, size=(1280, 720), face_px=120,
                               motion=Motion(center=(640, 360)))
    env = dict(os.environ, DITTO_FAST_HOME=str(tmp_path / "home"), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints))
    p = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "register", str(video), "--name", "x"],
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "home" / "avatars").glob(".tmp-*")):
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert _store_clean(tmp_path / "home"), list((tmp_path / "home" / "avatars").iterdir())


# ----------------------------------------------------------------------------- a full disk (issue 15)
def _register_on_a_small_disk(tmp_path, tiny_checkpoints, source, size_kib: int, skip_estimate: bool):
    """Register `source` into a store on a fresh tmpfs of `size_kib` KiB (a private mount namespace, so
    nothing outside the test sees it); returns (exit code, stderr, what the store held afterwards)."""
    home = tmp_path / "home"
    home.mkdir(parents=True)
    code = ("import sys; import ditto_fast.avatar.register as r; "
            + ("r.check_free_space = lambda *a, **k: None; " if skip_estimate else "")
            + "from ditto_fast.cli import main; main(sys.argv[1:])")
    script = (f'mount -t tmpfs -o size={size_kib}k tmpfs "$HOME_DIR" || exit 99; '
              f'"$PY" -c "$CODE" register "$SRC" --name big --quiet; rc=$?; '
              f'ls -A "$HOME_DIR/avatars" 2>/dev/null; exit $rc')
    env = dict(os.environ, DITTO_FAST_HOME=str(home), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints),
               HOME_DIR=str(home), PY=sys.executable, CODE=code, SRC=str(source))
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    except FileNotFoundError:
        pytest.skip("unshare is not installed")
    if r.returncode == 99 or "unshare:" in r.stderr:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()[:200]}")
    return r.returncode, r.stderr, r.stdout.split()


@pytest.mark.slow
def test_a_full_disk_is_an_input_error_and_leaves_nothing(tmp_path, tiny_checkpoints, anchor_video):
    # 25 frames x 128 KiB of tiny features do not fit in 1 MiB: refused before any work ...
    code, err, left = _register_on_a_small_disk(tmp_path, tiny_checkpoints, anchor_video, 1024, skip_estimate=False)
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "not enough free space for avatar 'big'" in lines[0], err
    assert "DITTO_FAST_HOME" in lines[0] and left == []
    # ... and when the disk fills up anyway (estimate skipped), the same exit code and nothing half-written
    code, err, left = _register_on_a_small_disk(tmp_path / "again", tiny_checkpoints, anchor_video, 1024,
                                                skip_estimate=True)
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "no space left on" in lines[0] and "while writing the avatar" in lines[0], err
    assert left == []
