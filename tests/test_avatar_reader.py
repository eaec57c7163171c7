"""Avatar store: write/read round trip, atomic install, every refusal path, list/show/rm."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pickle
import signal
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from ditto_fast.avatar import format as fmt
from ditto_fast.avatar import reader, safe_pickle, store, writer
from ditto_fast.avatar import AvatarWriter, load_avatar
from ditto_fast.core.errors import AvatarError, InputError, UsageError

FP = {"appearance_extractor": "a1b2c3d4e5f60718", "motion_extractor": "0918f7e6d5c4b3a2"}
TAIL = (4, 4, 64, 64)


def make_meta(n: int, rng: np.random.Generator, is_image: bool = False, fingerprints=None) -> fmt.AvatarRecord:
    """Synthetic registration output for n frames (float64 arrays, exp as [n, 21, 3]: the writer conforms them)."""
    return fmt.AvatarRecord(
        source={"path": "/data/anchor clip.mp4", "sha256": "ab" * 32, "fps": 25.0,
                "size": (np.int64(640), 360), "n_frames": n},
        fingerprints=dict(fingerprints or FP),
        crop={"scale": 2.3, "vx": 0.0, "vy": -0.125, "dsize": 512, "flag_do_rot": True},
        x_s_info={
            "pitch": rng.standard_normal((n, 66)), "yaw": rng.standard_normal((n, 66)),
            "roll": rng.standard_normal((n, 66)), "t": rng.standard_normal((n, 3)),
            "exp": rng.standard_normal((n, 21, 3)), "scale": rng.standard_normal((n, 1)),
            "kp": rng.standard_normal((n, 63)),
        },
        M_c2o=rng.standard_normal((n, 3, 3)),
        eye_open=rng.random((n, 2)),
        eye_ball=rng.random((n, 6)),
        sc=rng.standard_normal(63),
        is_image=is_image,
        random_weights=True,
    )


def write_avatar(root: Path, name: str = "ruby", n: int = 5, tail=TAIL, is_image: bool = False,
                 force: bool = False, seed: int = 0, fingerprints=None, allocate: int | None = None):
    """Write a synthetic avatar; return (dir, meta, f_s array written)."""
    rng = np.random.default_rng(seed)
    meta = make_meta(n, rng, is_image, fingerprints)
    f_s_data = rng.standard_normal((n, *tail)).astype(np.float16)
    with AvatarWriter(name, force=force, root=root) as w:
        w.open_f_s(allocate or n, tail)
        for i in range(0, n, 2):  # in batches, as registration does
            batch = f_s_data[i : i + 2]
            w.write_f_s(i, batch if i % 4 else batch.astype(np.float32))
        w.plate_path(is_image).write_bytes(rng.bytes(3000) + name.encode())
        d = w.finish(meta)
    return d, meta, f_s_data


def store_entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "avatars").iterdir())


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


# ----------------------------------------------------------------------------- names, root
@pytest.mark.parametrize("name", ["ruby", "Ruby_2", "a-b", "x" * 64, "0"])
def test_valid_names(name):
    assert store.validate_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "../evil", "a/b", ".tmp-x", "rübÿ", "a.b", "-x", "--force",
                                  "../../../etc"])
def test_invalid_names(name):
    with pytest.raises(UsageError, match="invalid avatar name"):
        store.validate_name(name)


def test_store_root_reads_env_each_call(monkeypatch, tmp_path):
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path / "a"))
    assert store.store_root() == tmp_path / "a"
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path / "b"))
    assert store.store_root() == tmp_path / "b"
    monkeypatch.delenv("DITTO_FAST_HOME")
    assert store.store_root() == Path.home() / ".cache" / "ditto-fast"


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


def test_registration_style_meta(tmp_path):
    """extra is kept as given; fps/size of the cached frames may differ from the source's (rate follows fps)."""
    rng = np.random.default_rng(7)
    meta = make_meta(1, rng, is_image=True)
    meta = dataclasses.replace(
        meta, source={"path": "/x/still.jpg", "sha256": "0" * 64, "fps": 0.0, "size": [1280, 720],
                      "source_size": [4000, 2250], "frames": 1},
        crop={**meta.crop, "params": np.zeros((1, 4))}, extra={"warnings": ["blurry"]}, size=(1280, 720))
    with AvatarWriter("still", root=tmp_path) as w:
        w.open_f_s(1, TAIL)
        w.write_f_s(0, np.full((1, *TAIL), 0.5, np.float32))
        w.plate_path(True).write_bytes(b"png")
        w.finish(meta)
    av = load_avatar("still", root=tmp_path)
    assert av.fps == fmt.CACHE_FPS and av.size == (1280, 720) and av.meta["source"]["fps"] == 0.0
    assert av.meta["extra"] == {"warnings": ["blurry"]}
    assert av.meta["format_version"] == fmt.FORMAT_VERSION and av.meta["rate"] == "25" and av.rate == 25
    assert av.meta["crop"]["params"].shape == (1, 4)
    meta = dataclasses.replace(meta, fps=30.0, size=(64, 32))
    with AvatarWriter("still", root=tmp_path, force=True) as w:
        w.open_f_s(1, TAIL)
        w.write_f_s(0, np.zeros((1, *TAIL), np.float16))
        w.plate_path(True).write_bytes(b"png")
        w.finish(meta)
    av = load_avatar("still", root=tmp_path)
    assert av.fps == 30.0 and av.size == (64, 32) and av.meta["rate"] == "30"


def test_f_s_holds_the_rows_written(tmp_path):
    """open_f_s() takes an upper bound (unknown frame count); the file holds the N rows written."""
    d, _, f_s_data = write_avatar(tmp_path, n=5, allocate=9)
    av = load_avatar(d, verify="full")
    assert av.f_s.shape == (5, *TAIL)
    np.testing.assert_array_equal(np.asarray(av.f_s), f_s_data)
    assert np.load(d / "f_s.npy").shape == (5, *TAIL)


def test_write_f_s_streams_rows_in_order(tmp_path):
    """Rows go to the file in order after the fixed header; the CRC-32 of each row is taken as it is written."""
    d, _, f_s_data = write_avatar(tmp_path, n=7)
    np.testing.assert_array_equal(np.asarray(load_avatar(d, verify="full").f_s), f_s_data)
    rec = load_avatar(d).meta["checksums"]["f_s.npy"]
    raw = (d / "f_s.npy").read_bytes()
    assert rec["offset"] == fmt.F_S_HEADER_BYTES and rec["size"] == len(raw)
    assert rec["block_bytes"] == f_s_data[0].nbytes
    assert raw[fmt.F_S_HEADER_BYTES:] == f_s_data.tobytes()
    assert rec["crc32"].dtype == np.uint32
    assert rec["crc32"].tolist() == [zlib.crc32(row.tobytes()) for row in f_s_data]
    with pytest.raises(IndexError, match="out of range"):
        with AvatarWriter("x", root=tmp_path) as w:
            w.open_f_s(2, TAIL)
            w.write_f_s(0, np.zeros((3, *TAIL), np.float16))
    with pytest.raises(IndexError, match="in order"):
        with AvatarWriter("x", root=tmp_path) as w:
            w.open_f_s(4, TAIL)
            w.write_f_s(1, np.zeros((2, *TAIL), np.float16))
    with pytest.raises(ValueError, match="rows must be"):
        with AvatarWriter("x", root=tmp_path) as w:
            w.open_f_s(4, TAIL)
            w.write_f_s(0, np.zeros((2, 3, 3), np.float16))
    assert store_entries(tmp_path) == ["ruby"]


def test_f_s_buffer_filled_in_place(tmp_path):
    """f_s_buffer() hands out a float16 array to fill; it may be reused for the next batch once written."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((5, *TAIL)).astype(np.float16)
    with AvatarWriter("inplace", root=tmp_path) as w:
        w.open_f_s(5, TAIL)
        for i, j in ((0, 3), (3, 5)):
            rows = w.f_s_buffer(j - i)
            assert rows.shape == (j - i, *TAIL) and rows.dtype == np.float16
            rows[:] = data[i:j]
            w.write_f_s(i, rows)
        w.plate_path(False).write_bytes(b"p")
        d = w.finish(make_meta(5, rng))
    np.testing.assert_array_equal(np.asarray(load_avatar(d, verify="full").f_s), data)


def test_caller_may_reuse_its_array_after_write_f_s(tmp_path):
    """Rows from the caller's own array are written before write_f_s() returns."""
    rng = np.random.default_rng(6)
    data = rng.standard_normal((6, *TAIL)).astype(np.float16)
    scratch = np.empty((2, *TAIL), np.float16)
    with AvatarWriter("reuse", root=tmp_path) as w:
        w.open_f_s(6, TAIL)
        for i in range(0, 6, 2):
            scratch[:] = data[i:i + 2]
            w.write_f_s(i, scratch)
            scratch[:] = 0                       # changed at once: the file must still get the rows
        w.plate_path(False).write_bytes(b"p")
        d = w.finish(make_meta(6, rng))
    np.testing.assert_array_equal(np.asarray(load_avatar(d, verify="full").f_s), data)


def test_write_error_surfaces_and_leaves_nothing(tmp_path, monkeypatch):
    """A failed row write (disk full) is raised by write_f_s() or by finish(); the store stays clean."""
    import errno as _errno
    import io

    class FullDisk(io.FileIO):
        def __init__(self, path, mode, fail_after):
            super().__init__(path, mode)
            self.fail_after = fail_after

        def write(self, data):
            self.fail_after -= 1
            if self.fail_after < 0:
                raise OSError(_errno.ENOSPC, "No space left on device")
            return super().write(data)

    rng = np.random.default_rng(8)
    for fail_after in (1, 3):       # the first batch of rows, or the header finish() writes
        monkeypatch.setattr(writer, "open", lambda path, mode: FullDisk(path, mode, fail_after), raising=False)
        with pytest.raises(OSError, match="No space left"):
            with AvatarWriter("full", root=tmp_path) as w:
                w.open_f_s(4, TAIL)
                for b in range(2):
                    w.write_f_s(2 * b, np.zeros((2, *TAIL), np.float16))
                w.plate_path(False).write_bytes(b"p")
                w.finish(make_meta(4, rng))
        assert store_entries(tmp_path) == []


def test_finish_rejects_bad_meta(tmp_path):
    rng = np.random.default_rng(1)
    meta = dataclasses.replace(make_meta(4, rng), eye_ball=np.zeros((4, 5)))
    with pytest.raises(ValueError, match="eye_ball"):
        with AvatarWriter("bad", root=tmp_path) as w:
            w.open_f_s(4, TAIL)
            w.plate_path(False).write_bytes(b"x")
            w.finish(meta)
    meta = dataclasses.replace(make_meta(4, rng), crop={"fn": print})
    with pytest.raises(TypeError, match="cannot be cached"):
        with AvatarWriter("bad", root=tmp_path) as w:
            w.open_f_s(4, TAIL)
            w.plate_path(False).write_bytes(b"x")
            w.finish(meta)
    with pytest.raises(ValueError, match="plate"):  # plate never written
        with AvatarWriter("bad", root=tmp_path) as w:
            w.open_f_s(4, TAIL)
            w.finish(make_meta(4, rng))
    with pytest.raises(ValueError, match="frames"):  # more frames than f_s holds
        with AvatarWriter("bad", root=tmp_path) as w:
            w.open_f_s(3, TAIL)
            w.plate_path(False).write_bytes(b"x")
            w.finish(make_meta(4, rng))
    with pytest.raises(RuntimeError, match="without finish"):
        with AvatarWriter("bad", root=tmp_path) as w:
            w.open_f_s(3, TAIL)
    assert store_entries(tmp_path) == []


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


# ----------------------------------------------------------------------------- safe pickle
class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_safe_pickle_refuses_malicious_without_executing(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"x": np.zeros(3), "evil": _Evil(marker)}, protocol=5)
    with pytest.raises(AvatarError, match=r"disallowed object (posix|os)\.system"):
        safe_pickle.loads(data)
    assert not marker.exists()
    pickle.loads(data)  # the same bytes really do run the command when unrestricted
    assert marker.exists()


@pytest.mark.parametrize("obj", [eval, getattr, __import__, Path("/x")])
def test_safe_pickle_refuses_other_globals(obj):
    with pytest.raises(AvatarError, match="disallowed object"):
        safe_pickle.loads(pickle.dumps(obj, protocol=2))


def test_safe_pickle_refuses_ordered_dict_and_object_arrays():
    from collections import OrderedDict

    with pytest.raises(AvatarError, match="collections.OrderedDict"):
        safe_pickle.loads(pickle.dumps(OrderedDict(a=1)))
    with pytest.raises(AvatarError, match="object array"):
        safe_pickle.loads(pickle.dumps(np.array([1, "a"], dtype=object)))


@pytest.mark.parametrize("protocol", [4, 5])  # cache files use 5
def test_safe_pickle_accepts_arrays_and_containers(protocol):
    obj = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "f": np.zeros((3, 2), order="F"),
           "s": np.float32(1.5), "i": np.int64(3), "c": 1 + 2j, "set": {1, 2}, "fs": frozenset({3}),
           "t": (1, "x", None, True, b"by"), "l": [1.0, [2]], "u8": np.zeros(4, np.uint8)}
    out = safe_pickle.loads(pickle.dumps(obj, protocol=protocol))
    assert out.keys() == obj.keys()
    np.testing.assert_array_equal(out["a"], obj["a"])
    np.testing.assert_array_equal(out["f"], obj["f"])
    assert out["s"] == np.float32(1.5) and out["c"] == 1 + 2j and out["set"] == {1, 2}
    assert out["t"] == obj["t"] and out["l"] == obj["l"]


def test_safe_pickle_damaged_bytes():
    data = pickle.dumps({"a": np.zeros(100)}, protocol=5)
    with pytest.raises(AvatarError, match="damaged"):
        safe_pickle.loads(data[: len(data) // 2])


# ----------------------------------------------------------------------------- refusals
def test_missing_avatar_lists_existing(tmp_path):
    write_avatar(tmp_path, name="ruby", n=2)
    write_avatar(tmp_path, name="amber", n=2)
    with pytest.raises(AvatarError, match=r"'nobody' not found .*existing: amber, ruby.*ditto-fast register") as e:
        load_avatar("nobody", root=tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(AvatarError, match="existing: none"):
        load_avatar("nobody", root=tmp_path / "empty")


def _read_record(d: Path) -> dict:
    return safe_pickle.loads((d / "avatar.pkl").read_bytes().split(b"\n", 1)[1])


def _write_record(d: Path, body: dict, version: int | None = None, crc: int | None = None) -> None:
    """Write avatar.pkl with its format line; version and crc default to the current format and the true CRC-32."""
    raw = pickle.dumps(body, protocol=5)
    version = fmt.FORMAT_VERSION if version is None else version
    crc = zlib.crc32(raw) if crc is None else crc
    (d / "avatar.pkl").write_bytes(b"ditto-fast-avatar format %d crc32 %08x\n" % (version, crc) + raw)


def test_other_format_version_refused(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=2)
    _write_record(d, _read_record(d), version=fmt.FORMAT_VERSION + 1)
    with pytest.raises(AvatarError, match=r"cache format 3, this ditto-fast reads format 2.*--force") as e:
        load_avatar("ruby", root=tmp_path)
    assert e.value.exit_code == 5


def test_format_1_cache_refused_as_stale(tmp_path):
    """A cache of format 1 (a bare pickled envelope holding a pickled body) is stale: re-register, exit 5."""
    d, _, _ = write_avatar(tmp_path, n=2)
    body = _read_record(d)
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


def test_modified_pickle_refused(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=3)
    body = _read_record(d)
    good = (d / "avatar.pkl").read_bytes()
    line = good.split(b"\n", 1)[0]
    body["x_s_info"]["t"][0, 0] += 1.0  # a silent value change, still a valid pickle
    (d / "avatar.pkl").write_bytes(line + b"\n" + pickle.dumps(body, protocol=5))
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl fails its checksum\)"):
        load_avatar("ruby", root=tmp_path)
    # a complete record is required even with a matching CRC
    del body["sc"]
    _write_record(d, body)
    with pytest.raises(AvatarError, match=r"damaged \(avatar.pkl incomplete: 'sc'\)"):
        load_avatar("ruby", root=tmp_path)
    body["sc"] = np.zeros(63, np.float32)         # every field the record requires (the loader reads them all)
    del body["random_weights"]
    _write_record(d, body)
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


def test_malicious_pickle_refused_by_load_avatar(tmp_path):
    """A pickle that would run code is refused without running it, even with a correct format line and CRC."""
    d, _, _ = write_avatar(tmp_path, n=2)
    marker = tmp_path / "pwned"
    _write_record(d, {"n_frames": 2, "evil": _Evil(marker)})
    with pytest.raises(AvatarError, match=r"disallowed object .*system.*--name ruby --force"):
        load_avatar("ruby", root=tmp_path)
    assert not marker.exists()
    # a bare pickle (what format 1 looked like) is refused as stale before it is unpickled at all
    (d / "avatar.pkl").write_bytes(pickle.dumps({"kind": "ditto-fast-avatar", "x": _Evil(marker)}))
    with pytest.raises(AvatarError, match="cache format 1"):
        load_avatar("ruby", root=tmp_path)
    assert not marker.exists()


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
    body = _read_record(d)
    body["checksums"]["plate.mp4"] = fmt.file_record(d / "plate.mp4")
    _write_record(d, body)
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


# ----------------------------------------------------------------------------- atomic writing
def test_existing_name_needs_force(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=2, seed=1)
    before = snapshot(d)
    with pytest.raises(UsageError, match="avatar ruby exists in .*; use --force to replace it"):
        write_avatar(tmp_path, n=3, seed=2)
    assert snapshot(d) == before
    assert store_entries(tmp_path) == ["ruby"]


def test_concurrent_writer_loses_cleanly(tmp_path):
    """Two writers without force: the second to finish is refused and leaves nothing behind."""
    rng = np.random.default_rng(3)
    with pytest.raises(UsageError, match="exists"):
        with AvatarWriter("ruby", root=tmp_path) as w:
            w.open_f_s(2, TAIL)
            w.write_f_s(0, np.zeros((2, *TAIL), np.float16))
            w.plate_path(False).write_bytes(b"p")
            write_avatar(tmp_path, n=2, seed=4)  # another process wins the race
            w.finish(make_meta(2, rng))
    assert store_entries(tmp_path) == ["ruby"]
    assert load_avatar("ruby", root=tmp_path, verify="full").n_frames == 2


def test_force_replaces(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=2, seed=1)
    fd = os.open(d, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)       # a reader holding the old avatar: the replacement waits for it
    released = []

    def release():
        released.append(1)
        os.close(fd)

    import threading

    threading.Timer(0.3, release).start()
    d, _, f_s_new = write_avatar(tmp_path, n=4, seed=2, force=True)
    assert released
    av = load_avatar("ruby", root=tmp_path, verify="full")
    assert av.n_frames == 4
    np.testing.assert_array_equal(np.asarray(av.f_s), f_s_new)
    assert store_entries(tmp_path) == ["ruby"]


def test_rename_aside_rolls_back(tmp_path, monkeypatch):
    """A failure moving the new avatar in (after the old one was renamed aside) puts the old one back."""
    d, _, _ = write_avatar(tmp_path, n=2, seed=1)
    before = snapshot(d)
    real_rename = os.rename
    calls = []

    def flaky_rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if Path(src).name.startswith(".tmp-ruby-") and Path(dst).name == "ruby" and len(calls) > 1:
            raise KeyboardInterrupt  # killed between the two renames
        return real_rename(src, dst)

    monkeypatch.setattr(writer.os, "rename", flaky_rename)
    with pytest.raises(KeyboardInterrupt):
        write_avatar(tmp_path, n=3, seed=2, force=True)
    monkeypatch.setattr(writer.os, "rename", real_rename)
    assert [c[1] for c in calls][1:] == [calls[1][1], "ruby", "ruby"]  # aside, new in (killed), old back
    assert calls[1][0] == "ruby" and calls[1][1].startswith(".tmp-old-ruby-")
    assert snapshot(d) == before
    assert store_entries(tmp_path) == ["ruby"]


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("force", [False, True])
def test_exception_inside_writer_leaves_store_unchanged(tmp_path, exc_type, force):
    d, _, _ = write_avatar(tmp_path, n=2, seed=1)
    before = snapshot(d)
    name = "ruby" if force else "newone"
    with pytest.raises(exc_type):
        with AvatarWriter(name, force=force, root=tmp_path) as w:
            assert w.tmp_dir.name.startswith(f".tmp-{name}-") and w.tmp_dir.parent == tmp_path / "avatars"
            w.open_f_s(3, TAIL)
            w.write_f_s(0, np.ones((2, *TAIL), np.float16))
            w.plate_path(False).write_bytes(b"partial")
            raise exc_type("interrupted")
    assert store_entries(tmp_path) == ["ruby"]
    assert snapshot(d) == before
    load_avatar("ruby", root=tmp_path, verify="full")
    with pytest.raises(AvatarError):
        load_avatar("newone", root=tmp_path)

    # an interrupt raised from inside finish() (e.g. while checksumming the plate) is just as clean
    def interrupted(*a, **k):
        raise exc_type("during finish")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer, "file_record", interrupted)
        with pytest.raises(exc_type):
            write_avatar(tmp_path, name=name, n=3, seed=6, force=force)
    assert store_entries(tmp_path) == ["ruby"]
    assert snapshot(d) == before


def test_unwritable_store_under_a_file(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with pytest.raises(InputError, match=r"avatar store .*not_a_dir/avatars cannot be created.*DITTO_FAST_HOME"):
        with AvatarWriter("ruby", root=blocker):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_store_chmod(tmp_path):
    adir = tmp_path / "avatars"
    adir.mkdir()
    adir.chmod(0o555)
    try:
        with pytest.raises(InputError, match="not writable"):
            with AvatarWriter("ruby", root=tmp_path):
                pass
    finally:
        adir.chmod(0o755)


# ----------------------------------------------------------------------------- stale temporaries
def test_stale_tmp_cleaned_and_never_listed(tmp_path):
    write_avatar(tmp_path, n=2)
    adir = tmp_path / "avatars"
    old, fresh, held = adir / ".tmp-ruby-old", adir / ".tmp-ruby-fresh", adir / ".tmp-x-held"
    for p in (old, fresh, held):
        p.mkdir()
        (p / "f_s.npy").write_bytes(b"junk")
    past = time.time() - 2 * store.STALE_TMP_AGE_S
    os.utime(old, (past, past))
    os.utime(held, (past, past))
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer still working on it
    try:
        before = store_entries(tmp_path)
        rows = reader.list_avatars(tmp_path)
        assert store_entries(tmp_path) == before          # a listing changes nothing, stale or not
        write_avatar(tmp_path, name="other", n=2)         # registering cleans what nobody holds
        assert not old.exists() and fresh.exists() and held.exists()
    finally:
        os.close(fd)
    assert [r["name"] for r in rows] == ["ruby"]
    # once its writer is gone, the next registration removes it too
    write_avatar(tmp_path, name="third", n=2)
    assert not held.exists() and fresh.exists()


# ----------------------------------------------------------------------------- list / show / rm
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


def test_load_maps_features(tmp_path):
    """Opening a 200-frame avatar (small feature tail) maps f_s instead of reading it
    (its time is measured by scripts/bench/bench_avatar_load.py)."""
    write_avatar(tmp_path, name="long", n=200, tail=(2, 2, 64, 64))
    load_avatar("long", root=tmp_path)  # warm
    av = load_avatar("long", root=tmp_path)
    assert av.n_frames == 200 and isinstance(av.f_s, np.memmap)


# ----------------------------------------------------------------------------- hardening (issue 15)
def _reseal(d: Path, change) -> None:
    """Rewrite avatar.pkl with `change(body)` applied and a fresh, valid CRC-32 (a deliberate edit, not rot)."""
    raw = (d / fmt.PKL_NAME).read_bytes().partition(b"\n")[2]
    body = pickle.loads(raw)
    change(body)
    (d / fmt.PKL_NAME).write_bytes(fmt.encode_pkl(body))


@pytest.mark.parametrize("where", ["yaw", "M_c2o", "sc", "eye_open"])
def test_arrays_holding_nan_are_damaged(tmp_path, where, run_cli):
    d, _, _ = write_avatar(tmp_path, n=4)

    def poison(body):
        arr = body["x_s_info"][where] if where in body["x_s_info"] else body[where]
        arr.reshape(-1)[-1] = np.nan if where != "M_c2o" else np.inf

    _reseal(d, poison)
    with pytest.raises(AvatarError, match=r"damaged .*NaN or infinite"):
        load_avatar("ruby", root=tmp_path)
    r = run_cli(["avatars", "show", "ruby"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 5 and "damaged" in r.stderr and "ditto-fast register" in r.stderr, r.stderr


def test_features_holding_nan_are_damaged(tmp_path):
    d, _, _ = write_avatar(tmp_path, n=4)
    f_s = np.load(d / fmt.F_S_NAME, mmap_mode="r+")
    f_s[3, 0, 0, 0, 0] = np.nan                       # the last frame, which a sampled check reads
    f_s.flush()
    del f_s
    rec = fmt.file_record(d / fmt.F_S_NAME, fmt.F_S_HEADER_BYTES, int(np.prod(TAIL)) * 2)
    _reseal(d, lambda body: body["checksums"][fmt.F_S_NAME].update(crc32=rec["crc32"]))
    assert load_avatar("ruby", root=tmp_path, verify="light").n_frames == 4      # not read: not checked
    with pytest.raises(AvatarError, match="f_s.npy holds NaN or infinite values at frame 3"):
        load_avatar("ruby", root=tmp_path)


def test_rm_and_force_on_a_symlinked_avatar_leave_nothing_behind(tmp_path):
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    target, _, _ = write_avatar(elsewhere, name="ruby", n=2)
    keep = snapshot(target)
    (home / "avatars").mkdir(parents=True)
    (home / "avatars" / "ruby").symlink_to(target)
    assert load_avatar("ruby", root=home).n_frames == 2
    store.remove_avatar("ruby", root=home)
    assert store_entries(home) == [] and snapshot(target) == keep          # link gone, target untouched
    (home / "avatars" / "ruby").symlink_to(target)
    write_avatar(home, name="ruby", n=3, force=True)
    assert store_entries(home) == ["ruby"] and not (home / "avatars" / "ruby").is_symlink()
    assert load_avatar("ruby", root=home).n_frames == 3 and snapshot(target) == keep
    (home / "avatars" / "amber").symlink_to(tmp_path / "nowhere")          # a dangling link is an existing name
    with pytest.raises(UsageError, match="--force"):
        write_avatar(home, name="amber", n=1)
    write_avatar(home, name="amber", n=1, force=True)
    assert store_entries(home) == ["amber", "ruby"] and load_avatar("amber", root=home).n_frames == 1


def test_names_that_are_paths_or_options_are_refused(tmp_path, run_cli):
    write_avatar(tmp_path, n=2)
    env = {"DITTO_FAST_HOME": str(tmp_path)}
    for args in (["avatars", "show", "../../../etc"], ["avatars", "show", "--", "-x"], ["avatars", "rm", "--", "-x"],
                 ["avatars", "show", str(tmp_path / "avatars" / "ruby")], ["avatars", "rm", "../avatars/ruby"]):
        r = run_cli(args, env)
        assert r.returncode == 2 and "invalid avatar name" in r.stderr, (args, r.stderr)
    assert store_entries(tmp_path) == ["ruby"]


# ----------------------------------------------------------------------------- hardening (issue 40)
@contextlib.contextmanager
def _at_most(seconds: float):
    """Fail the test (instead of hanging it) if the block runs longer than `seconds`."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _reference_bomb(levels: int, width: int) -> list:
    """A list nested `levels` deep whose every level holds `width` references to the one below: a few bytes
    pickled, width ** levels entries walked as a tree."""
    a: list = []
    for _ in range(levels):
        a = [a] * width
    return a


def _cycle() -> list:
    a: list = [1]
    a.append({"x": a})
    return a


@pytest.mark.parametrize("obj, why", [
    (_reference_bomb(60, 2), "nested more than"),            # the probe's bomb: 2^60 paths
    (_reference_bomb(5, 1000), "more than 100,000 entries"),  # shallow and wide: 10^15 paths
    ({"source": {"k": _reference_bomb(3, 50)}}, "more than 100,000 entries"),
    (_cycle(), "refers to itself"),
])
def test_safe_pickle_refuses_reference_bombs_at_once(obj, why):
    data = pickle.dumps(obj, protocol=5)
    assert len(data) < 100_000
    with _at_most(10), pytest.raises(AvatarError, match=why):
        safe_pickle.loads(data)


def test_safe_pickle_accepts_harmless_sharing():
    shared = np.arange(3.0)
    body = {"a": shared, "b": [shared, (), ()], "c": ((), "x"), "d": [[1, 2]] * 100}
    out = safe_pickle.loads(pickle.dumps(body, protocol=5))
    assert out["d"][99] == [1, 2] and out["b"][0] is out["a"]


def test_reference_bomb_in_avatar_pkl_is_refused(tmp_path, run_cli):
    d, _, _ = write_avatar(tmp_path, n=2)
    _reseal(d, lambda body: body["source"].update(notes=_reference_bomb(60, 2)))
    env = {"DITTO_FAST_HOME": str(tmp_path)}
    with _at_most(20):
        with pytest.raises(AvatarError, match=r"avatar\.pkl is not an avatar record .*ditto-fast register"):
            load_avatar("ruby", root=tmp_path)
        r = run_cli(["avatars", "show", "ruby"], env)
        assert r.returncode == 5 and r.stderr.count("\n") == 1 and "not an avatar record" in r.stderr, r.stderr
        r = run_cli(["avatars"], env)
        assert "ruby" in r.stdout and "not an avatar record" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_avatar_pkl_that_is_no_regular_file_is_refused_without_blocking(tmp_path, run_cli, kind):
    d, _, _ = write_avatar(tmp_path, n=2)
    (d / fmt.PKL_NAME).unlink()
    if kind == "fifo":
        os.mkfifo(d / fmt.PKL_NAME)
    else:
        (d / fmt.PKL_NAME).symlink_to("/dev/null")       # (/dev/zero, read whole, would fill the memory)
    with _at_most(20):
        with pytest.raises(AvatarError, match=r"avatar 'ruby' .*avatar\.pkl is a (FIFO|device).*, not a regular file.*--force"):
            load_avatar("ruby", root=tmp_path)
        r = run_cli(["avatars", "show", "ruby"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 5 and "not a regular file" in r.stderr, r.stderr


def test_oversized_avatar_pkl_is_refused_before_reading(tmp_path, monkeypatch):
    d, _, _ = write_avatar(tmp_path, n=2)
    monkeypatch.setattr(fmt, "PKL_MAX_BYTES", 1000)
    with pytest.raises(AvatarError, match=r"avatar\.pkl is [\d.]+ KiB, more than an avatar's record can be"):
        load_avatar("ruby", root=tmp_path)


@pytest.mark.parametrize("fname", [fmt.F_S_NAME, "plate.mp4"])
def test_features_or_plate_that_are_no_regular_file_are_refused(tmp_path, fname):
    d, _, _ = write_avatar(tmp_path, n=2)
    (d / fname).unlink()
    os.mkfifo(d / fname)
    with _at_most(20), pytest.raises(AvatarError, match=f"{fname} is not a regular file"):
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
        _reseal(d, lambda body: body["checksums"][fmt.F_S_NAME].update(crc32=rec["crc32"]))


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


def test_names_differing_only_in_case_are_refused(tmp_path, run_cli):
    write_avatar(tmp_path, name="ruby", n=2)
    keep = snapshot(tmp_path / "avatars" / "ruby")
    for force in (False, True):
        with pytest.raises(UsageError, match=r"avatar name Ruby differs from the existing avatar ruby .* only in "
                                             r"case.*--name ruby --force") as e:
            write_avatar(tmp_path, name="Ruby", n=3, force=force)
        assert "\n" not in str(e.value)
    assert store_entries(tmp_path) == ["ruby"] and snapshot(tmp_path / "avatars" / "ruby") == keep
    write_avatar(tmp_path, name="ruby", n=3, force=True)                 # the same name is replaced as before
    write_avatar(tmp_path, name="ruby_2", n=1)
    assert store_entries(tmp_path) == ["ruby", "ruby_2"] and load_avatar("ruby", root=tmp_path).n_frames == 3


def test_a_case_twin_registered_meanwhile_is_refused_at_install(tmp_path):
    with pytest.raises(UsageError, match="only in case"):
        with AvatarWriter("Amber", root=tmp_path) as w:
            write_avatar(tmp_path, name="amber", n=1)                    # another registration wins the race
            w.open_f_s(1, TAIL)
            w.write_f_s(0, np.zeros((1, *TAIL), np.float16))
            w.plate_path(False).write_bytes(b"x" * 100)
            w.finish(make_meta(1, np.random.default_rng(0)))
    assert store_entries(tmp_path) == ["amber"]
