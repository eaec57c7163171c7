"""`batch_size: auto`: 1 on a CPU without a probe; on CUDA a measured batch, probed once and kept in the store.

The probe's measurement is device-agnostic, so it is exercised here on the CPU with tiny networks."""

from __future__ import annotations

import json

import pytest
import torch

from ditto_fast.checkpoints import find_checkpoints
from ditto_fast.core.config import load_config
from ditto_fast.core.errors import UsageError
from ditto_fast.engine import batch_size as bsz
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.render.fused import FusedRenderer


@pytest.fixture()
def tiny_set(tiny_checkpoints):
    return find_checkpoints(tiny_checkpoints)


@pytest.fixture(autouse=True)
def small_probe_inputs(monkeypatch):
    """The probe's sample batch cut to 16x16 source features (crops of 128x128, not 512x512): the same launches,
    collects and bookkeeping timed, on a sixteenth of the pixels."""
    full = bsz.sample_inputs

    def small(fused, batch):
        f_s, x_s, x_d = full(fused, batch)             # f_s [B, C, D, 64, 64]
        return f_s[..., :16, :16], x_s, x_d

    monkeypatch.setattr(bsz, "sample_inputs", small)


def rows(*ms: float, peak: int = 0) -> list[dict]:
    return [{"batch": 2 ** i, "ms_per_frame": m, "peak_bytes": peak * 2 ** i} for i, m in enumerate(ms)]


def test_choose_takes_the_smallest_batch_near_the_fastest_that_fits():
    assert bsz.choose(rows(12.0, 7.0, 5.1, 5.0, 4.9)) == 4          # 5.1 is within 5% of 4.9; 8 and 16 buy little
    assert bsz.choose(rows(12.0, 7.0, 6.0, 5.0, 4.0)) == 16
    assert bsz.choose(rows(5.0, 6.0)) == 1                           # batching can lose
    # peaks 10, 20, 40, 80 bytes of a 100-byte GPU: 8 needs 80 > half, so the fastest that fits is 4
    assert bsz.choose(rows(12.0, 7.0, 5.0, 4.0, peak=10), total_bytes=100) == 4
    assert bsz.choose(rows(12.0, peak=60), total_bytes=100) == 1     # nothing fits: one frame at a time
    assert bsz.choose([]) == 1


def test_measure_times_each_size_as_the_loop_runs_it(tiny_set):
    got = bsz.measure(tiny_set.files["warp_network"], tiny_set.files["decoder"], torch.device("cpu"),
                      torch.float32, (1, 2), 2)
    assert [r["batch"] for r in got] == [1, 2]
    assert all(r["ms_per_frame"] > 0 and r["peak_bytes"] == 0 for r in got)


def _short_of_memory(monkeypatch, from_batch: int, error: Exception) -> None:
    """FusedRenderer.launch raises `error` for batches of `from_batch` frames or more, as a full GPU would."""
    launch = FusedRenderer.launch

    def launch_or_fail(self, f_s, x_s, x_d):
        if len(f_s) >= from_batch:
            raise error
        return launch(self, f_s, x_s, x_d)

    monkeypatch.setattr(FusedRenderer, "launch", launch_or_fail)


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")])
def test_measure_stops_at_the_first_size_out_of_memory(tiny_set, monkeypatch, error):
    _short_of_memory(monkeypatch, 4, error)
    got = bsz.measure(tiny_set.files["warp_network"], tiny_set.files["decoder"], torch.device("cpu"),
                      torch.float32, (1, 2, 4, 8), 2)
    assert [r["batch"] for r in got] == [1, 2]


def test_other_errors_are_not_taken_for_memory(tiny_set, monkeypatch):
    _short_of_memory(monkeypatch, 2, RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bsz.measure(tiny_set.files["warp_network"], tiny_set.files["decoder"], torch.device("cpu"),
                    torch.float32, (1, 2), 2)


def test_no_size_fitting_gives_one_and_is_kept(tiny_set, tmp_path, monkeypatch):
    _short_of_memory(monkeypatch, 1, torch.cuda.OutOfMemoryError("CUDA out of memory"))
    for _ in range(2):
        assert bsz.measured_batch_size(tiny_set, torch.device("cpu"), torch.float32, tmp_path, sizes=(1, 2)) == \
            (1, "1: the probe ran out of device memory even at batch 1")
    kept = list((tmp_path / "probes").glob("batch-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["rows"] == []


def test_cpu_auto_is_one_without_a_probe_and_a_number_is_kept(tiny_set, tmp_path, monkeypatch):
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path))
    monkeypatch.setattr(bsz, "measure", lambda *a, **k: pytest.fail("probed batch sizes on a CPU"))
    assert bsz.auto_batch_size(tiny_set, torch.device("cpu"), torch.float32) == (1, bsz.CPU_CHOICE)
    setup = RenderSetup.resolve(EngineOptions(device="cpu", precision="fp32", checkpoints=tiny_set))
    assert load_config().render.batch_size == "auto" and setup.batch_size == 1
    assert setup.batch_choice == bsz.CPU_CHOICE and not (tmp_path / "probes").exists()
    given = RenderSetup.resolve(EngineOptions(device="cpu", precision="fp32", batch_size=3, checkpoints=tiny_set))
    assert given.batch_size == 3 and given.batch_choice.startswith("3: set by")
    with pytest.raises(UsageError, match="1..64 or auto"):
        RenderSetup.resolve(EngineOptions(device="cpu", precision="fp32", batch_size=65, checkpoints=tiny_set))


@pytest.mark.slow
def test_the_measured_verdict_is_kept_and_read_back(tiny_set, tmp_path, monkeypatch):
    calls = []
    measure = bsz.measure

    def counted(*args):
        calls.append(args)
        return measure(*args[:-1], 2)                                # 2 frames a size: tiny and quick

    monkeypatch.setattr(bsz, "measure", counted)
    first = bsz.measured_batch_size(tiny_set, torch.device("cpu"), torch.float32, tmp_path, sizes=(1, 2))
    assert first[0] in (1, 2) and "ms/frame at batch 1" in first[1] and len(calls) == 1
    kept = list((tmp_path / "probes").glob("batch-*.json"))
    assert len(kept) == 1
    verdict = json.loads(kept[0].read_text())
    assert verdict["chosen"] == first[0] and [r["batch"] for r in verdict["rows"]] == [1, 2]
    # the next engine reads the kept verdict (here edited to 2) instead of measuring again
    kept[0].write_text(json.dumps({**verdict, "chosen": 2}))
    assert bsz.measured_batch_size(tiny_set, torch.device("cpu"), torch.float32, tmp_path, sizes=(1, 2))[0] == 2
    assert len(calls) == 1
    # another precision is measured on its own; a damaged verdict is measured again and replaced
    bsz.measured_batch_size(tiny_set, torch.device("cpu"), torch.bfloat16, tmp_path, sizes=(1, 2))
    assert len(calls) == 2 and len(list((tmp_path / "probes").glob("batch-*.json"))) == 2
    kept[0].write_text(json.dumps({**verdict, "chosen": 8}))          # not a size it measured
    bsz.measured_batch_size(tiny_set, torch.device("cpu"), torch.float32, tmp_path, sizes=(1, 2))
    assert len(calls) == 3 and json.loads(kept[0].read_text())["chosen"] in (1, 2)


def test_config_and_cli_take_auto_or_a_number(tmp_path, run_cli):
    f = tmp_path / "c.yaml"
    f.write_text("render:\n  batch_size: 8\n")
    assert load_config(f).render.batch_size == 8
    for bad in ("fast", 0, 65):
        f.write_text(f"render:\n  batch_size: {bad}\n")
        with pytest.raises(UsageError, match=r"render.batch_size must be .*1..64 or auto"):
            load_config(f)
    res = run_cli(["render", "--avatar", "x", "--audio", tmp_path / "a.wav", "--batch-size", "0"])
    assert res.returncode == 2 and "1..64 or auto" in res.stderr


def test_cuda_auto_takes_the_kept_probe(tiny_set, monkeypatch):
    seen = []
    monkeypatch.setattr(bsz, "measured_batch_size", lambda cs, dev, dtype, root=None: seen.append((dev, dtype)) or
                        (8, "8: probed on this GPU"))
    assert bsz.auto_batch_size(tiny_set, torch.device("cuda"), torch.float16) == (8, "8: probed on this GPU")
    assert seen == [(torch.device("cuda"), torch.float16)]


def test_gpu_probe_script_needs_only_torch(tmp_path, monkeypatch, capsys):
    """scripts/gpu/gpu_probe.py (for a GPU machine whose image has torch and not the render's other packages),
    run here on the CPU with tiny networks and those packages made unimportable."""
    import importlib.util
    import sys
    from pathlib import Path

    for name in ("mediapipe", "imageio_ffmpeg", "soxr", "soundfile", "transformers", "ray"):
        monkeypatch.setitem(sys.modules, name, None)                # `import name` now raises ImportError
    monkeypatch.setattr(bsz, "FRAMES", 2)
    monkeypatch.setattr(bsz, "SIZES", (1, 2))
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "gpu_probe.py"
    spec = importlib.util.spec_from_file_location("gpu_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2     # no GPU here
    assert module.main(["--device", "cpu", "--tiny", "--out", str(tmp_path / "p.json")]) == 0
    got = json.loads((tmp_path / "p.json").read_text())
    fp32 = got["precisions"]["fp32"]
    assert [r["batch"] for r in fp32["rows"]] == [1, 2] and fp32["chosen"] == bsz.choose(fp32["rows"])
    assert "<- auto" in capsys.readouterr().out
