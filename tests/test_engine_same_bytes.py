"""One fixed clip rendered through the CLI, a batch and the Python API gives the same bytes, and the bytes
recorded before the render request was introduced (on a machine of the recorded kind). The avatar is made
from a BT.709-tagged HD anchor, which the picture rules (avatar/picture.py) read as before.

The recorded digests are keyed by what decides the arithmetic (CPU flags, torch, numpy, mediapipe,
ffmpeg) and made on two torch threads (their number changes the sums' order, so the renders here use two on any
machine); on another kind of machine the three paths must still agree with one another. To record this
machine's: DITTO_FAST_RECORD_GOLDEN=1 ./scripts/test.sh tests/test_engine_same_bytes.py
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from support import blanked_sha256

from conftest import REPO, cli_exit_code
from ditto_fast.engine.precision import cpu_kind

GOLDEN = REPO / "tests" / "data" / "golden_render.json"
# a clip that leaves the defaults: another seed, fewer steps, a mix of emotions, an output rate that is not
# the avatar's, controls, and the fixed engine settings a digest records
CLIP = {"seed": 7, "steps": 4, "emotion": "happy+surprise", "fps": "30", "blend": "feather"}
ENGINE = ["--device", "cpu", "--precision", "fp32", "--batch-size", "1", "--encoder", "software"]
CONTROLS = {"frames": {"0-5": {"yaw": 8.0}}}
RECORDED_THREADS = 2        # the digests were recorded with torch's default on these 2-core machines


def _machine_key() -> str:
    kind = cpu_kind()
    parts = [platform.machine(), ",".join(kind["flags"]), *(f"{p}={version(p)}" for p in
             ("torch", "numpy", "mediapipe", "imageio-ffmpeg", "opencv-contrib-python"))]
    return " ".join(parts)


@pytest.fixture(scope="module")
def golden_avatar(session_home, tiny_checkpoints, tmp_path_factory):
    """A 1 s 1920x1080 anchor tagged BT.709, registered as 'golden'."""
    from ditto_fast.avatar.register import register_avatar
    from synthetic import Motion, write_anchor_video

    video = write_anchor_video(tmp_path_factory.mktemp("golden") / "golden.mp4", 25, face_px=150, bt709=True,
                               motion=Motion(center=(900.0, 520.0), velocity=(1.5, 0.5), spin_deg=0.1))
    return register_avatar(video, name="golden", checkpoints=tiny_checkpoints, device="cpu")


@pytest.fixture(scope="module")
def three_ways(golden_avatar, session_home, tiny_checkpoints, clips, tmp_path_factory, run_cli_module):
    """The three ways' digests, on RECORDED_THREADS torch threads (a CPU render's bytes depend on their number)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(RECORDED_THREADS)
    try:
        yield _three_ways(tiny_checkpoints, clips, tmp_path_factory, run_cli_module)
    finally:
        torch.set_num_threads(threads)


def _three_ways(tiny_checkpoints, clips, tmp_path_factory, run_cli_module) -> dict:
    out = tmp_path_factory.mktemp("same_bytes")
    controls = out / "controls.json"
    controls.write_text(json.dumps(CONTROLS))
    env = {"DITTO_FAST_CHECKPOINTS": str(tiny_checkpoints), "OMP_NUM_THREADS": str(RECORDED_THREADS)}
    cli_out = out / "cli.mp4"
    r = run_cli_module(["render", "--avatar", "golden", "--audio", clips[0], "-o", cli_out, "--seed", CLIP["seed"],
                        "--steps", CLIP["steps"], "--emotion", CLIP["emotion"], "--fps", CLIP["fps"],
                        "--blend", CLIP["blend"], "--controls", controls, *ENGINE, "--quiet"], env)
    assert r.returncode == 0, r.stderr
    jobs = out / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "golden", "audio": str(clips[0]), "output": "batch.mp4",
                                "controls": "controls.json", **CLIP}) + "\n")
    r = run_cli_module(["batch", jobs, *ENGINE, "--quiet"], env)
    assert r.returncode == 0, r.stderr
    from ditto_fast import Renderer

    api_out = out / "api.mp4"
    renderer = Renderer(tiny_checkpoints, device="cpu", precision="fp32", batch_size=1, encoder="software")
    _render_api(renderer, clips[0], api_out, controls)
    files = {"cli": cli_out, "batch": out / "batch.mp4", "api": api_out}
    whole = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items()}
    return {"whole": whole, **{k: blanked_sha256(p) for k, p in files.items()}}


def _render_api(renderer, audio: Path, output: Path, controls: Path) -> None:
    """The Python API's one-off render of the fixed clip."""
    try:
        from ditto_fast import RenderRequest
    except ImportError:                       # the engine before the render request existed
        renderer.render("golden", audio, output, controls=controls, **{k: v for k, v in CLIP.items() if k != "blend"})
        return
    renderer.render(RenderRequest(avatar="golden", audio=audio, output=output, controls=controls, **CLIP))


@pytest.fixture(scope="module")
def run_cli_module():
    """The CLI in this process with `env` set for the call (as conftest's run_cli, module-scoped, no capture)."""
    def run(args, env):
        mp = pytest.MonkeyPatch()
        for key, value in env.items():
            mp.setenv(key, value)
        try:
            return subprocess.CompletedProcess(args, cli_exit_code(args), "", "")
        finally:
            mp.undo()

    return run


@pytest.mark.register
@pytest.mark.slow
def test_the_cli_a_batch_and_the_api_give_the_same_bytes(three_ways):
    assert three_ways["cli"] == three_ways["batch"] == three_ways["api"], three_ways
    assert len(set(three_ways["whole"].values())) == 1, three_ways["whole"]     # the digest tags agree too


@pytest.mark.register
@pytest.mark.slow
def test_the_bytes_recorded_before_the_render_request(three_ways):
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    key = _machine_key()
    if os.environ.get("DITTO_FAST_RECORD_GOLDEN"):
        recorded[key] = three_ways["cli"]
        GOLDEN.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    if key not in recorded:
        pytest.skip(f"no digest recorded for this kind of machine ({key})")
    assert three_ways["cli"] == recorded[key]
