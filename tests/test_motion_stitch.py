"""Motion stitch: Ditto's image/video logic vectors, each control's effect, the control file parser."""

import json

import numpy as np
import pytest
import torch

from conftest import assert_close_to_ref
from ditto_fast import models
from ditto_fast.core.errors import InputError
from ditto_fast.motion.controls import BLINK_PROFILE, Controls, load_controls, parse_controls
from ditto_fast.motion.keypoints import motion_to_info, pose_degrees, transform_keypoints
from ditto_fast.motion.stitch import EYE_KP, LIP_KP, MotionStitch, _fix_gaze

N = 12


@pytest.fixture(scope="module")
def stitch_net(parity_checkpoint):
    return models.load("stitch_network", parity_checkpoint("stitch_network"))


@pytest.fixture(scope="module")
def source(logic_vectors):
    return {k.split(".", 1)[1]: v for k, v in logic_vectors.items() if k.startswith("source_info.")}


@pytest.fixture(scope="module")
def motions(logic_vectors):
    return [motion_to_info(m) for m in logic_vectors["convert.in.motion"]]


def run(net, src, motions, **opts):
    ms = MotionStitch(net, **opts)
    xs, xd = zip(*(ms(src, m) for m in motions))
    return np.concatenate(xs), np.concatenate(xd)   # [N, 21, 3] each


@pytest.mark.parametrize("mode", ["image", "video"])
def test_stitch_vectors(stitch_net, source, motions, logic_vectors, mode):
    x_s, x_d = run(stitch_net, source, motions, is_image=mode == "image")
    assert x_s.shape == x_d.shape == (N, 21, 3)
    assert_close_to_ref(x_s, logic_vectors[f"stitch.{mode}.out.x_s"], f"stitch {mode} x_s")
    assert_close_to_ref(x_d, logic_vectors[f"stitch.{mode}.out.x_d"], f"stitch {mode} x_d")
    np.testing.assert_allclose(x_d, logic_vectors[f"stitch.{mode}.out.x_d"], atol=1e-5)


@pytest.mark.parametrize("is_image", [True, False])
def test_first_frame_is_the_source(stitch_net, source, motions, is_image):
    # Relative driving: the first driving frame maps onto the source itself.
    x_s, x_d = run(stitch_net, source, motions[:2], is_image=is_image, stitching=False)
    np.testing.assert_allclose(x_d[0], x_s[0], atol=1e-6)
    assert np.abs(x_d[1] - x_s[1]).max() > 1e-4


def test_video_drives_only_lips(stitch_net, source, motions):
    x_s, x_d = run(stitch_net, source, motions, is_image=False, stitching=False)
    moved = np.abs(x_d - x_s).max(axis=(0, 2))                  # [21]
    others = [k for k in range(21) if k not in LIP_KP]
    assert moved[list(LIP_KP)].min() > 1e-4 and moved[others].max() < 1e-6


def _controls(**kw):
    default = {k: kw.pop(k) for k in list(kw) if k in ("pitch", "yaw", "roll", "pose_scale", "exp_scale", "exp_offset")}
    return Controls(n_frames=N, default=default, **kw)


def test_pose_offset(stitch_net, source, motions):
    # Video avatar (pose from the source, no gaze fix): yaw +10 is exactly the source turned by 10 degrees.
    _, x_d = run(stitch_net, source, motions[:1], is_image=False, stitching=False, controls=_controls(yaw=10, pitch=-4))
    turned = dict(source, yaw=float(_deg(source["yaw"]) + 10) * np.ones(1), pitch=float(_deg(source["pitch"]) - 4) * np.ones(1))
    np.testing.assert_allclose(x_d, transform_keypoints(turned), atol=1e-5)


def _deg(logits):
    from ditto_fast.motion.keypoints import bins_to_degrees
    return bins_to_degrees(logits)[0]


def test_pose_scale_zero_freezes_head(stitch_net, source, motions):
    still = [dict(m, pitch=motions[0]["pitch"], yaw=motions[0]["yaw"], roll=motions[0]["roll"]) for m in motions]
    _, want = run(stitch_net, source, still, is_image=True, stitching=False)
    _, got = run(stitch_net, source, motions, is_image=True, stitching=False, controls=_controls(pose_scale=0))
    np.testing.assert_allclose(got, want, atol=1e-5)
    _, free = run(stitch_net, source, motions, is_image=True, stitching=False)
    assert np.abs(free - want).max() > 1e-3


def test_exp_scale_and_offset(stitch_net, source, motions):
    x_s, one = run(stitch_net, source, motions, is_image=False, stitching=False)
    _, two = run(stitch_net, source, motions, is_image=False, stitching=False, controls=_controls(exp_scale=2))
    np.testing.assert_allclose(two - x_s, 2 * (one - x_s), atol=1e-5)   # lips move twice as far
    offset = np.zeros(63, dtype=np.float32)
    offset[3 * 6 + 1] = 0.05                                             # keypoint 6, y
    x_s, got = run(stitch_net, source, motions[:1], is_image=False, stitching=False, controls=_controls(exp_offset=offset))
    delta = got - x_s
    assert delta[0, 6, 1] == pytest.approx(0.05 * float(source["scale"][0, 0]), abs=1e-6)
    delta[0, 6, 1] = 0
    assert np.abs(delta).max() < 1e-6


@pytest.mark.parametrize("is_image", [True, False])
def test_fade_reaches_source(stitch_net, source, motions, is_image):
    c = Controls(n_frames=N, default={"yaw": 8}, fade_in=4, fade_out=4)
    assert [c.fade_alpha(i) for i in (0, 2, 4, 7, 9, 11)] == [0, 0.5, 1, 1, 0.5, 0]
    x_s, x_d = run(stitch_net, source, motions, is_image=is_image, stitching=False, controls=c)
    for i in (0, N - 1):
        np.testing.assert_allclose(x_d[i], x_s[i], atol=1e-6)
    assert np.abs(x_d[5] - x_s[5]).max() > 1e-3
    # With the stitching network, the faded ends are the network's output for (x_s, x_s).
    x_s, x_d = run(stitch_net, source, motions, is_image=is_image, controls=c)
    with torch.no_grad():
        ref = stitch_net(torch.from_numpy(x_s[[0]]), torch.from_numpy(x_s[[0]])).numpy()
    np.testing.assert_allclose(x_d[[0]], ref, atol=1e-5)


def _eye_spread(x):
    eye = np.array(EYE_KP)
    xs = x[eye]
    centre = x[:, 0].mean()
    return sum(xs[side, 1].std() for side in (xs[:, 0] < centre, xs[:, 0] >= centre) if side.any())


def test_blink_closes_eyes(stitch_net, source, motions):
    # Head pose 0 so the keypoints' y is the face's vertical axis.
    level = dict(source, pitch=np.zeros(1), yaw=np.zeros(1), roll=np.zeros(1))
    _, open_ = run(stitch_net, level, motions, is_image=False, stitching=False)
    _, blink = run(stitch_net, level, motions, is_image=False, stitching=False, controls=Controls(n_frames=N, blinks=(3,)))
    closed = 3 + BLINK_PROFILE.index(1.0)
    assert _eye_spread(blink[closed]) < 1e-6 < _eye_spread(open_[closed])
    assert _eye_spread(open_[4]) > _eye_spread(blink[4]) > 0                 # half closed
    for i in (0, 1, 2, 3 + len(BLINK_PROFILE)):
        np.testing.assert_array_equal(blink[i], open_[i])
    others = [k for k in range(21) if k not in EYE_KP]
    np.testing.assert_array_equal(blink[:, others], open_[:, others])


def test_control_file(tmp_path):
    p = tmp_path / "ctl.json"
    p.write_text(json.dumps({"default": {"yaw": 2}, "frames": {"3-5": {"yaw": 5, "exp_scale": 1.5}, "7": {"pitch": -1}},
                             "fade_in": 2, "fade_out": 3, "blinks": [6]}))
    c = load_controls(p, n_frames=N)
    assert c.at(0).yaw == 2 and c.at(0).fade == 0
    f4 = c.at(4)
    assert (f4.yaw, f4.exp_scale, f4.fade, f4.eye_closure) == (5, 1.5, 1, 0)
    assert c.at(7).pitch == -1 and c.at(7).yaw == 2 and c.at(7).eye_closure == BLINK_PROFILE[1]
    assert c.at(N - 1).fade == 0


@pytest.mark.parametrize("data,key", [
    ({"fade": 3}, "fade"),
    ({"default": {"yawn": 1}}, "default.yawn"),
    ({"frames": {"5-40": {"yaw": 1}}}, "frames.5-40"),
    ({"frames": {"-1": {"yaw": 1}}}, "frames.-1"),
    ({"frames": {"3": {"yaw": "left"}}}, "frames.3.yaw"),
    ({"frames": {"3": {"exp_offset": [0, 1]}}}, "frames.3.exp_offset"),
    ({"blinks": [4, 12]}, "blinks"),
    ({"fade_in": 13}, "fade_in"),
    ({"fade_out": -1}, "fade_out"),
    ({"default": {"yaw": 1e308, "pose_scale": 1e308}}, "default.yaw"),
    ({"default": {"pose_scale": 1e308}}, "default.pose_scale"),
    ({"default": {"pose_scale": -1}}, "default.pose_scale"),
    ({"frames": {"3": {"exp_scale": 6}}}, "frames.3.exp_scale"),
    ({"frames": {"3": {"roll": -91}}}, "frames.3.roll"),
    ({"default": {"exp_offset": [0] * 62 + [1e308]}}, "default.exp_offset"),
])
def test_control_file_errors(tmp_path, data, key):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        load_controls(p, n_frames=N)
    msg = str(e.value)
    assert str(p) in msg and f"'{key}'" in msg and "\n" not in msg


def test_control_file_unreadable(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_controls(tmp_path / "missing.json", N)
    (tmp_path / "x.json").write_text("{yaw: 1")
    with pytest.raises(InputError, match="not valid JSON"):
        load_controls(tmp_path / "x.json", N)
    with pytest.raises(InputError, match="JSON object"):
        parse_controls([1, 2], N, "list.json")


@pytest.mark.parametrize("is_image", [True, False])
def test_between_two_motion_frames_pose_blends_in_degrees(stitch_net, source, motions, is_image):
    """Another output rate: a frame between motion frames a and b blends them after mixing, pose in degrees;
    weight 0 is exactly frame a, and the blended keypoints lie between a's and b's."""
    plain = MotionStitch(stitch_net, is_image=is_image, stitching=False)
    blend = MotionStitch(stitch_net, is_image=is_image, stitching=False)
    a_only = [plain(source, m) for m in motions[:4]]
    assert all(np.array_equal(blend(source, m, motions[i + 1], 0.0)[1], a_only[i][1]) for i, m in
               enumerate(motions[:3]))
    probe = MotionStitch(stitch_net, is_image=is_image, stitching=False)
    probe(source, motions[0])
    mixed = {w: probe._driven(source, motions[2]) if w == 0 else probe._driven(source, motions[3]) for w in (0, 1)}
    half = MotionStitch(stitch_net, is_image=is_image, stitching=False)
    half(source, motions[0])
    _, x_half = half(source, motions[2], motions[3], 0.5)
    info = {k: (mixed[0][k] + mixed[1][k]) / 2 for k in mixed[0]}
    for k in ("pitch", "yaw", "roll"):
        assert info[k].shape == (1,)                                    # degrees, not bin logits
    if is_image:                                                        # the gaze follows the blended pose
        src = {k: pose_degrees(source[k]) for k in ("pitch", "yaw")}
        info["exp"] = _fix_gaze(info["exp"], info["yaw"] - src["yaw"], info["pitch"] - src["pitch"])
    np.testing.assert_allclose(x_half[0], transform_keypoints(info)[0], atol=1e-5)


def test_control_values_out_of_range_name_the_range(tmp_path):
    p = tmp_path / "huge.json"
    p.write_text('{"default": {"yaw": 1e308, "pose_scale": 1e308}}')
    with pytest.raises(InputError, match=r"'default\.yaw' must be a number in -90\.\.90, got 1e\+308"):
        load_controls(p, n_frames=N)
    p.write_text('{"default": {"yaw": 1e999}}')                      # JSON's way to write infinity
    with pytest.raises(InputError, match=r"-90\.\.90, got inf"):
        load_controls(p, n_frames=N)


def test_extreme_allowed_controls_keep_keypoints_finite(stitch_net, source, motions):
    """The range's ends still give finite keypoints (no value can turn into NaN/inf downstream)."""
    for keys in ({"yaw": 90, "pitch": -90, "roll": 90, "pose_scale": 5, "exp_scale": 5, "exp_offset": [1] * 63},
                 {"yaw": -90, "pose_scale": 0, "exp_scale": 0, "exp_offset": [-1] * 63}):
        x_s, x_d = run(stitch_net, source, motions, is_image=True, stitching=True, controls=_controls(**keys))
        assert np.isfinite(x_s).all() and np.isfinite(x_d).all()


@pytest.mark.parametrize("is_image", [True, False], ids=["image", "video"])
@pytest.mark.parametrize("with_controls", [True, False], ids=["controls", "plain"])
def test_batches_give_the_same_bytes_as_single_frames(stitch_net, source, motions, is_image, with_controls):
    """The render loop stitches a whole batch at once: every frame's keypoints are the bytes it gets alone,
    with per-frame sources, blends between motion frames, controls (offsets, blinks, fades) and the gaze fix."""
    rng = np.random.default_rng(5)
    n = len(motions) - 1
    srcs = {k: np.concatenate([v + np.float32(0.01) * i for i in range(n)]).astype(np.float32)
            for k, v in source.items()}
    srcs["exp"][2, 4] = -0.0
    w = np.where(rng.random(n) < 0.4, 0.0, rng.random(n))
    ctl = parse_controls({"default": {"yaw": 2, "exp_scale": 1.1, "pose_scale": 0.8},
                          "frames": {"2-4": {"pitch": -3, "exp_offset": list(rng.normal(0, 0.01, 63))}},
                          "fade_in": 3, "fade_out": 3, "blinks": [5]}, n) if with_controls else None
    single = MotionStitch(stitch_net, is_image=is_image, controls=ctl)
    one = [single({k: v[i:i + 1] for k, v in srcs.items()}, motions[i], motions[i + 1] if w[i] else None, float(w[i]))
           for i in range(n)]
    for size in (3, n):
        batched = MotionStitch(stitch_net, is_image=is_image, controls=ctl)
        got = []
        for lo in range(0, n, size):
            rows = np.arange(lo, min(n, lo + size))
            d = {k: np.concatenate([motions[i][k] for i in rows]) for k in motions[0]}
            d_next = {k: np.concatenate([motions[i + 1][k] for i in rows]) for k in motions[0]}
            x_s, x_d = batched.batch({k: v[rows] for k, v in srcs.items()}, d, d_next, w[rows])
            got += [(x_s[j:j + 1], x_d[j:j + 1]) for j in range(len(rows))]
        for (a_s, a_d), (b_s, b_d) in zip(one, got):
            assert a_s.tobytes() == b_s.tobytes() and a_d.tobytes() == b_d.tobytes()
