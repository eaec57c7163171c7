"""scripts/nightly_example.sh under cron's bare PATH: it finds this checkout's .venv, or says what to do (exit 2)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "nightly_example.sh"
BARE_PATH = "/usr/bin:/bin"          # what cron gives a job: no virtual environment on it


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DITTO_FAST", "VIRTUAL_ENV")}
    return {**env, "PATH": BARE_PATH, "DITTO_FAST_HOME": str(tmp_path / "home")}


@pytest.mark.slow
def test_the_nightly_script_finds_the_checkouts_venv(tmp_path, clips):
    if not (REPO / ".venv" / "bin" / "ditto-fast").exists():
        pytest.skip("no .venv in this checkout (scripts/setup/setup_env.sh makes it)")
    if shutil.which("ditto-fast", path=BARE_PATH):
        pytest.skip("a ditto-fast is installed on the bare PATH itself")
    (tmp_path / "in").mkdir()
    shutil.copy(clips[0], tmp_path / "in" / "a.wav")
    env = {**_env(tmp_path), "DITTO_FAST_CHECKPOINTS": str(tmp_path / "none")}
    r = subprocess.run(["bash", SCRIPT, "nobody", tmp_path / "in", tmp_path / "out"], capture_output=True, text=True,
                       env=env, timeout=300)
    # it ran ditto-fast, which stops at once at the checkpoints named (none there)
    assert r.returncode == 6 and "command not found" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"ditto-fast: error: {tmp_path / 'none'}: checkpoint directory not found"), r.stderr


def test_without_a_venv_or_path_it_says_what_to_do(tmp_path):
    copy = tmp_path / "checkout" / "scripts"
    copy.mkdir(parents=True)
    shutil.copy(SCRIPT, copy / SCRIPT.name)
    r = subprocess.run(["bash", copy / SCRIPT.name, "ruby", tmp_path, tmp_path / "out"], capture_output=True,
                       text=True, env=_env(tmp_path), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ditto-fast is neither on PATH nor in" in r.stderr and "DITTO_FAST=" in r.stderr
    assert not (tmp_path / "out").exists()
