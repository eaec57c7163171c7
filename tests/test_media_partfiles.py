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


def test_a_ctrl_c_as_the_part_file_appears_leaves_nothing(tmp_path, monkeypatch):
    """The race `render` lost under a loaded machine: SIGINT between the part file's creation and its writer keeping
    its name left `.x.mp4.part*.mp4` behind (exit 130)."""
    import signal

    import ditto_fast.encoding.writer as writer

    made = []

    def interrupted_create(target, tag, suffix=""):
        made.append(create_locked(target, tag, suffix))
        if tag == "part":
            os.kill(os.getpid(), signal.SIGINT)     # the Ctrl-C lands as the part file has just appeared
        return made[-1]
    monkeypatch.setattr(writer, "create_locked", interrupted_create)
    with pytest.raises(KeyboardInterrupt):
        writer.VideoWriter(tmp_path / "x.mp4", (64, 64), 25)
    assert [p.name[len(".x.mp4."):][:4] for p, _ in made] == ["prob", "part"] and list(tmp_path.iterdir()) == []


def test_signals_held_come_when_the_block_ends():
    import signal

    from ditto_fast.media.partfiles import signals_held

    inside = False
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            inside = True
    assert inside
