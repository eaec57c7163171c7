"""The seamless putback: only the face the motion changes is pasted, its colour matched to the plate at the edge,
steady over frames; feather stays Ditto's square. Measured on decoder outputs whose faults are known (the plate's
own crop altered as decoders fail; scripts/support/seam_faults.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from ditto_fast.media.yuv import I420, Layout
from ditto_fast.render import face_mask as fm
from ditto_fast.render.putback import YuvPutback, _upsampled
from ditto_fast.render.seam import push_pull
from seam_faults import FAULTS, coverage, flicker, measure, own_crop, scene

COLOUR_FAULTS = ["colour cast", "brightness +8", "lighting ramp", "new background"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_seamless_meets_the_seam_goals_on_each_fault(blend_kernel, fault):
    got = measure("seamless", FAULTS[fault])
    assert got["ring"] <= 1.0, got                  # just outside the face: the plate's own values
    assert got["step"] <= 0.0, got                  # across the pasted edge: no more than the plate's own step
    assert got["untouched"] == 1.0, got             # the square outside the face: the plate's bytes
    assert got["detail"] <= 1.0, got                # inside: the generated face's own gradients


@pytest.mark.slow
@pytest.mark.parametrize("fault", COLOUR_FAULTS)
def test_feather_fails_the_seam_goal_on_the_colour_faults(blend_kernel, fault):
    got = measure("feather", FAULTS[fault])
    assert got["ring"] > 1.0 and got["untouched"] < 0.5, got


def test_a_cast_is_matched_by_a_gain_and_a_new_background_is_not():
    """The cast multiplies red by 1.06: the gain fitted on the edge undoes it (1/1.06), and green, which the cast
    left alone, keeps 1. The re-synthesised background also reads as a gain on the edge, but the real face inside
    must not take it: its gains stay within 2 % of 1. After a cut, the running mean starts afresh."""
    rgb, plate, M = scene()
    gains, putbacks = {}, {}
    for fault in ("colour cast", "new background", "brightness +8"):
        pb = putbacks[fault] = YuvPutback(blend="seamless")
        pb(plate.copy(), FAULTS[fault](own_crop(rgb, M)), M)
        gains[fault] = pb.gain._last.copy()
    assert abs(gains["colour cast"][0] - 1 / 1.06) < 0.01 and gains["colour cast"][1] == 1.0, gains
    assert np.abs(gains["new background"] - 1).max() < 0.02, gains
    assert (gains["brightness +8"] == 1.0).all(), gains      # an offset is the membrane's
    pb = putbacks["colour cast"]
    pb(plate.copy(), FAULTS["brightness +8"](own_crop(rgb, M)), M, cut=True)     # after a cut, the new frame's own
    assert (pb.gain._last == 1.0).all(), pb.gain._last


def test_kernel_and_numpy_fallback_agree(blend_kernel):
    rgb, plate, M = scene()
    crop = FAULTS["lighting ramp"](own_crop(rgb, M))
    kps = np.random.default_rng(2).uniform(-0.4, 0.4, (21, 3))
    a = YuvPutback(blend="seamless")(plate.copy(), crop, M, kps, kps * 1.03 + 0.01)
    b = YuvPutback(blend="seamless", use_kernel=False)(plate.copy(), crop, M, kps, kps * 1.03 + 0.01)
    diff = np.abs(a.astype(int) - b)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@pytest.mark.parametrize("shift", [0.0, -380.0], ids=["whole", "half-off-frame"])
@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv422p10le"])
def test_the_kernels_correction_is_the_numpy_one(blend_kernel, pix_fmt, shift):
    from ditto_fast.render import _blend
    from ditto_fast.render.seam import SeamMatch
    from support import planes_of

    lay = Layout(pix_fmt)
    rgb, _, M = scene()
    M = M + np.array([[0, 0, shift], [0, 0, 0], [0, 0, 0]])
    planes = lay.planes(planes_of(rgb, lay))
    pb = YuvPutback(blend="seamless", layout=lay)
    kps = np.random.default_rng(2).uniform(-0.4, 0.4, (21, 3))
    grid = pb.face_mask(kps, kps * 1.03 + 0.01)
    for fault in FAULTS.values():
        small = cv2.resize(fault(own_crop(rgb, M)), (64, 64), interpolation=cv2.INTER_AREA).astype(np.float32)
        crop_yuv = cv2.transform(small, pb.to_yuv)
        fast = SeamMatch(lay, kernel=_blend.seam_correction)(grid, crop_yuv, planes, M)
        slow = SeamMatch(lay)(grid, crop_yuv, planes, M)
        assert np.abs(fast - slow).max() < 1e-4 * lay.scale and np.abs(slow).max() > 0.5


@pytest.mark.parametrize("pix_fmt", ["yuv422p", "yuv422p10le", "yuv420p10le"])
def test_seamless_works_in_the_plates_own_planes(blend_kernel, pix_fmt):
    from support import planes_of

    lay = Layout(pix_fmt)
    rgb, _, M = scene()
    plate = planes_of(rgb, lay)
    crop = FAULTS["brightness +8"](own_crop(rgb, M))
    out = YuvPutback(blend="seamless", layout=lay)(plate.copy(), crop, M)
    ref = YuvPutback(blend="seamless", layout=lay, use_kernel=False)(plate.copy(), crop, M)
    assert out.dtype == lay.dtype and np.abs(out.astype(int) - ref).max() <= lay.scale
    # the same paste as in 8-bit 4:2:0, at these planes' depth
    i420 = YuvPutback(blend="seamless")(planes_of(rgb, I420), crop, M)
    diff = np.abs(lay.planes(out)[0][0] / lay.scale - I420.planes(i420)[0][0])
    assert diff.mean() < 0.3 and np.percentile(diff, 99.9) <= 2, (diff.mean(), np.percentile(diff, 99.9))
    grid = cv2.resize(YuvPutback(blend="seamless").face_mask(np.zeros((1, 3)), np.zeros((1, 3))), (512, 512))
    assert np.array_equal(lay.planes(out)[0][0][~(cv2.warpAffine(grid, M[:2], rgb.shape[1::-1]) > 0)],
                          lay.planes(plate)[0][0][~(cv2.warpAffine(grid, M[:2], rgb.shape[1::-1]) > 0)])


def test_a_microphone_across_the_edge_does_not_smear_into_the_face(blend_kernel):
    """The plate has a bright microphone crossing the chin's edge that the decoder did not draw: the correction
    leaves those edge samples out, so the face around it keeps the decoder's colour."""
    rgb, _, M = scene()
    crop = own_crop(rgb, M)                                 # the decoder's face: no microphone
    mic = rgb.copy()
    chin = (M[:2, :2] @ np.array([256.0, 470.0]) + M[:2, 2]).astype(int)
    mic[chin[1] - 10:, chin[0] - 12:chin[0] + 12] = (235, 235, 240)      # silver, over her dark collar
    grid = cv2.resize(YuvPutback(blend="seamless").face_mask(np.zeros((1, 3)), np.zeros((1, 3))), (512, 512))
    face = cv2.warpAffine(grid, M[:2], rgb.shape[1::-1]) >= 0.999
    near = np.zeros_like(face)
    near[chin[1] - 70:, chin[0] - 70:chin[0] + 70] = True
    near[chin[1] - 14:, chin[0] - 16:chin[0] + 16] = False     # the face around the microphone, not under it
    near &= face
    from ditto_fast.media.yuv import rgb_to_i420

    out = {}
    for bound in (24.0, 1e9):
        luma = []
        for plate in (mic, rgb):
            pb = YuvPutback(blend="seamless")
            pb.seam.bound = bound
            luma.append(I420.planes(pb(rgb_to_i420(plate), crop, M))[0][0].astype(float))
        out[bound] = np.abs(luma[0] - luma[1])[near].mean()     # what the microphone changed in the face
    assert out[24.0] < 0.5, out          # bounded: the face keeps its own levels around the microphone
    assert out[1e9] > 2 * out[24.0], out  # unbounded, the microphone's white pulls the face


def test_the_correction_is_steady_and_starts_afresh_at_a_cut(blend_kernel):
    assert flicker(FAULTS["lighting ramp"]) < 0.5
    rgb, plate, M = scene()
    pb = YuvPutback(blend="seamless")
    pb(plate.copy(), FAULTS["brightness +8"](own_crop(rgb, M)), M)
    settled = pb.seam._last.copy()
    pb(plate.copy(), own_crop(rgb, M), M)            # the fault gone: the running mean moves part of the way
    assert 0.5 < np.abs(pb.seam._last - settled).mean() < 7.5
    pb(plate.copy(), own_crop(rgb, M), M, cut=True)  # a cut: the new frame's own correction at once
    assert np.abs(pb.seam._last).mean() < 1.0


@pytest.mark.parametrize("pose", [dict(yaw=30), dict(yaw=-30), dict(pitch=30), dict(pitch=-30), dict(roll=20),
                                  dict(roll=-20), dict(jaw=33), dict(yaw=8, pitch=5, roll=4, scale=1.05, shift=(6, 4),
                                                                     jaw=20)])
def test_the_face_stays_inside_its_mask_over_the_pose_range(pose):
    assert coverage(**pose) == 1.0


def test_without_its_margin_the_mask_loses_a_turned_face():
    assert coverage(yaw=30, margin=0.0) < 0.97 and coverage(yaw=90) < 1.0      # the measured limits (face_mask.py)


def test_push_pull_fills_smoothly_from_the_known_cells():
    values = np.zeros((32, 32, 1))
    weights = np.zeros((32, 32))
    values[0, :, 0], values[-1, :, 0] = 10.0, -10.0     # known on two edges only
    weights[0, :], weights[-1, :] = 1.0, 1.0
    filled = push_pull(values, weights)[..., 0]
    assert np.allclose(filled[0], 10.0) and np.allclose(filled[-1], -10.0)
    column = filled[:, 16]
    assert (np.diff(column) <= 1e-6).all() and abs(column[15] + column[16]) < 2.0   # falls steadily between them


@pytest.mark.parametrize("size", [(512, 512), (256, 256), (256, 512)])
def test_the_correction_upsampled_over_a_part_is_that_part_of_the_whole(size):
    rng = np.random.default_rng(1)
    for grid in (rng.normal(0, 5, (32, 32)), rng.normal(0, 5, (32, 32, 2))):
        grid = grid.astype(np.float32)
        whole = cv2.resize(grid, size, interpolation=cv2.INTER_LINEAR)
        for _ in range(100):
            (x0, x1), (y0, y1) = np.sort(rng.integers(0, size[0], 2)), np.sort(rng.integers(0, size[1], 2))
            x1, y1 = x1 + 1, y1 + 1
            assert np.array_equal(_upsampled(grid, size, (x0, y0, x1, y1)), whole[y0:y1, x0:x1]), (x0, y0, x1, y1)


def test_the_mask_is_the_face_not_the_square():
    mask = fm.FaceMask()(np.zeros((1, 3)), np.zeros((1, 3)))
    cx, cy, ax, a_up, a_down = fm.face_ellipse()
    c = 512 / fm.GRID
    assert mask[int(cy / c), int(cx / c)] == 1.0 and mask[1, 1] == 0.0 and mask[1, fm.GRID // 2] == 0.0   # set, hair
    assert 0.3 < (mask > 0).mean() < 0.75


@pytest.mark.slow
def test_a_real_render_keeps_every_plate_pixel_outside_the_face_mask(tmp_path, video_avatar, tiny_checkpoints, clips,
                                                                    monkeypatch):
    """A real render (tiny networks, lossless x264 so the written frames come back as written): outside each
    frame's face mask (and its bilinear reach), every pixel is the plate's."""
    from ditto_fast import Renderer, RenderRequest
    from ditto_fast.avatar import load_avatar
    from ditto_fast.avatar.plate import PlateReader

    seen = []
    original = fm.FaceMask.__call__

    def spy(self, x_s, x_d):
        grid = original(self, x_s, x_d)
        seen.append(grid.copy())
        return grid

    monkeypatch.setattr(fm.FaceMask, "__call__", spy)
    out = tmp_path / "out.mkv"
    renderer = Renderer(tiny_checkpoints, device="cpu", crf=0, preset="ultrafast")
    result = renderer.render(RenderRequest(avatar="anchor", audio=clips[0], output=out, blend="seamless"))
    assert result.timings["blend"] == "seamless"
    avatar = load_avatar(video_avatar)
    w, h = avatar.size
    raw = subprocess.run([__import__("imageio_ffmpeg").get_ffmpeg_exe(), "-v", "error", "-i", str(out), "-f",
                          "rawvideo", "-pix_fmt", "yuv420p", "pipe:1"], capture_output=True, check=True).stdout
    frames = np.frombuffer(raw, np.uint8).reshape(-1, h * 3 // 2, w)
    assert len(frames) == len(seen) > 0
    from ditto_fast.media.timeline import mirror_index

    with PlateReader(avatar.plate_path, avatar.n_frames, pix_fmt="planes") as plate:
        for i, (frame, grid) in enumerate(zip(frames, seen)):
            k = mirror_index(i, avatar.n_frames)
            reach = cv2.dilate((cv2.resize(grid, (512, 512)) > 0).astype(np.uint8), np.ones((9, 9), np.uint8))
            touched = cv2.warpAffine(reach.astype(np.float32), avatar.M_c2o[k][:2], (w, h)) > 0
            luma = I420.planes(frame)[0][0]
            want = I420.planes(plate.frame(k))[0][0]
            assert np.array_equal(luma[~touched], want[~touched]), i
            assert not np.array_equal(luma, want)          # the face was pasted


@pytest.mark.slow
def test_blend_is_a_setting_of_the_cli_the_config_and_job_lines(tmp_path, video_avatar, tiny_checkpoints, clips,
                                                                session_home):
    env = dict(os.environ, DITTO_FAST_HOME=str(session_home), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints))
    cli = [sys.executable, "-m", "ditto_fast.cli"]
    outs = {}
    for blend in ("feather", "seamless"):
        outs[blend] = tmp_path / f"{blend}.mp4"
        r = subprocess.run([*cli, "render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(outs[blend]),
                            "--blend", blend, "--quiet", "--timings", str(tmp_path / f"{blend}.json")],
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / f"{blend}.json").read_text())["blend"] == blend
    assert outs["feather"].read_bytes() != outs["seamless"].read_bytes()
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "job.mp4", "blend": "seamless"})
                    + "\n")
    r = subprocess.run([*cli, "batch", str(jobs), "--quiet"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    from support import blanked_sha256

    assert blanked_sha256(tmp_path / "job.mp4") == blanked_sha256(outs["seamless"])          # the same bytes from a job line
    r = subprocess.run([*cli, "render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(tmp_path / "x.mp4"),
                        "--blend", "square"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "seamless, feather" in r.stderr and not (tmp_path / "x.mp4").exists()



@pytest.mark.parametrize("blend", ["feather", "seamless"])
@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv422p"])
def test_a_paste_changes_the_chroma_where_it_changes_the_luma(blend_kernel, blend, pix_fmt):
    """A crop of red and blue stripes pasted on a grey plate: the chroma samples it changes cover the same part of
    the frame as the luma pixels it changes (each chroma row standing for its 2 or 1 luma rows)."""
    lay = Layout(pix_fmt)
    _, _, M = scene()
    plate = np.full(lay.shape(960, 540), 128, np.uint8)
    crop = np.zeros((512, 512, 3), np.uint8)
    crop[...] = (200, 40, 40)
    crop[:, ::32] = crop[:, 1::32] = crop[:, 2::32] = crop[:, 3::32] = (40, 40, 200)
    out = YuvPutback(blend=blend, layout=lay)(plate.copy(), crop, M)
    (luma, chroma), (luma0, chroma0) = lay.planes(out), lay.planes(plate)

    def bbox(changed: np.ndarray, sx: int, sy: int) -> np.ndarray:
        ys, xs = np.nonzero(changed)
        return np.array([xs.min() * sx, ys.min() * sy, (xs.max() + 1) * sx, (ys.max() + 1) * sy])

    got = bbox((chroma != chroma0).any(axis=0), 2, lay.chroma_rows)
    want = bbox(luma[0] != luma0[0], 1, 1)
    assert np.abs(got - want).max() <= 4, (got, want)
