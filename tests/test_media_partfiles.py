"""Hidden temporary files: a killed writer's leftovers are removed by the next writer, a live writer's never."""

from __future__ import annotations

import fcntl
import os

import pytest

from ditto_fast.batch.jobs import Job, write_report
from ditto_fast.media.partfiles import create_locked, remove_stale


def test_only_files_nobody_holds_are_removed(tmp_path):
    live, fd = create_locked(tmp_path / "other.mp4", "part", ".mp4")
    dead = tmp_path / ".out.mp4.partabcd1234.mp4"                # as a killed writer leaves it: nobody holds it
    dead.write_bytes(b"half a video")
    alike = [tmp_path / ".out.mp4.part", tmp_path / "out.mp4.partabcd1234.mp4", tmp_path / ".x.partABCD1234"]
    for p in alike:                                         # not our names: left alone
        p.write_text("user's")
    try:
        assert remove_stale(tmp_path, "part") == [dead]
        assert live.exists() and all(p.exists() for p in alike)
        other = os.open(live, os.O_RDONLY)
        try:                                                # the creator's descriptor holds the lock
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        os.close(fd)
    assert remove_stale(tmp_path, "part") == [live]


def test_a_killed_batchs_report_temporary_goes_with_the_next_report(tmp_path):
    stale = tmp_path / ".report.json.tmpq1w2e3r4"
    stale.write_text('{"jobs": [')
    write_report(tmp_path / "report.json", [Job(0, named={"avatar": "ruby"}, status="done")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
