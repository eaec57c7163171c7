"""Full-size warp + decode per frame on this CPU: inside a default (`--precision auto`) render, against the
same networks run plain fp32 eager, and this CPU's 3x3-convolution throughput as the limit.

Plain fp32 eager is as close to the reference implementation's work as our modules allow: BatchNorms
and spectral norms unfolded (computed every call), the two rewritten layers as the plain conv3d /
conv2d they replace, 3D pooling as avg_pool3d, the SPADE norms' first convs on the feature resized to
their block (the reference's work; the default path folds the resize into them), and NCHW tensors (the
benchmark maps the networks' channels-last requests to the default layout while it runs that arm, and
checks that it did). What stays shared is code with no costly layer of its own: the keypoint sampling as
one grid_sample over stacked grids and the SPADE modulation. Both arms run on the same CPU with the same threads in one run,
alternating over three rounds (one with --quick), each keeping its best: the default arm is a fresh render
process every round (with the CLI's malloc policy, `memory.reuse_freed_memory`), and so is the plain arm
(with glibc's default malloc, as the reference runs; in this benchmark's own process it sped up round by
round as the heap grew, to 3.0 s against 3.8 s fresh). One more plain round runs with our malloc policy,
for the record. Say which CPU kind.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from bench_common import anchor, checkpoints, run_child, save, speech
from bench_render import CLI_MALLOC, _render

FLOP_PER_FRAME = 1.23e12        # warp + decode at full size, batch 1 (multiply-adds counted as two)
FOLDED_FLOP_PER_FRAME = 1.12e12  # the same in the default path: the decoder's NearestUpConv3x3 skip 0.11 TFLOP


CALLS = {"conv3d": 0, "conv2d": 0, "pool": 0, "not_nchw": 0}    # the plain layers ran, and on NCHW input


def _nchw(x: torch.Tensor) -> torch.Tensor:
    """x in the default (NCHW / NCDHW) layout, counting inputs that arrived in another one."""
    CALLS["not_nchw"] += not x.is_contiguous()
    return x.contiguous()


def _plain_conv3d_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What conv3d_depth_taps replaces: a 'same' conv3d, returned as [B, D, H, W, Cout] float32."""
    CALLS["conv3d"] += 1
    return F.conv3d(_nchw(x), weight, bias, padding=weight.shape[-1] // 2).float().permute(0, 2, 3, 4, 1)


def _plain_conv2d_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What conv2d_point_taps replaces: a 'same' conv2d, float32 (its input laid out NCHW first, as the
    reference's reshape of the prediction is)."""
    CALLS["conv2d"] += 1
    return F.conv2d(x.contiguous(), weight, bias, padding=weight.shape[-1] // 2).float()


def _plain_pool(x: torch.Tensor) -> torch.Tensor:
    """What avg_pool_hw replaces: avg_pool3d over height and width."""
    CALLS["pool"] += 1
    return F.avg_pool3d(_nchw(x), (1, 2, 2))


@contextmanager
def plain_eager() -> Iterator[None]:
    """While inside: the rewritten layers are plain convolutions and channels-last requests keep NCHW."""
    from ditto_fast.models import blocks, warp

    saved = (warp.conv3d_depth_taps, warp.conv2d_point_taps, blocks.avg_pool_hw, torch.channels_last,
             torch.channels_last_3d)
    warp.conv3d_depth_taps, warp.conv2d_point_taps = _plain_conv3d_taps, _plain_conv2d_taps
    blocks.avg_pool_hw = _plain_pool
    torch.channels_last = torch.channels_last_3d = torch.contiguous_format
    try:
        yield
    finally:
        (warp.conv3d_depth_taps, warp.conv2d_point_taps, blocks.avg_pool_hw, torch.channels_last,
         torch.channels_last_3d) = saved


def _plain_seconds(ckpt: Path, frames: int) -> float:
    """Seconds per frame of warp + decode, plain fp32 eager, batch 1, from a cold start (as in a render);
    checked to run the plain layers on NCHW tensors and to give the fp32 render networks' numbers."""
    from ditto_fast import models
    from ditto_fast.checkpoints import find_checkpoints

    files = find_checkpoints(ckpt).files
    warp_net = models.load("warp_network", files["warp_network"], "cpu", fuse=False)
    decoder = models.load("decoder", files["decoder"], "cpu", fuse=False)
    gen = torch.Generator().manual_seed(0)
    dm = warp_net.dense_motion_network
    c, d = dm.compress.in_channels, dm.occlusion.in_channels // dm.hourglass.out_filters    # 32, 16 at full size
    f_s = torch.randn(1, c, d, 64, 64, generator=gen)
    kp_s = 0.3 * torch.randn(1, 21, 3, generator=gen)
    kp_d = kp_s + 0.03 * torch.randn(1, 21, 3, generator=gen)
    CALLS.update(dict.fromkeys(CALLS, 0))
    with plain_eager(), torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(frames):
            first = decoder(warp_net(f_s, kp_s, kp_d))
        seconds = (time.perf_counter() - t0) / frames
    if not (CALLS["conv3d"] == CALLS["conv2d"] == frames and CALLS["pool"] and CALLS["not_nchw"] == 0
            and first.is_contiguous()):
        raise AssertionError(f"the plain arm did not run as meant: {CALLS}")
    # the same numbers as the networks the render uses (folded, rewritten, channels-last, fp32)
    warp_fast = models.load("warp_network", files["warp_network"], "cpu")
    decoder_fast = models.load("decoder", files["decoder"], "cpu")
    with torch.inference_mode():
        diff = float((decoder_fast(warp_fast(f_s, kp_s, kp_d)) - first).abs().max())
    if diff > 2e-3:
        raise AssertionError(f"the plain arm computes something else: max difference {diff:.2g}")
    return seconds


def conv_throughput(dtype: torch.dtype, repeats: int = 3) -> float:
    """GFLOP/s of a 3x3 conv 256 -> 256 channels on 128x128 (the decoder's size), channels-last."""
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).to(dtype=dtype, memory_format=torch.channels_last)
    x = torch.randn(1, 256, 128, 128).to(dtype=dtype, memory_format=torch.channels_last)
    with torch.inference_mode():
        conv(x)
        t0 = time.perf_counter()
        for _ in range(repeats):
            conv(x)
        dt = (time.perf_counter() - t0) / repeats
    return 2 * 256 * 256 * 9 * 128 * 128 / dt / 1e9


PLAIN_CHILD = """
import json, sys
sys.path.insert(0, {scripts!r})
{policy}
from bench_cpu_speed import _plain_seconds
print(json.dumps({{"seconds": _plain_seconds({ckpt!r}, {frames})}}))
"""


def _plain_child(ckpt: Path, frames: int, policy: str = "") -> float:
    """_plain_seconds in a fresh process (glibc's default malloc, as the reference runs; or `policy`)."""
    code = PLAIN_CHILD.format(scripts=str(Path(__file__).parent), policy=policy, ckpt=str(ckpt), frames=frames)
    return run_child(code)[0]["seconds"]


def run(out_json: str | None = None, quick: bool = False) -> dict:
    from ditto_fast.engine.precision import BF16_FLAGS, cpu_kind

    kind = cpu_kind()
    ckpt = checkpoints(tiny=False)
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())     # the render child: the same threads
    frames, rounds = (2, 1) if quick else (8, 3)
    autos, plains = [], []
    for _ in range(rounds):     # the arms alternate; each keeps its best round (this host's speed drifts)
        timings, _ = _render(anchor(25), ckpt, speech(frames / 25), "cpu", "auto")
        autos.append(timings["stages"]["render"] / timings["frames"])
        plains.append(_plain_child(ckpt, frames))
    auto_s, plain_s = min(autos), min(plains)
    plain_our_malloc = _plain_child(ckpt, frames, CLI_MALLOC)      # for the record: the plain arm on our malloc policy
    native_bf16 = bool(set(kind["flags"]) & set(BF16_FLAGS))
    gflops = {"fp32": conv_throughput(torch.float32), "bf16": conv_throughput(torch.bfloat16, 1 if quick else 2)}
    result = {"cpu": kind["model"], "flags": kind["flags"], "native_bf16": native_bf16,
              "auto_precision": timings["precision"], "precision_choice": timings["precision_choice"],
              "auto_batch_size": timings["batch_size"], "batch_choice": timings["batch_choice"],
              "frames": timings["frames"], "auto_warp_decode_s_per_frame": auto_s,
              "plain_fp32_eager_s_per_frame": plain_s, "speedup": plain_s / auto_s, "target_speedup": 2.5,
              "rounds": {"auto": autos, "plain": plains}, "plain_with_our_malloc_s_per_frame": plain_our_malloc,
              "conv3x3_gflops": gflops,
              "limit_s_per_frame": {k: FLOP_PER_FRAME / (v * 1e9) for k, v in gflops.items()},
              "default_path_limit_s_per_frame": {k: FOLDED_FLOP_PER_FRAME / (v * 1e9) for k, v in gflops.items()}}
    print(f"CPU: {kind['model']} ({', '.join(kind['flags']) or 'no bf16/AMX flags'})")
    print(f"warp + decode, full size, s/frame: default render ({timings['precision']}: "
          f"{timings['precision_choice']}; batch {timings['batch_choice']}) {auto_s:.2f}; plain fp32 eager "
          f"batch 1 {plain_s:.2f} "
          f"-> {result['speedup']:.2f}x (target >= 2.5x)" + (f"; best of {rounds} rounds, alternating: default "
          + " / ".join(f"{v:.2f}" for v in autos) + ", plain " + " / ".join(f"{v:.2f}" for v in plains)
          if rounds > 1 else ""))
    print(f"  (plain fp32 eager in a process with ditto-fast's malloc policy, one round: {plain_our_malloc:.2f} -> "
          f"{plain_our_malloc / auto_s:.2f}x)")
    print("3x3 conv 256->256 at 128x128, channels-last: " + ", ".join(
        f"{k} {v:.0f} GFLOP/s (warp + decode at that rate: {result['limit_s_per_frame'][k]:.2f} s/frame plain, "
        f"{result['default_path_limit_s_per_frame'][k]:.2f} in the default path)"
        for k, v in gflops.items()) + ("" if native_bf16 else "; bf16 is emulated on this CPU"))
    return save(out_json, result)
