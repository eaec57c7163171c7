"""One server per home: the lock is exclusive between processes and names its holder's pid, a second `serve` on
the home is exit 3 before it loads anything, and a queue on a network filesystem is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from ditto_fast.core.errors import InputError
from ditto_fast.serve import home_lock
from ditto_fast.serve.home_lock import check_local_disk, filesystem_type, lock_home, network_filesystem
from support import free_port, hold


@pytest.fixture()
def held(tmp_path):
    """Another process holding the lock on tmp_path/home/serve."""
    holder = hold(tmp_path / "home" / "serve", "ditto_fast.serve.home_lock:lock_home")
    yield holder
    holder.stdin.close()
    holder.wait(30)


def test_the_lock_is_exclusive_between_processes_and_names_the_holder(tmp_path, held):
    folder = tmp_path / "home" / "serve"
    with pytest.raises(InputError) as e:
        with lock_home(folder):
            pass
    assert f"pid {held.pid}" in str(e.value) and "DITTO_FAST_HOME" in str(e.value)
    held.stdin.close()
    held.wait(30)
    with lock_home(folder) as path:                 # the holder gone, its lock went with it
        assert path.read_text().strip() == str(os.getpid())


def test_a_second_serve_on_the_home_is_exit_3_before_it_loads_anything(tmp_path, held):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DITTO_FAST_HOME": str(tmp_path / "home"),
           "DITTO_FAST_CHECKPOINTS": str(tmp_path / "no-checkpoints")}      # loading them would be exit 6
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "serve", "--device", "cpu", "--port", str(free_port()),
                        "--root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and f"pid {held.pid}" in r.stderr
    assert "another `ditto-fast serve`" in r.stderr


def test_network_filesystems_are_told_from_local_ones():
    assert [network_filesystem(t) for t in (0x6969, 0x517B, 0xFF534D42, 0xFE534D42)] == ["NFS", "SMB", "CIFS", "SMB2"]
    assert [network_filesystem(t) for t in (0xEF53, 0x01021994, 0x9123683E, 0x58465342, None)] == [None] * 5  # ext4,
    #                                                                                   tmpfs, btrfs, xfs; unknown


def test_a_queue_on_a_network_filesystem_is_refused(tmp_path, monkeypatch):
    if sys.platform.startswith("linux"):
        assert filesystem_type(tmp_path) is not None and network_filesystem(filesystem_type(tmp_path)) is None
    check_local_disk(tmp_path)
    monkeypatch.setattr(home_lock, "filesystem_type", lambda folder: 0x6969)
    with pytest.raises(InputError) as e:
        with lock_home(tmp_path / "serve"):
            pass
    assert "NFS" in str(e.value) and "local disk" in str(e.value) and not (tmp_path / "serve" / "server.lock").exists()
