"""scripts/setup/setup_env.sh on a host without a supported Python: one line saying what to install, exit 2.

The host is faked: a copy of the script in an empty repo, and a PATH holding only shell scripts that answer
as Python 3.13 (and a pyenv-style shim of an absent version that fails), so nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")

FAKE_PYTHON = """#!/bin/sh
# answers as Python {version}, as `python -c` and `--version` would
case "$1" in
  --version) echo "Python {version}.1" ;;
  -c) echo "{version}" ;;
  *) echo "fake python: $*" >&2; exit 1 ;;
esac
"""
FAILING_SHIM = """#!/bin/sh
echo "pyenv: $(basename "$0"): command not found" >&2
exit 127
"""


def fake_host(tmp_path: Path, pythons: dict[str, str]) -> tuple[Path, Path]:
    """(repo copy, bin dir) with `pythons` {name: version or "shim"} as the only interpreters on PATH."""
    repo = tmp_path / "repo"
    (repo / "scripts" / "setup").mkdir(parents=True)
    for name in ("scripts/setup/setup_env.sh", "scripts/setup/python_pick.sh", "scripts/setup/stack-pinned.txt",
                 "pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, repo / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, version in pythons.items():
        exe = bin_dir / name
        exe.write_text(FAILING_SHIM if version == "shim" else FAKE_PYTHON.format(version=version))
        exe.chmod(0o755)
    (bin_dir / "rm").symlink_to(shutil.which("rm"))      # the one other tool the script runs before installing
    return repo, bin_dir


def run_setup(repo: Path, bin_dir: Path, python: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "HOME": str(repo)}
    if python:
        env["PYTHON"] = python
    return subprocess.run([BASH, str(repo / "scripts" / "setup" / "setup_env.sh")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_only_python_3_13_says_what_to_install(tmp_path):
    repo, bin_dir = fake_host(tmp_path, {"python3": "3.13", "python3.13": "3.13", "python3.12": "shim"})
    res = run_setup(repo, bin_dir)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "no Python 3.10-3.12 found (python3 is 3.13)" in lines[0]
    assert "install python3.12" in lines[0] and "PYTHON=" in lines[0]
    assert not (repo / ".venv").exists()
    assert res.stdout == ""


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_no_python_at_all_says_what_to_install(tmp_path):
    repo, bin_dir = fake_host(tmp_path, {})
    res = run_setup(repo, bin_dir)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("[setup] no Python 3.10-3.12 found;")


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_python_env_var_out_of_range_is_named(tmp_path):
    repo, bin_dir = fake_host(tmp_path, {"python3.13": "3.13", "python3.11": "3.11"})
    res = run_setup(repo, bin_dir, python=str(bin_dir / "python3.13"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert f"PYTHON={bin_dir / 'python3.13'} is 3.13" in res.stderr   # PYTHON= wins over python3.11 on the PATH


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_a_supported_interpreter_is_chosen_over_python3(tmp_path):
    """python3 is 3.13 but python3.11 is there: 3.11 is taken (the fake cannot make a venv: one line on that)."""
    repo, bin_dir = fake_host(tmp_path, {"python3": "3.13", "python3.11": "3.11"})
    res = run_setup(repo, bin_dir)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "[setup] creating .venv with Python 3.11.1", res.stderr
    assert "python3.11 cannot create a virtual environment" in lines[1] and "python3.11-venv" in lines[1]
    assert len(lines) == 2
