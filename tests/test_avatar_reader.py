"""Reading avatars: the write/read round trip, every refusal on load, the verify levels, features, list/show."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from ditto_fast.avatar import format as fmt
from ditto_fast.avatar import load_avatar, reader, store
from ditto_fast.core.errors import AvatarError, UsageError
from support import FP, TAIL, at_most, read_record, reseal_record, store_entries, write_avatar, write_record


# ----------------------------------------------------------------------------- round trip
def test_round_trip(tmp_path):
    d, meta, f_s_data = write_avatar(tmp_path, n=5)
    assert d == tmp_path / "avatars" / "ruby"
    assert sorted(p.name for p in d.iterdir()) == ["avatar.pkl", "f_s.npy", "plate.mp4"]
    assert store_entries(tmp_path) == ["ruby"]  # no temporaries left

    av = load_avatar("ruby", expected_fingerprints=FP, root=tmp_path)
    assert av.name == "ruby" and av.dir == d and av.n_frames == 5
    assert av.is_image is False and av.fps == 25.0 and av.size == (640, 360)
    assert av.fingerprints == FP and av.random_weights is True
    assert av.plate_path == d / "plate.mp4"
    for k in ("pitch", "yaw", "roll", "t", "scale", "kp"):
        a = av.x_s_info[k]
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, meta.x_s_info[k].astype(np.float32))
    assert av.x_s_info["exp"].shape == (5, 63)
    np.testing.assert_array_equal(av.x_s_info["exp"], meta.x_s_info["exp"].reshape(5, 63).astype(np.float32))
    assert av.M_c2o.dtype == np.float64 and av.M_c2o.shape == (5, 3, 3)
    np.testing.assert_array_equal(av.M_c2o, meta.M_c2o)
    np.testing.assert_array_equal(av.eye_open, meta.eye_open.astype(np.float32))
    np.testing.assert_array_equal(av.eye_ball, meta.eye_ball.astype(np.float32))
    np.testing.assert_array_equal(av.sc, meta.sc.astype(np.float32))
    assert av.meta["crop"] == meta.crop
    assert av.meta["source"]["path"] == "/data/anchor clip.mp4"
    assert av.meta["format_version"] == fmt.FORMAT_VERSION

    # f_s is memory-mapped, read-only, exact
    assert isinstance(av.f_s, np.memmap)
    assert av.f_s.dtype == np.float16 and av.f_s.shape == (5, *TAIL)
    assert not av.f_s.flags.writeable and not av.f_s.flags.owndata
    np.testing.assert_array_equal(np.asarray(av.f_s), f_s_data)

    info = av.frame_info(3)
    assert set(info) == set(fmt.X_S_INFO)
    assert info["pitch"].shape == (1, 66) and info["kp"].shape == (1, 63) and info["scale"].shape == (1, 1)
    np.testing.assert_array_equal(info["t"][0], av.x_s_info["t"][3])
    with pytest.raises(IndexError):
        av.frame_info(5)


def test_load_by_directory_and_full_verify(tmp_path):
    d, _, _ = write_avatar(tmp_path, name="dirload", n=3)
    av = load_avatar(d, verify="full")
    assert av.name == "dirload" and av.n_frames == 3
    assert load_avatar(str(d), verify="light").n_frames == 3
    assert load_avatar(d, verify="sampled").n_frames == 3
    for level in ("sometimes", "size"):
        with pytest.raises(ValueError, match="verify must be one of"):
            load_avatar(d, verify=level)


def test_image_avatar_and_full_shape(tmp_path):
    """A 1-frame image avatar with the full [32,16,64,64] feature shape."""
    d, _, f_s_data = write_avatar(tmp_path, name="still", n=1, tail=fmt.F_S_TAIL_FULL, is_image=True)
    av = load_avatar("still", root=tmp_path)
    assert av.is_image and av.plate_path.name == "plate.png"
    assert av.f_s.shape == (1, 32, 16, 64, 64)
    assert (d / "f_s.npy").stat().st_size > 1 * 32 * 16 * 64 * 64 * 2
    np.testing.assert_array_equal(av.f_s[0], f_s_data[0])


def test_load_maps_features(tmp_path):
    """Opening a 200-frame avatar (small feature tail) maps f_s instead of reading it
    (its time is measured by scripts/bench/bench_avatar_load.py)."""
    write_avatar(tmp_path, name="long", n=200, tail=(2, 2, 64, 64))
    load_avatar("long", root=tmp_path)  # warm
    av = load_avatar("long", root=tmp_path)
    assert av.n_frames == 200 and isinstance(av.f_s, np.memmap)


# ----------------------------------------------------------------------------- refusals
def test_missing_avatar_lists_existing(tmp_path):
    write_avatar(tmp_path, name="ruby", n=2)
    write_avatar(tmp_path, name="amber", n=2)
    with pytest.raises(AvatarError, match=r"'nobody' not found .*existing: amber, ruby.*ditto-fast register") as e:
        load_avatar("nobody", root=tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(AvatarError, match="existing: none"):
        load_avatar("nobody", root=tmp_path / "empty")


def test_other_checkpoints_refused(tmp_path):
    write_avatar(tmp_path, n=2)
    other = dict(FP, motion_extractor="ffffffffffffffff")
    with pytest.raises(AvatarError, match=r"other checkpoints \(motion_extractor\).*register '/data/anchor clip.mp4' "
                                          r"--name ruby --force"):
        load_avatar("ruby", expected_fingerprints=other, root=tmp_path)
    with pytest.raises(AvatarError, match="other checkpoints"):
        load_avatar("ruby", expected_fingerprints=dict(FP, warp_network="0000"), root=tmp_path)
    load_avatar("ruby", expected_fingerprints={"appearance_extractor": FP["appearance_extractor"]}, root=tmp_path)
    load_avatar("ruby", expected_fingerprints=None, root=tmp_path)


def test_truncated_f_s_refused(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=3)
    p = d / "f_s.npy"
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 4096)
    for verify in ("light", "sampled", "full"):
        with pytest.raises(AvatarError, match=r"damaged \(f_s.npy has \d+ bytes.*re-register"):
            load_avatar("ruby", root=tmp_path, verify=verify)


def test_f_s_shape_mismatch_refused(tmp_path):
    """An f_s.npy of another shape, even with the same bytes (size and row CRCs match), is refused."""
    d, _, f_s_data = write_avatar(tmp_path, n=3)
    p = d / "f_s.npy"
    p.write_bytes(fmt.npy_header((6, 2, *TAIL[1:]), fmt.F_S_DTYPE) + f_s_data.tobytes())
    with pytest.raises(AvatarError, match=r"f_s.npy is float16\[6, 2, 4, 64, 64\], expected float16\[3, 4, 4,"):
        load_avatar("ruby", root=tmp_path, verify="full")


# ----------------------------------------------------------------------------- verify levels
def _flip(p: Path, offset: int) -> None:
    with open(p, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_sampled_check_reads_the_first_and_last_rows_only(tmp_path, monkeypatch):
    """The default check reads two f_s rows and two plate blocks, whatever the length; 'full' reads them all."""
    d, _, _ = write_avatar(tmp_path, n=40)
    (d / "plate.mp4").write_bytes(b"\0" * (3 * fmt.PLATE_BLOCK_BYTES + 5))
    body = read_record(d)
    body["checksums"]["plate.mp4"] = fmt.file_record(d / "plate.mp4")
    write_record(d, body)
    read, real = [], fmt.block_crc32
    monkeypatch.setattr(fmt, "block_crc32", lambda path, off, bb, blocks: (read.append((path.name, list(blocks))),
                                                                            real(path, off, bb, blocks))[1])
    load_avatar("ruby", root=tmp_path)
    assert read == [("f_s.npy", [0, 39]), ("plate.mp4", [0, 3])]
    read.clear()
    load_avatar("ruby", root=tmp_path, verify="light")
    assert read == []
    load_avatar("ruby", root=tmp_path, verify="full")
    assert read == [("f_s.npy", list(range(40))), ("plate.mp4", [0, 1, 2, 3])]


def test_checksum_failure_same_size(tmp_path):
    """A flipped byte in a middle row: only verify='full' sees it; damage in the first row the default sees."""
    d, _, _ = write_avatar(tmp_path, n=3, tail=fmt.F_S_TAIL_FULL)
    p = d / "f_s.npy"
    row = 4 << 20
    _flip(p, fmt.F_S_HEADER_BYTES + row + 12345)       # frame 1
    load_avatar("ruby", root=tmp_path, verify="sampled")  # the documented trade-off of the sampled check
    with pytest.raises(AvatarError, match=r"damaged \(f_s.npy fails its checksum at frame 1\).*re-register"):
        load_avatar("ruby", root=tmp_path, verify="full")
    _flip(p, fmt.F_S_HEADER_BYTES + 200)                # frame 0: caught by the default check
    with pytest.raises(AvatarError, match=r"f_s.npy fails its checksum at frame 0\)"):
        load_avatar("ruby", root=tmp_path)


def test_full_check_names_damaged_frames(tmp_path):
    """verify='full' checks each f_s row's CRC-32 and names the first damaged frame and how many more."""
    d, _, _ = write_avatar(tmp_path, n=6)
    p = d / "f_s.npy"
    row = int(np.prod(TAIL)) * 2
    with open(p, "r+b") as f:
        for k in (2, 4):
            f.seek(fmt.F_S_HEADER_BYTES + k * row + row // 2)
            f.write(b"\x55\xaa")
    with pytest.raises(AvatarError, match=r"f_s.npy fails its checksum at frame 2 and 1 more\)"):
        load_avatar("ruby", root=tmp_path, verify="full")


def test_plate_checks(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=2)
    plate = d / "plate.mp4"
    _flip(plate, 10)
    with pytest.raises(AvatarError, match=r"plate.mp4 fails its checksum at bytes 0-3004\)"):
        load_avatar("ruby", root=tmp_path)
    plate.unlink()
    with pytest.raises(AvatarError, match="plate.mp4 is missing"):
        load_avatar("ruby", root=tmp_path, verify="light")


# ----------------------------------------------------------------------------- features (issues 15, 40)
def test_features_holding_nan_are_damaged(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=4)
    f_s = np.load(d / fmt.F_S_NAME, mmap_mode="r+")
    f_s[3, 0, 0, 0, 0] = np.nan                       # the last frame, which a sampled check reads
    f_s.flush()
    del f_s
    rec = fmt.file_record(d / fmt.F_S_NAME, fmt.F_S_HEADER_BYTES, int(np.prod(TAIL)) * 2)
    reseal_record(d, lambda body: body["checksums"][fmt.F_S_NAME].update(crc32=rec["crc32"]))
    assert load_avatar("ruby", root=tmp_path, verify="light").n_frames == 4      # not read: not checked
    with pytest.raises(AvatarError, match="f_s.npy holds NaN or infinite values at frame 3"):
        load_avatar("ruby", root=tmp_path)


@pytest.mark.parametrize("fname", [fmt.F_S_NAME, "plate.mp4"])
def test_features_or_plate_that_are_no_regular_file_are_refused(tmp_path, fname):
    d, _, _ = write_avatar(tmp_path, n=2)
    (d / fname).unlink()
    os.mkfifo(d / fname)
    with at_most(20), pytest.raises(AvatarError, match=f"{fname} is not a regular file"):
        load_avatar("ruby", root=tmp_path)


def _overwrite_rows(d: Path, frames: list[int], value: float, reseal: bool = False) -> None:
    """Write `value` into the middle of the given f_s rows (as rot or a bad copy would); with `reseal` the record's
    CRC-32s are made to match (a deliberate edit)."""
    f_s = np.load(d / fmt.F_S_NAME, mmap_mode="r+")
    for i in frames:
        f_s[i].reshape(-1)[f_s[i].size // 2 : f_s[i].size // 2 + 64] = value
    f_s.flush()
    tail = f_s.shape[1:]
    del f_s
    if reseal:
        rec = fmt.file_record(d / fmt.F_S_NAME, fmt.F_S_HEADER_BYTES, int(np.prod(tail)) * 2)
        reseal_record(d, lambda body: body["checksums"][fmt.F_S_NAME].update(crc32=rec["crc32"]))


@pytest.mark.parametrize("reseal, why", [(False, "fails its checksum"), (True, "holds NaN or infinite values")])
def test_features_check_each_frame_as_it_is_read(tmp_path, reseal, why):
    d, _, f_s_data = write_avatar(tmp_path, n=6)
    _overwrite_rows(d, [2, 3], np.nan, reseal)       # the middle frames: the sampled check at open reads 0 and 5
    av = load_avatar("ruby", root=tmp_path)
    np.testing.assert_array_equal(av.features(np.array([0, 5, 1, 1])), f_s_data[[0, 5, 1, 1]])
    with pytest.raises(AvatarError, match=rf"avatar 'ruby' .*damaged \(f_s\.npy {why} at frame 2; "
                                          r"`ditto-fast avatars show ruby --verify` checks every frame\); re-register"):
        av.features(np.array([1, 3, 2, 4]))
    with pytest.raises(AvatarError, match=f"{why} at frame 3"):
        av.features(np.array([3]))
    np.testing.assert_array_equal(av.features(np.array([4])), f_s_data[[4]])


def test_features_check_a_frame_once(tmp_path, monkeypatch):
    d, _, _ = write_avatar(tmp_path, n=4)
    av = load_avatar("ruby", root=tmp_path)
    seen, crc32 = [], zlib.crc32
    monkeypatch.setattr(reader.zlib, "crc32", lambda b, *a: seen.append(1) or crc32(b, *a))
    av.features(np.array([1, 1, 2]))
    av.features(np.array([2, 1, 3, 3]))
    assert len(seen) == 3


# ----------------------------------------------------------------------------- list / show
def test_list_show_rm(tmp_path, monkeypatch):
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path))
    assert reader.list_avatars() == []
    write_avatar(tmp_path, name="ruby", n=3)
    write_avatar(tmp_path, name="amber", n=1, is_image=True, fingerprints={"appearance_extractor": "x"})
    d_bad, _, _ = write_avatar(tmp_path, name="broken", n=2)
    (d_bad / "f_s.npy").write_bytes(b"short")
    (tmp_path / "avatars" / ".doctor-abc").write_text("")  # other dot files are ignored

    rows = reader.list_avatars()
    assert [r["name"] for r in rows] == ["amber", "broken", "ruby"]
    amber, broken, ruby = rows
    assert "error" in broken and "f_s.npy" in broken["error"] and "frames" not in broken
    assert ruby["frames"] == 3 and ruby["resolution"] == "640x360" and ruby["is_image"] is False
    assert ruby["random_weights"] is True and len(ruby["checkpoints"]) == 12
    assert ruby["checkpoints"] == reader.combined_fingerprint(FP) != amber["checkpoints"]
    assert ruby["size_bytes"] == sum(p.stat().st_size for p in (tmp_path / "avatars" / "ruby").iterdir())
    assert amber["is_image"] is True and amber["frames"] == 1
    assert ruby["created"].startswith(str(time.gmtime().tm_year))

    info = reader.avatar_info("ruby", verify=True)
    assert info["verified"] == "full" and info["fps"] == 25.0 and info["fingerprints"] == FP
    assert info["f_s_shape"] == [3, *TAIL] and info["plate"] == "plate.mp4"
    assert info["checksums"]["f_s.npy"]["crc32"] == "3 blocks" and info["format_version"] == fmt.FORMAT_VERSION
    assert reader.avatar_info("ruby", verify=False)["verified"] == "sampled"
    assert reader.avatar_info("ruby")["verified"] == "sampled"
    with pytest.raises(AvatarError, match="damaged"):
        reader.avatar_info("broken")

    removed = store.remove_avatar("ruby")
    assert removed == tmp_path / "avatars" / "ruby" and not removed.exists()
    assert [r["name"] for r in reader.list_avatars()] == ["amber", "broken"]
    with pytest.raises(AvatarError, match=r"'ruby' not found .*existing: amber, broken"):
        store.remove_avatar("ruby")
    with pytest.raises(UsageError):
        store.remove_avatar("../x")
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "avatars").iterdir())
