"""The avatar cache: opened once, opened again when any of the avatar's files changes (a file cut short in place
is refused by name instead of read through a memory map that ends early: SIGBUS)."""

from __future__ import annotations

import os
import shutil

import pytest

from ditto_fast.core.errors import AvatarError
from ditto_fast.engine.open_avatars import OpenAvatars


@pytest.fixture
def store(video_avatar, tmp_path, monkeypatch, tiny_checkpoints):
    from ditto_fast.checkpoints import find_checkpoints

    shutil.copytree(video_avatar, tmp_path / "avatars" / "anchor")
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path))
    return tmp_path / "avatars" / "anchor", OpenAvatars(find_checkpoints(tiny_checkpoints))


def test_an_avatar_is_opened_once_and_again_when_any_file_changes(store):
    folder, avatars = store
    first = avatars.get("anchor")
    assert avatars.get("anchor") is first and avatars.signature("anchor") is not None
    plate = next(p for p in folder.iterdir() if p.name.startswith("plate"))
    os.utime(plate, ns=(0, 0))                  # the plate rewritten (its time changes): opened again
    assert avatars.get("anchor") is not first


def test_features_cut_short_in_place_are_refused_by_name(store):
    folder, avatars = store
    avatars.get("anchor")
    os.truncate(folder / "f_s.npy", 1_000_000)  # what `truncate -s`, or `cp` over it while it is read, leaves
    with pytest.raises(AvatarError, match=r"f_s.npy has 1000000 bytes") as e:
        avatars.get("anchor")
    assert e.value.exit_code == 5
