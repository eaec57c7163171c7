"""The GPU check's preparation on a CPU: the bundle builds and fits what can be carried, and the same
gpu_check.sh runs from it as a `--device cpu --tiny` dry run with a Python like a bare GPU image's (the second
stack's .venv-current when there is one: numpy 2, transformers 5, headless OpenCV, no mediapipe)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64

pytestmark = [pytest.mark.slow, pytest.mark.register]     # the bundle's avatars are registered here


def bare_python() -> str:
    """$DITTO_FAST_BARE_PYTHON, else the second stack's interpreter, else this one."""
    current = REPO / ".venv-current" / "bin" / "python"
    return os.environ.get("DITTO_FAST_BARE_PYTHON") or (str(current) if current.exists() else sys.executable)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu") / "gpu_bundle"
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "gpu_bundle.py"), "--out", str(out),
                          "--limit-mib", str(LIMIT_MIB)], capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, res.stdout


def test_bundle_fits_and_says_its_size(bundle):
    out, stdout = bundle
    print(stdout)
    m = re.search(r"([\d.]+) MiB in all \(limit 64 MiB\)", stdout)
    assert m, stdout
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    assert abs(float(m.group(1)) - on_disk) < 0.1 and on_disk <= LIMIT_MIB
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert set(manifest["avatar_weights"]) == {"full", "tiny"}
    assert any(n.startswith("soxr") for n in manifest["site"]), manifest["site"]
    assert (out / "bundle" / "avatars" / "full" / "f_s.npy").stat().st_size > 4 * 2**20 - 1   # one full-size frame
    assert not (out / "tests" / "test_cli.py").exists() and (out / "ditto_fast" / "cli.py").is_file()


def test_cpu_tiny_dry_run_of_the_gpu_check(bundle, tmp_path):
    out, _ = bundle
    report = tmp_path / "gpu_check.json"
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGEIO_FFMPEG_EXE", "DITTO_FAST_HOME", "PYTHONPATH")}
    env["PYTHON"] = bare_python()
    res = subprocess.run(["bash", str(out / "scripts" / "gpu_check.sh"), "--device", "cpu", "--tiny",
                          "--out", str(report)], capture_output=True, text=True, timeout=900, env=env,
                         cwd=tmp_path)
    print(res.stdout)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(report.read_text())
    assert "ffmpeg.xz" in data["bundle"]                 # the carried ffmpeg did the encoding
    assert data["avatar"] == "fingerprints match"
    assert [r["batch"] for r in data["batches"]] == [1, 4, 8, 16]
    assert data["parity"]["half"] == "bfloat16" and data["parity"]["psnr_db"] > 20
    assert data["register_extractors"]["batch"] == 8 and data["register_extractors"]["ms_per_frame"] > 0
    assert [r["launch"] for r in data["launch"]] == ["eager", "graphs"]
    assert all(r["ddim_ms_per_step"] > 0 and r["warp_decode_ms_per_frame"]["1"] > 0 for r in data["launch"])
    arms = {(r["output_stage"], r["launch"]): r for r in data["renders"]}
    assert set(arms) == {(stage, launch) for stage in ("inline", "thread") for launch in ("eager", "graphs")}
    for (stage, launch), r in arms.items():      # every arm: the baseline's bytes (graphs: the CPU's stand-in)
        best = r["best"]
        assert best["frames"] == 25 and best["encoder"] == "libx264" and best["ms_per_frame"]["render"] > 0
        assert r["same_bytes_as_baseline"], (stage, launch)
        assert ("handoff" in best["ms_per_frame"]) == (stage == "thread")     # timed only where there is a thread
        if launch == "graphs":                   # captured once, replayed after, for warp + decode and the LMDM
            assert {k: c["capture"] for k, c in r["launch_counts"].items()} == {"warp_decode": 1, "ddim": 1}
            assert all(c["replay"] > 10 for c in r["launch_counts"].values())
    process = {(r["output_stage"], r["launch"]): r for r in data["engine_process"]}
    assert set(process) == {("inline", "eager"), ("thread", "graphs")}
    for r in process.values():                   # a cold job and a warm one, the bytes of the same arm in process
        assert "error" not in r and len(r["jobs"]) == 2 and r["same_bytes_as_in_process"], r
    assert [(r["overlap"], r["steps"], r["launch"]) for r in data["live"]] == \
        [(70, 25, "eager"), (70, 25, "graphs"), (75, 25, "graphs"), (78, 25, "graphs"), (70, 10, "eager")]
    # a first frame in each arm that sent a frame made for its slot (a busy CPU may make none in time: all repeated)
    assert all(r["frames"]["sent"] > 0 and 0 <= r["on_time_share"] <= 1 for r in data["live"])
    assert all((r["first_frame_latency_s"] or 0) > 0 or r["frames"]["on_time"] == 0 for r in data["live"]), \
        [(r["first_frame_latency_s"], r["frames"]) for r in data["live"]]
    sessions = data["sessions"]                  # the sessions arm: a batch size each, captured before they stream
    assert [r["sessions"] for r in sessions] == [1, 2] and all(len(r["per_session"]) == r["sessions"] for r in sessions)
    assert all(r["captures_while_streaming"] == 0 and 0 <= r["on_time_fraction"] <= 1 for r in sessions), sessions
    assert all(p["frames"]["sent"] > 0 for r in sessions for p in r["per_session"])
    assert [r["threads"] for r in data["encoders"]][0] == "auto" and len(data["encoders"]) >= 2
    assert data["compile"].startswith("not tried on a CPU") and data["skipped"] == []
    assert "ms/frame" in res.stdout and "PSNR" in res.stdout and "same bytes as inline eager" in res.stdout


def test_gpu_check_outside_a_bundle_says_how_to_build_one(tmp_path):
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "scripts/gpu/gpu_bundle.py" in res.stderr


REBIND = """
import sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/scripts/gpu")
sys.path.insert(0, sys.argv[1])
import gpu_check
from ditto_fast.checkpoints import MODELS_SUBDIR
from ditto_fast.checkpoints.random_weights import write_random
from ditto_fast.avatar.reader import load_avatar
from ditto_fast.checkpoints import find_checkpoints

tmp = Path(sys.argv[2])
ckpt = write_random(tmp / "ckpt", tiny=True, seed=int(sys.argv[3]))
f = ckpt / MODELS_SUBDIR / "appearance_extractor.pth"
torch.save(torch.load(f, weights_only=True), f, pickle_protocol=3)    # same tensors, other container bytes
try:
    what = gpu_check.open_avatar(ckpt, "tiny", tmp / "home")
except SystemExit as e:
    print("refused:", e)
    sys.exit(0)
av = load_avatar(tmp / "home" / "avatars" / "gpu_check", checkpoints=find_checkpoints(ckpt))
print(what, "| opened", av.n_frames)
"""


@pytest.mark.parametrize("seed,expected", [(0, "fingerprints rebound (same extractor tensors, other torch.save "
                                                  "bytes) | opened 1"),
                                           (1, "refused: gpu_check: ")])
def test_avatar_rebinds_only_to_the_same_weights(bundle, tmp_path, seed, expected):
    """Checkpoints whose files torch wrote differently but whose tensors are the avatar's are accepted (the
    fingerprints rebound); other weights (another seed) are refused."""
    out, _ = bundle
    res = subprocess.run([sys.executable, "-c", REBIND, str(out), str(tmp_path), str(seed)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().startswith(expected), res.stdout
