"""FaceTracker: landmarks on every frame of synthetic 1080p anchor footage (skimage's astronaut)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ditto_fast.core.errors import NoFaceError
from ditto_fast.face.crop import face_size, transform_points
from ditto_fast.face.landmarks import FaceTracker, MultipleFacesWarning, box_text
from synthetic import ASTRONAUT_FACE_PX, Motion, astronaut, astronaut_canvas, write_anchor_video

pytestmark = pytest.mark.register      # mediapipe: registration and its landmarks


@pytest.fixture(scope="module")
def astronaut_lmk() -> np.ndarray:
    """Landmarks [478, 3] of the astronaut picture itself (512x512), the reference for placed copies."""
    with FaceTracker() as tracker:
        return tracker(astronaut(), 0)


def _in_picture(lmk: np.ndarray, motion: Motion, i: int) -> np.ndarray:
    """Frame-pixel landmarks mapped back into astronaut-picture pixels [478, 2]."""
    return transform_points(lmk[:, :2], np.linalg.inv(motion.matrix(i)))


def test_every_frame_tracked_and_on_the_face(astronaut_lmk):
    motion = Motion(center=(700, 480), velocity=(4.0, 1.5), spin_deg=0.4, angle_deg=-2.0)
    with FaceTracker() as tracker:
        for i in range(8):
            lmk = tracker(astronaut_canvas(i, motion), i)
            assert lmk.shape == (478, 3) and lmk.dtype == np.float32
            err = np.linalg.norm(_in_picture(lmk, motion, i) - astronaut_lmk[:, :2], axis=1)
            assert np.median(err) < 1.5, f"frame {i}: median landmark error {np.median(err):.2f} px"
            # z is in pixels, scaled like x: its spread is comparable to the face's width
            assert 0.2 * ASTRONAUT_FACE_PX < np.ptp(lmk[:, 2]) < 1.5 * ASTRONAUT_FACE_PX


def test_deterministic():
    motion = Motion(velocity=(2.0, 0.0))
    runs = []
    for _ in range(2):
        with FaceTracker() as tracker:
            runs.append(np.stack([tracker(astronaut_canvas(i, motion, noise=2.0), i) for i in range(3)]))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_small_face_found():
    face_px = 82.0
    motion = Motion.for_face(face_px, center=(1400, 700))
    with FaceTracker(min_face_px=64) as tracker:
        for i in range(3):
            lmk = tracker(astronaut_canvas(i, motion), i)
            assert abs(face_size(lmk) - face_px) < 0.1 * face_px


def test_face_below_minimum_is_refused():
    motion = Motion.for_face(52.0, center=(600, 400))
    with FaceTracker(min_face_px=64) as tracker, pytest.raises(NoFaceError, match=r"frame 0: the face is only \d+ px"):
        tracker(astronaut_canvas(0, motion), 0)


def test_blank_frame_names_the_index():
    with FaceTracker() as tracker:
        blank = np.full((1080, 1920, 3), 40, np.uint8)
        with pytest.raises(NoFaceError, match="frame 7") as info:
            tracker(blank, 7)
        assert info.value.frame_index == 7


def test_face_lost_mid_video_names_the_index_then_recovers():
    motion = Motion()
    with FaceTracker(source="anchor.mp4") as tracker:
        tracker(astronaut_canvas(0, motion), 0)
        tracker(astronaut_canvas(1, motion), 1)
        with pytest.raises(NoFaceError, match=r"anchor\.mp4: .*frame 2"):
            tracker(np.zeros((1080, 1920, 3), np.uint8), 2)
        # after the failure the next frame is detected afresh, wherever the face is
        jumped = Motion(center=(1500, 650))
        lmk = tracker(astronaut_canvas(3, jumped), 3)
        assert abs(lmk[:, 0].mean() - 1500) < 80 and abs(lmk[:, 1].mean() - 650) < 150


def test_redetects_after_a_cut():
    with FaceTracker() as tracker:
        a = tracker(astronaut_canvas(0, Motion(center=(400, 500))), 0)
        b = tracker(astronaut_canvas(1, Motion(center=(1500, 500))), 1)
        assert a[:, 0].mean() < 700 and b[:, 0].mean() > 1200


def test_two_faces_largest_picked_with_warning():
    big = Motion(center=(1300, 520), scale=1.2)
    small = Motion(center=(500, 560), scale=0.8)
    with FaceTracker() as tracker, pytest.warns(MultipleFacesWarning, match="2 faces"):
        lmk = tracker(astronaut_canvas(0, small, extra=(big,)), 0)
    assert lmk[:, 0].mean() > 1000
    assert tracker.multiple_faces_frames == [0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # one face: no warning
        with FaceTracker() as tracker:
            tracker(astronaut_canvas(0, big), 0)


@pytest.fixture(scope="module")
def two_faces() -> np.ndarray:
    """A 1080p frame with the astronaut twice: small on the left, larger on the right."""
    return astronaut_canvas(0, Motion(center=(500, 560), scale=0.8), extra=(Motion(center=(1300, 520), scale=1.2),))


@pytest.mark.parametrize("face, right", [("largest", True), ("left", False), ("right", True), (1, False), (2, True)])
def test_the_face_option_picks_one_of_two_and_says_which(two_faces, face, right):
    with FaceTracker(face=face) as tracker, pytest.warns(MultipleFacesWarning) as caught:
        lmk = tracker(two_faces, 0)
    assert (lmk[:, 0].mean() > 1000) == right
    (index, by_x, taken, why), = tracker.face_choices
    assert index == 0 and len(by_x) == 2 and by_x[0][0] < 800 < by_x[1][0]
    assert taken is by_x[1 if right else 0] and taken[0] <= lmk[:, 0].mean() <= taken[2]
    text = str(caught[0].message)
    assert f"2 faces found (boxes x0,y0-x1,y1 from the left: {box_text(by_x[0])}; {box_text(by_x[1])}); took " \
           f"face {2 if right else 1} ({box_text(taken)})" in text, text


def test_a_face_number_beyond_the_faces_found_is_no_face(two_faces):
    with FaceTracker(face=3) as tracker, pytest.raises(NoFaceError, match=r"frame 0: --face 3 asks for face 3 from "
                                                                         r"the left: only 2 faces found") as e:
        tracker(two_faces, 0)
    assert e.value.frame_index == 0


def test_one_face_with_a_face_choice_is_that_face():
    one = astronaut_canvas(0, Motion(center=(1300, 520), scale=1.2))
    with FaceTracker() as tracker:
        want = tracker(one, 0)
    for face in ("left", "right", 1):
        with warnings.catch_warnings(), FaceTracker(face=face) as tracker:
            warnings.simplefilter("error")
            np.testing.assert_array_equal(tracker(one, 0), want)
            assert tracker.face_choices == []
    with FaceTracker(face=2) as tracker, pytest.raises(NoFaceError, match="only 1 face found"):
        tracker(one, 0)


def test_a_badge_too_small_to_be_a_face_is_not_a_second_face():
    """A portrait whose suit carries a small face-like badge (below min_face_px): one face, no note, no warning."""
    portrait = astronaut_canvas(0, Motion(center=(960, 420), scale=1.3),
                                extra=(Motion.for_face(52.0, center=(1180, 900)),))
    with warnings.catch_warnings(), FaceTracker(min_face_px=64) as tracker:
        warnings.simplefilter("error")
        lmk = tracker(portrait, 0)
        boxes = tracker._detect_boxes(portrait)
    assert len(boxes) == 2, boxes                # the detector does see the badge ...
    assert tracker.face_choices == [] and tracker.multiple_faces_frames == []       # ... but it is no face
    assert abs(lmk[:, 0].mean() - 960) < 80 and face_size(lmk) > 100


def test_rejects_non_rgb_uint8():
    with FaceTracker() as tracker, pytest.raises(ValueError):
        tracker(np.zeros((64, 64), np.float32), 0)


def test_landmarks_through_an_encoded_video(tmp_path):
    import imageio_ffmpeg

    path = write_anchor_video(tmp_path / "anchor.mp4", n_frames=6, size=(1280, 720), face_px=90.0)
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = gen.__next__()
    assert tuple(meta["size"]) == (1280, 720)
    w, h = meta["size"]
    n = 0
    with FaceTracker() as tracker:
        for i, buf in enumerate(gen):
            lmk = tracker(np.frombuffer(buf, np.uint8).reshape(h, w, 3), i)
            assert abs(face_size(lmk) - 90.0) < 9.0
            n += 1
    assert n == 6
