"""Start-up: the commands that need no engine (help, the version, a usage error, the request's checks, `config`,
`avatars`, `qc --help`) import no torch and no other heavy library; shell scripts call them in loops. Checked in
real processes with `python -X importtime`, against what a bare interpreter here imports already."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO

NO_ENGINE = ("torch", "transformers", "mediapipe", "cv2", "scipy")      # never before an engine is needed
LIGHT = NO_ENGINE + ("numpy", "yaml", "imageio_ffmpeg", "soxr", "fastapi", "uvicorn", "ray")


def _imported(args: list[str], home) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level packages `python -X importtime ARGS` imports (its own stderr lines aside), and the process."""
    env = {**os.environ, "DITTO_FAST_HOME": str(home), "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    r = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    names = {line.rpartition("|")[2].strip().split(".")[0] for line in r.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    return names - {"", "package"}, r


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> set[str]:
    """What this interpreter imports before running anything (a site hook may import more than the stdlib)."""
    return _imported(["-c", "pass"], tmp_path_factory.mktemp("home"))[0]


CASES = [
    (["--help"], 0, LIGHT),
    (["--version"], 0, LIGHT),
    (["render", "--avatar", "ruby", "--audio", "a.wav", "--crf", "99"], 2, LIGHT),          # click's check
    (["render", "--avatar", "ruby", "--audio", "a.wav", "--fps", "31"], 2, LIGHT),          # the request's check
    (["render", "--help"], 0, NO_ENGINE + ("numpy",)),      # reads the defaults (YAML) for the help
    (["qc", "--help"], 0, LIGHT),
    (["config"], 0, NO_ENGINE + ("numpy",)),
    (["avatars"], 0, NO_ENGINE),                           # a record's arrays are numpy's
    (["serve", "--port", "0"], 2, LIGHT),
]


@pytest.mark.slow                  # real processes (the quick tier's guard: test_project_layers.py, statically)
@pytest.mark.parametrize("args, code, kept_out", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_commands_that_need_no_engine_import_none(args, code, kept_out, bare, tmp_path):
    names, r = _imported(["-m", "ditto_fast.cli", *args], tmp_path)
    assert r.returncode == code, r.stderr[-2000:]
    assert "ditto_fast" in names                            # the importtime lines were read
    assert not (names - bare) & set(kept_out), sorted((names - bare) & set(kept_out))


@pytest.mark.slow
def test_serve_checks_a_job_without_torch(bare, tmp_path):
    """The server's acceptor (a job's JSON checked as `render` checks its options) imports no network library:
    decoding the audio needs numpy, and the engine's modules are imported where the engine runs."""
    names, r = _imported(["-c", "import ditto_fast.serve.jobs.accept, ditto_fast.serve.options"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (names - bare) & {"torch", "transformers", "mediapipe"}, sorted(names - bare)
