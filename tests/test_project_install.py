"""What an install builds: setup.py's build of the Python files and the configs (what `pip install` and `pip wheel`
run) says no warning and installs every settings and delivery profile YAML as ditto_fast/configs/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_build_declares_the_configs_and_warns_of_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "configs", src / "configs")
    # the package without the kernel's source, so that setup.py does not cythonize (that is build_ext's part)
    shutil.copytree(REPO / "ditto_fast", src / "ditto_fast",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.pyx"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}   # its own note otherwise
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
                         cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "warning" not in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    built = tmp_path / "lib" / "ditto_fast" / "configs"
    want = sorted(p.relative_to(REPO / "configs") for p in (REPO / "configs").rglob("*.yaml"))
    assert want and Path("default.yaml") in want and any(p.parent.name == "delivery" for p in want)
    assert sorted(p.relative_to(built) for p in built.rglob("*.yaml")) == want
