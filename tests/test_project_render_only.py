"""A render-only install (no mediapipe): the package asks for none, `register` names the install (exit 2)
before any work, `doctor` passes. Here mediapipe is hidden from imports (on the second stack it is absent)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def no_mediapipe(monkeypatch):
    monkeypatch.setitem(sys.modules, "mediapipe", None)      # `import mediapipe` raises ImportError


def test_mediapipe_is_only_in_the_register_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("mediapipe") for d in project["dependencies"])
    assert any(d.startswith("mediapipe==0.10.21") for d in project["optional-dependencies"]["register"])
    numpy = next(d for d in project["dependencies"] if d.startswith("numpy"))
    assert "<3" in numpy and "<2" not in numpy
    assert project["requires-python"] == ">=3.10,<3.14"
    pinned = (REPO / "scripts" / "setup" / "stack-pinned.txt").read_text()
    assert "mediapipe==0.10.21" in pinned and "numpy>=1.24,<2" in pinned


def test_register_without_mediapipe_names_the_install(no_mediapipe, run_cli, tmp_path, ditto_home):
    src = tmp_path / "anchor.png"
    src.write_bytes(b"not looked at")
    res = run_cli(["register", str(src), "--name", "x", "--checkpoints", str(tmp_path / "nowhere")])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "register needs mediapipe, which is not installed" in lines[0]
    assert "pip install 'ditto-fast[register]'" in lines[0]
    assert not (ditto_home / "avatars").exists()


def test_doctor_passes_the_mediapipe_line_on_a_render_only_install(no_mediapipe):
    from ditto_fast.commands.doctor import _mediapipe

    check = _mediapipe()
    assert check.ok and "render-only" in check.detail and "ditto-fast[register]" in check.detail


def test_render_side_imports_without_mediapipe():
    """In a fresh interpreter (this one has them loaded already), with mediapipe unimportable."""
    import subprocess

    modules = ("ditto_fast.engine.renderer", "ditto_fast.batch.local", "ditto_fast.commands.doctor", "ditto_fast.cli",
               "ditto_fast.live.start", "ditto_fast.serve.server")
    code = ("import importlib, sys; sys.modules['mediapipe'] = None\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "assert 'mediapipe' not in [k for k, v in sys.modules.items() if v is not None]")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_hubert_loads_without_a_progress_bar(tmp_path, capfd):
    """transformers 5 draws a "Loading weights" bar on stderr unless told not to; a render prints nothing."""
    from ditto_fast.audio.hubert import load_hubert_encoder
    from ditto_fast.checkpoints.random_hubert import write_random_hubert

    write_random_hubert(tmp_path / "hubert", tiny=True, seed=0)
    capfd.readouterr()
    load_hubert_encoder(tmp_path / "hubert")
    out = capfd.readouterr()
    assert out.err == "" and out.out == ""
