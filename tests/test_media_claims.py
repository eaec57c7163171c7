"""Output claims: one writer per output path, across real processes; a killed claimer blocks nobody."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ditto_fast.core.errors import InputError
from ditto_fast.media.claims import check_unclaimed, claim_file, claimed
from support import busy_message, hold

def test_a_claim_is_held_for_the_block_and_removed_after_it(tmp_path):
    out = tmp_path / "news.mp4"
    (tmp_path / "via").symlink_to(tmp_path)
    with claimed(out) as claim:
        assert claim == claim_file(out) == tmp_path / ".news.mp4.claim"
        assert claim.read_text() == f"{os.getpid()}\n"
        with claimed(tmp_path / "via" / "news.mp4"):      # the same output again in this process: re-entrant
            check_unclaimed(out)
        assert claim.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["via"]


def test_another_processs_claim_refuses_with_its_pid_and_ends_with_it(tmp_path):
    out = tmp_path / "news.mp4"
    other = hold(out)
    try:
        for attempt in (check_unclaimed, lambda p: claimed(p).__enter__()):
            with pytest.raises(InputError) as e:
                attempt(out)
            assert str(e.value) == busy_message(out, other.pid)
        assert claim_file(out).read_text() == f"{other.pid}\n"       # left to its owner
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    assert list(tmp_path.iterdir()) == []                           # the owner removed it when done
    with claimed(out):
        pass


def test_a_killed_claimer_blocks_nobody(tmp_path):
    def killed(target: Path) -> None:
        p = hold(target)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        assert claim_file(target).read_text() == f"{p.pid}\n"           # left behind, its lock gone with it

    out = tmp_path / "news.mp4"
    killed(out)
    check_unclaimed(out)                                            # nobody holds it: removed
    assert list(tmp_path.iterdir()) == []
    killed(out)
    with claimed(out):                                              # taken over
        assert claim_file(out).read_text() == f"{os.getpid()}\n"
    killed(tmp_path / "sport.mov")
    with claimed(out):                                              # the folder's other stale claims go too
        assert [p.name for p in tmp_path.iterdir()] == [".news.mp4.claim"]
    assert list(tmp_path.iterdir()) == []


def test_files_that_only_look_like_claims_are_left_alone(tmp_path):
    alike = {".notes.claim": "mine", ".x.mp4.claim": "not a pid", ".y.wav.claim": "1"}
    for name, text in alike.items():
        (tmp_path / name).write_text(text)
    check_unclaimed(tmp_path / "x.mp4")
    with claimed(tmp_path / "z.mp4"):
        pass
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == alike
