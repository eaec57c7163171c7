"""The README's code blocks work as written: the shell commands run (tiny checkpoints, a synthetic anchor), the
Python example runs, the JSON examples are a valid control file and valid job lines, and every option of the
command synopsis is one the command takes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"


def _blocks(lang: str) -> list[str]:
    """The README's fenced code blocks of one language ("" for the untagged ones)."""
    text = README.read_text()
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if m.group(1) == lang]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_checkpoints, clips):
    """A folder with what the README's examples name: anchor.mp4, news.wav, a.wav, b.wav, ckpt/."""
    from synthetic import Motion, write_anchor_video

    d = tmp_path_factory.mktemp("readme")
    write_anchor_video(d / "anchor.mp4", 10, size=(960, 540), face_px=120, motion=Motion(center=(480.0, 470.0)),
                       bt709=True)
    for name in ("news.wav", "a.wav", "b.wav"):
        shutil.copy(clips[0], d / name)
    (d / "ckpt").symlink_to(tiny_checkpoints)
    return d


@pytest.mark.slow
def test_the_shell_commands_run_as_written(workdir, tiny_checkpoints):
    env = dict(os.environ, DITTO_FAST_HOME=str(workdir / "home"), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    lines = [ln.split("#")[0].strip() for block in _blocks("bash") for ln in block.splitlines()]
    commands = [ln for ln in lines if ln.startswith("ditto-fast ")]
    assert commands, "no shell commands found in the README"
    for cmd in commands:
        r = subprocess.run(cmd, shell=True, cwd=workdir, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"{cmd}: {r.stderr[-800:]}"
    assert (workdir / "news.mp4").stat().st_size > 0


@pytest.mark.slow
def test_the_python_example_runs(workdir):
    (code,) = _blocks("python")
    env = dict(os.environ, DITTO_FAST_HOME=str(workdir / "home"))
    if not (workdir / "home").exists():     # the avatar the example renders
        subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", "anchor.mp4", "--name", "ruby",
                        "--checkpoints", "ckpt", "--quiet"], cwd=workdir, env=env, check=True)
    r = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-800:]
    assert (workdir / "a.mp4").exists() and (workdir / "b.mp4").exists()


def test_the_json_examples_are_a_control_file_and_job_lines(tmp_path):
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.motion.controls import parse_controls

    controls, jobs = _blocks("json")[:2]
    parse_controls(json.loads(controls), 120, "README controls")
    for i, line in enumerate(jobs.strip().splitlines()):
        RenderRequest.from_json(json.loads(line), tmp_path, f"README job line {i + 1}")


def test_every_option_in_the_synopsis_is_one_the_command_takes():
    from click.testing import CliRunner

    from ditto_fast.cli import cli

    synopsis = next(b for b in _blocks("") if "ditto-fast render --avatar" in b)
    commands: dict[str, set[str]] = {}
    current = None
    for line in synopsis.splitlines():
        m = re.match(r"ditto-fast (\w+)(?: (show|rm|init-random|info))?", line)
        if m:
            current = " ".join(g for g in m.groups() if g)
        if current:
            commands.setdefault(current, set()).update(re.findall(r"(?<![\w-])(--[a-z][\w-]*|-o)\b", line.split("#")[0]))
    assert {"register", "render", "batch"} <= set(commands)
    for cmd, flags in commands.items():
        r = CliRunner().invoke(cli, [*cmd.split(), "--help"])          # in this process: the same click commands
        assert r.exit_code == 0, (cmd, r.output)
        missing = sorted(f for f in flags if f not in r.output)
        assert not missing, f"ditto-fast {cmd}: the README names {missing}, which --help does not list"
