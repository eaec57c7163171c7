"""The avatar store: names, its root, case twins, an unwritable store, stale temporaries, removal."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import numpy as np
import pytest

from ditto_fast.avatar import AvatarWriter, load_avatar, reader, store
from ditto_fast.core.errors import InputError, UsageError
from support import TAIL, make_meta, snapshot, store_entries, write_avatar


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


def test_names_that_are_paths_or_options_are_refused(tmp_path, run_cli):
    write_avatar(tmp_path, n=2)
    env = {"DITTO_FAST_HOME": str(tmp_path)}
    for args in (["avatars", "show", "../../../etc"], ["avatars", "show", "--", "-x"], ["avatars", "rm", "--", "-x"],
                 ["avatars", "show", str(tmp_path / "avatars" / "ruby")], ["avatars", "rm", "../avatars/ruby"]):
        r = run_cli(args, env)
        assert r.returncode == 2 and "invalid avatar name" in r.stderr, (args, r.stderr)
    assert store_entries(tmp_path) == ["ruby"]


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


# ----------------------------------------------------------------------------- the store's directory
def test_unwritable_store_under_a_file(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with pytest.raises(InputError, match=r"avatar store .*not_a_dir/avatars cannot be created.*DITTO_FAST_HOME"):
        with AvatarWriter("ruby", root=blocker):
            pass


_WRITER = """import sys
from pathlib import Path
from ditto_fast.avatar import AvatarWriter
from ditto_fast.core.errors import InputError
try:
    with AvatarWriter("ruby", root=Path(sys.argv[1])):
        pass
except InputError as e:
    print(e)
    sys.exit(e.exit_code)
"""


def test_unwritable_store_chmod(tmp_path):
    """A store folder without write permission is refused in words; as root (CI runs as root) the writer runs without
    the capabilities that let root write anywhere, as any other user would."""
    import subprocess
    import sys

    from support import without_root_powers

    adir = tmp_path / "avatars"
    adir.mkdir()
    adir.chmod(0o555)
    root = os.geteuid() == 0
    try:
        res = subprocess.run([sys.executable, "-c", _WRITER, str(tmp_path)], capture_output=True, text=True,
                             timeout=120, preexec_fn=without_root_powers if root else None)
    finally:
        adir.chmod(0o755)
    if res.returncode == 99:
        pytest.skip("root here cannot drop CAP_DAC_OVERRIDE (no CAP_SETPCAP), so every folder is writable to it")
    assert res.returncode == InputError.exit_code and "not writable" in res.stdout, (res.stdout, res.stderr)
    assert list(adir.iterdir()) == []


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


# ----------------------------------------------------------------------------- removal
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
