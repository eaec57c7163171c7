"""`avatars show NAME --preview OUT.png`: a 1600-wide PNG that decodes, the crop box drawn where the avatar's
crop is, the same pixels every time, and older avatars (no stored landmarks or mouth) still drawn."""

from __future__ import annotations

import dataclasses
import json

import cv2
import numpy as np
import pytest

from ditto_fast.avatar import load_avatar
from ditto_fast.preview.avatar_sheet import CROP_BOX_COLOUR, avatar_sheet, crop_corners, sheet_layout


def _boxes_found(img: np.ndarray, box) -> np.ndarray:
    """(x0, y0, x1, y1) of the pixels of exactly the crop-box colour inside `box`, in page pixels."""
    cell = img[box.y:box.y + box.h, box.x:box.x + box.w]
    ys, xs = np.nonzero(np.all(cell == np.array(CROP_BOX_COLOUR, np.uint8), axis=-1))
    assert len(xs) > 100, "no crop box drawn"
    return np.array([xs.min() + box.x, ys.min() + box.y, xs.max() + box.x, ys.max() + box.y])


def test_avatars_show_preview_writes_a_readable_png_with_the_crop_box_where_the_crop_is(
        video_avatar, session_home, tmp_path, run_cli):
    out = tmp_path / "anchor.png"
    r = run_cli(["avatars", "show", "anchor", "--preview", out], {"DITTO_FAST_HOME": str(session_home)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["preview"] == str(out)
    img = cv2.imread(str(out), cv2.IMREAD_COLOR)
    av = load_avatar(video_avatar)
    lay = sheet_layout(av.n_frames, av.size)
    assert img is not None and img.shape == (lay.height, 1600, 3)
    assert list(lay.frames) == [0, 5, 10, 14, 19, 24]
    scale = lay.sources[0].w / av.size[0]
    for k, box in zip(lay.frames, lay.sources):
        corners = crop_corners(av.M_c2o[k]) * scale + (box.x, box.y)
        expected = np.r_[corners.min(0), corners.max(0)]
        assert np.abs(_boxes_found(img, box) - expected).max() <= 2.5, (k, _boxes_found(img, box), expected)
    # the crop beside it is the avatar's crop of that frame: a face, not the studio background
    crop = img[lay.crops[0].y:lay.crops[0].y + lay.crops[0].h, lay.crops[0].x:lay.crops[0].x + lay.crops[0].w]
    assert crop.std() > 20


@pytest.mark.slow
def test_the_same_avatar_gives_the_same_pixels_and_older_avatars_still_draw(video_avatar):
    av = load_avatar(video_avatar)
    first = avatar_sheet(av)
    np.testing.assert_array_equal(first, avatar_sheet(av))
    old_meta = {k: v for k, v in av.meta.items() if k != "extra"}          # as registered before previews
    old = avatar_sheet(dataclasses.replace(av, meta=old_meta))
    assert old.shape == first.shape and not np.array_equal(old, first)
    lay = sheet_layout(av.n_frames, av.size)
    box = lay.sources[0]
    assert len(_boxes_found(old, box)) == 4                                  # the crop box is still there
    mouth = lay.plots[2]
    assert not np.array_equal(old[mouth.y:mouth.y + mouth.h], first[mouth.y:mouth.y + mouth.h])


def test_preview_path_errors(video_avatar, session_home, tmp_path, run_cli):
    env = {"DITTO_FAST_HOME": str(session_home)}
    r = run_cli(["avatars", "show", "anchor", "--preview", tmp_path / "x.jpg"], env)
    assert r.returncode == 2 and ".png" in r.stderr
    r = run_cli(["avatars", "show", "anchor", "--preview", tmp_path / "missing" / "x.png"], env)
    assert r.returncode == 3 and "does not exist" in r.stderr
