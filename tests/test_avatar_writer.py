"""Installing an avatar: f_s rows streamed in order, the record checked, the atomic install with and without --force."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from ditto_fast.avatar import AvatarWriter, load_avatar, writer
from ditto_fast.avatar import format as fmt
from ditto_fast.core.errors import AvatarError, UsageError
from support import TAIL, make_meta, snapshot, store_entries, write_avatar


# ----------------------------------------------------------------------------- streaming f_s
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


# ----------------------------------------------------------------------------- atomic install
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
