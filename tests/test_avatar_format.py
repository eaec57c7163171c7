"""The avatar format: what avatar.pkl holds, its format line and CRC-32, the checks on its record."""

from __future__ import annotations

import os
import pickle
import zlib

import numpy as np
import pytest

from ditto_fast.avatar import format as fmt
from ditto_fast.avatar import load_avatar, reader, safe_pickle
from ditto_fast.core.errors import AvatarError
from support import TAIL, at_most, read_record, reseal_record, write_avatar, write_record


# ----------------------------------------------------------------------------- the record in avatar.pkl
def test_pickle_holds_only_arrays_and_plain_containers(tmp_path):
    """avatar.pkl is one format line carrying the CRC-32 of one pickle of plain data (no pickle inside)."""
    d, _, _ = write_avatar(tmp_path, n=2)
    line, raw = (d / "avatar.pkl").read_bytes().split(b"\n", 1)
    assert line == b"ditto-fast-avatar format %d crc32 %08x" % (fmt.FORMAT_VERSION, zlib.crc32(raw))
    body = safe_pickle.loads(raw)
    assert body["format_version"] == fmt.FORMAT_VERSION

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(k)
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
        else:
            assert o is None or isinstance(o, (str, int, float, bool, np.ndarray)), type(o)
            if isinstance(o, np.ndarray):
                assert type(o) is np.ndarray

    walk(body)
    assert set(body["checksums"]) == {"f_s.npy", "plate.mp4"}
    row_bytes = int(np.prod(TAIL)) * 2
    f_s_rec = body["checksums"]["f_s.npy"]
    again = fmt.file_record(d / "f_s.npy", fmt.F_S_HEADER_BYTES, row_bytes)
    assert f_s_rec.keys() == again.keys() and (f_s_rec["crc32"] == again["crc32"]).all() and len(again["crc32"]) == 2
    plate_rec = body["checksums"]["plate.mp4"]
    assert plate_rec["block_bytes"] == fmt.PLATE_BLOCK_BYTES and plate_rec["offset"] == 0
    assert plate_rec["crc32"].tolist() == [zlib.crc32((d / "plate.mp4").read_bytes())]


def test_other_format_version_refused(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=2)
    write_record(d, read_record(d), version=fmt.FORMAT_VERSION + 1)
    with pytest.raises(AvatarError, match=r"cache format 3, this ditto-fast reads format 2.*--force") as e:
        load_avatar("ruby", root=tmp_path)
    assert e.value.exit_code == 5


def test_format_1_cache_refused_as_stale(tmp_path):
    """A cache of format 1 (a bare pickled envelope holding a pickled body) is stale: re-register, exit 5."""
    d, _, _ = write_avatar(tmp_path, n=2)
    body = read_record(d)
    body["format_version"] = 1
    raw = pickle.dumps(body, protocol=5)
    import hashlib

    (d / "avatar.pkl").write_bytes(pickle.dumps(
        {"kind": "ditto-fast-avatar", "format_version": 1, "body_sha256": hashlib.sha256(raw).hexdigest(),
         "body": raw}, protocol=5))
    for verify in ("light", "sampled", "full"):
        with pytest.raises(AvatarError, match=r"has cache format 1, this ditto-fast reads format 2; re-register "
                                              r"with `ditto-fast register SOURCE --name ruby --force`") as e:
            load_avatar("ruby", root=tmp_path, verify=verify)
        assert e.value.exit_code == 5
    rows = reader.list_avatars(tmp_path)
    assert rows[0]["name"] == "ruby" and "cache format 1" in rows[0]["error"]


def test_modified_pickle_refused(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=3)
    body = read_record(d)
    good = (d / "avatar.pkl").read_bytes()
    line = good.split(b"\n", 1)[0]
    body["x_s_info"]["t"][0, 0] += 1.0  # a silent value change, still a valid pickle
    (d / "avatar.pkl").write_bytes(line + b"\n" + pickle.dumps(body, protocol=5))
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl fails its checksum\)"):
        load_avatar("ruby", root=tmp_path)
    # a complete record is required even with a matching CRC
    del body["sc"]
    write_record(d, body)
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl incomplete: 'sc'\)"):
        load_avatar("ruby", root=tmp_path)
    body["sc"] = np.zeros(63, np.float32)         # every field the record requires (the loader reads them all)
    del body["random_weights"]
    write_record(d, body)
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl incomplete: 'random_weights'\)"):
        load_avatar("ruby", root=tmp_path)
    # byte-level damage
    (d / "avatar.pkl").write_bytes(good[: len(good) // 3])
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl fails its checksum\)"):
        load_avatar("ruby", root=tmp_path)
    (d / "avatar.pkl").write_bytes(b"hello\n" + good)
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl is not a ditto-fast avatar file\)"):
        load_avatar("ruby", root=tmp_path)
    (d / "avatar.pkl").unlink()
    with pytest.raises(AvatarError, match="avatar.pkl is missing"):
        load_avatar("ruby", root=tmp_path)


# ----------------------------------------------------------------------------- hardening (issues 15, 40)
@pytest.mark.parametrize("where", ["yaw", "M_c2o", "sc", "eye_open"])
def test_arrays_holding_nan_are_damaged(tmp_path, where, run_cli):
    d, _, _ = write_avatar(tmp_path, n=4)

    def poison(body):
        arr = body["x_s_info"][where] if where in body["x_s_info"] else body[where]
        arr.reshape(-1)[-1] = np.nan if where != "M_c2o" else np.inf

    reseal_record(d, poison)
    with pytest.raises(AvatarError, match=r"damaged .*NaN or infinite"):
        load_avatar("ruby", root=tmp_path)
    r = run_cli(["avatars", "show", "ruby"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 5 and "damaged" in r.stderr and "ditto-fast register" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_avatar_pkl_that_is_no_regular_file_is_refused_without_blocking(tmp_path, run_cli, kind):
    d, _, _ = write_avatar(tmp_path, n=2)
    (d / fmt.PKL_NAME).unlink()
    if kind == "fifo":
        os.mkfifo(d / fmt.PKL_NAME)
    else:
        (d / fmt.PKL_NAME).symlink_to("/dev/null")       # (/dev/zero, read whole, would fill the memory)
    with at_most(20):
        with pytest.raises(AvatarError, match=r"avatar 'ruby' .*avatar\.pkl is a (FIFO|device).*, not a regular file.*--force"):
            load_avatar("ruby", root=tmp_path)
        r = run_cli(["avatars", "show", "ruby"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 5 and "not a regular file" in r.stderr, r.stderr


def test_oversized_avatar_pkl_is_refused_before_reading(tmp_path, monkeypatch):
    d, _, _ = write_avatar(tmp_path, n=2)
    monkeypatch.setattr(fmt, "PKL_MAX_BYTES", 1000)
    with pytest.raises(AvatarError, match=r"avatar\.pkl is [\d.]+ KiB, more than an avatar's record can be"):
        load_avatar("ruby", root=tmp_path)


def test_nonfinite_rows_agrees_with_isfinite():
    rows = np.random.default_rng(1).standard_normal((9, 4, 8)).astype(np.float16)
    rows[0, 0, 0] = np.float16(65504)            # the largest finite value
    rows[1, 0, 0] = np.float16(6e-8)             # a subnormal
    rows[2, 3, 7], rows[3, 1, 1], rows[4, 2, 2], rows[5, 0, 5] = np.nan, np.inf, -np.inf, -np.nan
    want = ~np.isfinite(rows).reshape(9, -1).all(axis=1)
    assert want.tolist() == [False, False, True, True, True, True, False, False, False]
    assert fmt.nonfinite_rows(rows).tolist() == want.tolist()
    assert fmt.nonfinite_rows(rows[:0]).shape == (0,)
