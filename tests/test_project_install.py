"""What an install builds: setup.py's build of the Python files and the configs (what `pip install` and `pip wheel`
run) says no warning and installs every settings and delivery profile YAML as ditto_fast/configs/; the editable
install the README's set-up runs (`pip install --no-build-isolation -e .`) says no warning either, and the command
it installs runs from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _checkout(dest: Path, with_kernel: bool) -> Path:
    """The files an install reads, copied as a fresh checkout has them (the configs link kept a link)."""
    dest.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    shutil.copytree(REPO / "configs", dest / "configs")
    skip = ("__pycache__", "*.so", "*.c") + (() if with_kernel else ("*.pyx",))
    shutil.copytree(REPO / "ditto_fast", dest / "ditto_fast", symlinks=True, ignore=shutil.ignore_patterns(*skip))
    return dest


def test_the_build_declares_the_configs_and_warns_of_nothing(tmp_path):
    # the package without the kernel's source, so that setup.py does not cythonize (that is build_ext's part)
    src = _checkout(tmp_path / "src", with_kernel=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}   # its own note otherwise
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
                         cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "warning" not in (res.stdout + res.stderr).lower(), res.stdout + res.stderr
    built = tmp_path / "lib" / "ditto_fast" / "configs"
    want = sorted(p.relative_to(REPO / "configs") for p in (REPO / "configs").rglob("*.yaml"))
    assert want and Path("default.yaml") in want and any(p.parent.name == "delivery" for p in want)
    assert sorted(p.relative_to(built) for p in built.rglob("*.yaml")) == want
    page = REPO / "ditto_fast" / "serve" / "page" / "static"     # the newsroom page's files (serve's GET /)
    assert sorted(p.name for p in (tmp_path / "lib" / "ditto_fast" / "serve" / "page" / "static").iterdir()) == \
        sorted(p.name for p in page.iterdir()) == ["index.html", "page.css", "page.js"]


@pytest.mark.slow
def test_the_editable_install_warns_of_nothing_and_runs_from_the_checkout(tmp_path):
    """`pip install --no-deps --no-build-isolation -e CHECKOUT` (scripts/setup/setup_env.sh's install, without
    fetching anything) into a fresh environment whose build tools and dependencies are this one's: no warning box,
    the kernel built in place, and `ditto-fast --version` runs the checkout's code with its configs."""
    src = _checkout(tmp_path / "src", with_kernel=True)
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "build-tools.pth").write_text(sysconfig.get_path("purelib") + "\n")   # pip, setuptools, torch ...
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONDONTWRITEBYTECODE"}
    res = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-e", str(src)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    said = res.stdout + res.stderr
    assert res.returncode == 0, said
    noted = [ln for ln in said.splitlines() if "warning" in ln.lower() or "****" in ln]
    assert not noted, said
    assert list((src / "ditto_fast" / "render").glob("_blend*.so")), said          # the kernel, built in place
    res = subprocess.run([env_dir / "bin" / "ditto-fast", "--version"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("ditto-fast, version "), res.stdout + res.stderr
    res = subprocess.run([py, "-c", "import ditto_fast, ditto_fast.render._blend as k; "
                                    "from ditto_fast.core.config import DEFAULT_YAML; "
                                    "print(ditto_fast.__file__, k.__file__, DEFAULT_YAML, DEFAULT_YAML.is_file())"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    package, kernel, default, exists = res.stdout.split()
    assert Path(package) == src / "ditto_fast" / "__init__.py" and Path(kernel).parent == src / "ditto_fast" / "render"
    assert Path(default) == src / "configs" / "default.yaml" and exists == "True", res.stdout + res.stderr
