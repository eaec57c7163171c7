"""Fused warp+decode: uint8 crops out, reduced precision close to float32, device/precision choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ditto_fast import models
from ditto_fast.checkpoints import find_checkpoints
from ditto_fast.core.devices import resolve_device
from ditto_fast.engine.precision import choose_precision
from ditto_fast.core.errors import UsageError
from ditto_fast.render.fused import FusedRenderer


@pytest.fixture(scope="module")
def inputs(tiny_checkpoints):
    cs = find_checkpoints(tiny_checkpoints)
    rng = np.random.default_rng(0)
    from ditto_fast import models

    app = models.load("appearance_extractor", cs.files["appearance_extractor"])
    with torch.inference_mode():
        f_s = app(torch.from_numpy(rng.random((2, 3, 256, 256), dtype=np.float32))).half().numpy()
    x_s = (0.3 * rng.standard_normal((2, 21, 3))).astype(np.float32)
    x_d = x_s + (0.02 * rng.standard_normal((2, 21, 3))).astype(np.float32)
    return cs, f_s, x_s, x_d


def test_crops_are_uint8_and_depend_on_motion(inputs):
    cs, f_s, x_s, x_d = inputs
    r = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"))
    crops = r(f_s, x_s, x_d)
    assert crops.dtype == np.uint8 and crops.shape == (2, 512, 512, 3)
    assert models.is_random(r.warp, r.decoder)
    moved = r(f_s, x_s, x_d + 0.05)
    assert np.abs(crops.astype(int) - moved).mean() > 0.5
    # batch of two equals two single frames
    one = np.concatenate([r(f_s[i:i + 1], x_s[i:i + 1], x_d[i:i + 1]) for i in range(2)])
    assert np.abs(one.astype(int) - crops).max() <= 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_close_to_fp32(inputs, dtype):
    cs, f_s, x_s, x_d = inputs
    ref = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"))(f_s, x_s, x_d)
    low = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"), dtype)(f_s, x_s, x_d)
    mse = np.mean((ref.astype(np.float64) - low) ** 2)
    psnr = 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))
    assert psnr > 30, psnr


def test_device_and_precision_choice(monkeypatch):
    assert choose_precision("auto", torch.device("cpu"))[0] == torch.float32      # the suite pins fp32
    assert choose_precision("auto", torch.device("cuda"))[0] == torch.float16
    assert choose_precision("bf16", torch.device("cpu"))[0] == torch.bfloat16
    with pytest.raises(UsageError):
        choose_precision("fp16", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(UsageError, match="no CUDA device"):
        resolve_device("cuda")


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    """A pre-Ampere card would run bf16 emulated or fail in cuDNN: refused up front (the answer is faked here)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    with pytest.raises(UsageError, match="Tesla T4 has no bf16 arithmetic"):
        choose_precision("bf16", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: not including_emulation)
    assert choose_precision("bf16", torch.device("cuda"))[0] == torch.bfloat16


def test_warp_decode_graphed_gives_the_eager_crops_and_other_batches_run_eager(inputs):
    """Warp + decode through core/graphs' bookkeeping (the CPU stand-in): a render's batches of 2, 2, 2 and a last
    of 1 give the crops the networks give called as they are; the batch of 2 is captured at its second call, the
    odd one runs eagerly; each batch's crops are its own (a graph's output is written again by the next replay)."""
    from ditto_fast.core.graphs import Launched

    cs, f_s, x_s, x_d = inputs
    eager = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"))
    graphed = eager.twin(launch="graphs")
    assert graphed._launched is None and graphed.warp is eager.warp        # same networks; a CPU launches eagerly
    graphed._launched = Launched(graphed._warp_decode, cuda=False)
    batches = [(f_s, x_s, x_d + 0.01 * k) for k in range(3)] + [(f_s[:1], x_s[:1], x_d[:1] - 0.02)]
    pending = [graphed.launch(*b) for b in batches]                         # all launched before any is collected
    for b, p in zip(batches, pending):
        assert np.array_equal(graphed.collect(p), eager(*b))
    assert dict(graphed._launched.counts) == {"eager": 2, "capture": 1, "replay": 1}


def test_threads_sharing_warp_decode_get_their_own_crops_in_batches(inputs):
    """Sessions sharing an engine's warp + decode (render/shared_fused.py, on a GPU): frames asked for at once run as
    one batch, and each thread gets the crops of its own frames, as a call of its own gives them."""
    from ditto_fast.render.shared_fused import SharedFused
    from support import together

    cs, f_s, x_s, x_d = inputs
    r = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"))
    asks = [(f_s[i % 2:i % 2 + 1], x_s[i % 2:i % 2 + 1], x_d[i % 2:i % 2 + 1] + 0.01 * i) for i in range(4)]
    alone = [r(*a) for a in asks]
    shared = SharedFused(r, gather_s=0.2)           # a generous gather: the four threads meet in one batch
    got = together(4, lambda i: shared(*asks[i]))
    assert shared.frames == 4 and shared.batches < 4, (shared.batches, shared.frames)
    for i in range(4):
        assert got[i].shape == (1, 512, 512, 3)
        assert np.abs(got[i].astype(int) - alone[i]).max() <= 1, i          # its own frame, as alone
    with pytest.raises(ValueError):                                         # a bad ask fails its own thread only
        shared(f_s[:1], x_s[:1], x_d[:2])
    assert np.abs(shared(*asks[0]).astype(int) - alone[0]).max() <= 1


def test_shared_batches_run_at_fixed_sizes_captured_before_any_session_streams(inputs):
    """Three sessions' frames run as a batch of four (the bucket warm-up captured, a CPU's stand-in for a CUDA
    graph), padded and cut: each thread gets its own crops, and nothing is captured once they stream."""
    from ditto_fast.core.graphs import BUCKETS, Launched
    from ditto_fast.render.shared_fused import SharedFused
    from support import together

    cs, f_s, x_s, x_d = inputs
    r = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], torch.device("cpu"))
    twin = r.twin(max_graphs=len(BUCKETS))
    twin._launched = Launched(twin._warp_decode, cuda=False, max_graphs=len(BUCKETS))
    shared = SharedFused(twin, gather_s=0.3, most=4)
    shared.warm((f_s[:1], x_s[:1], x_d[:1]))
    warmed = dict(twin.launches)
    assert warmed == {"eager": 3, "capture": 3}, warmed            # 1, 2 and 4 frames: the buckets up to most
    asks = [(f_s[i % 2:i % 2 + 1], x_s[i % 2:i % 2 + 1], x_d[i % 2:i % 2 + 1] + 0.01 * i) for i in range(3)]
    alone = [r(*a) for a in asks]
    got = together(3, lambda i: shared(*asks[i]))
    for i in range(3):
        assert got[i].shape == (1, 512, 512, 3) and np.abs(got[i].astype(int) - alone[i]).max() <= 1, i
    after = dict(twin.launches)
    assert after["capture"] == 3 and after["eager"] == 3 and after["replay"] >= 1, after
