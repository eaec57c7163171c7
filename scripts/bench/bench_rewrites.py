"""The rewritten layers against the plain convolutions they replace, on this CPU.

The mask head (a 7x7x7 3D conv to 22 channels) runs as one 2D conv over depth slices with the depth taps
in the output channels (`conv3d_depth_taps`), and the occlusion head (a 7x7 conv of 2272 channels to 1) as
1x1 convs to every tap (`conv2d_point_taps`). Both were shaped for AMX/AVX-512; this says, per precision,
whether they still pay on the CPU at hand (full-size shapes, random weights, best of a few runs); bf16 only
where the CPU does bf16 arithmetic (elsewhere it is emulated and `auto` never picks it). The decoder's last
block computes its SPADE norms' first conv on the 64x64 feature instead of on its 4x nearest upsample
(`NearestUpConv3x3`: the same sums with fewer multiply-adds, for every kind).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from bench_common import save
from ditto_fast import models
from ditto_fast.models.blocks import NearestUpConv3x3, conv2d_point_taps, conv3d_depth_taps
from ditto_fast.engine.precision import BF16_FLAGS, cpu_kind


def _best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(out_json: str | None = None, quick: bool = False) -> dict:
    warp = models.build("warp_network").eval()
    shared = models.build("decoder").eval().up_1.norm_0.mlp_shared     # conv 256 -> 128 at 256x256, then ReLU
    dm = warp.dense_motion_network
    cp, d = dm.hourglass.out_filters, warp.third.conv.in_channels // dm.compress.in_channels
    repeats = 2 if quick else 3
    result: dict = {"cpu": cpu_kind(), "threads": torch.get_num_threads(), "layers": {}}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        native_bf16 = any(f in result["cpu"]["flags"] for f in BF16_FLAGS)
        for dtype in (torch.float32, torch.bfloat16) if native_bf16 else (torch.float32,):
            name = str(dtype).removeprefix("torch.")
            pred = torch.randn(1, cp, d, 64, 64, generator=gen).to(dtype)
            mw, mb = dm.mask.weight.to(dtype), dm.mask.bias.to(dtype)
            pad3 = mw.shape[-1] // 2
            flat = pred.reshape(1, cp * d, 64, 64)
            ow, ob = dm.occlusion.weight.to(dtype), dm.occlusion.bias.to(dtype)
            pad2 = ow.shape[-1] // 2
            seg = torch.randn(1, shared[0].in_channels, 64, 64, generator=gen).to(
                dtype=dtype, memory_format=torch.channels_last)
            plain_shared = shared.to(dtype)
            folded_shared = NearestUpConv3x3(shared[0], 4).to(dtype)
            rows = {
                "mask: plain conv3d": lambda: F.conv3d(pred, mw, mb, padding=pad3),
                "mask: plain conv3d, channels_last_3d": lambda: F.conv3d(
                    pred.contiguous(memory_format=torch.channels_last_3d),
                    mw.contiguous(memory_format=torch.channels_last_3d), mb, padding=pad3),
                "mask: conv3d_depth_taps": lambda: conv3d_depth_taps(pred, mw, mb),
                "occlusion: plain conv2d": lambda: F.conv2d(flat, ow, ob, padding=pad2),
                "occlusion: plain conv2d, channels_last": lambda: F.conv2d(
                    flat.contiguous(memory_format=torch.channels_last),
                    ow.contiguous(memory_format=torch.channels_last), ob, padding=pad2),
                "occlusion: conv2d_point_taps": lambda: conv2d_point_taps(flat, ow, ob),
                "SPADE conv of the 4x upsample: plain": lambda: plain_shared(
                    F.interpolate(seg, scale_factor=4.0, mode="nearest")),
                "SPADE conv of the 4x upsample: NearestUpConv3x3": lambda: folded_shared(seg),
            }
            result["layers"][name] = {k: round(_best(fn, repeats), 4) for k, fn in rows.items()}
    print(f"{result['cpu']['model']} ({', '.join(result['cpu']['flags'])}), {result['threads']} threads; "
          "seconds per call, best of a few:")
    for name, rows in result["layers"].items():
        for k, v in rows.items():
            print(f"  {name:<9} {k:<50} {v:8.3f}")
    return save(out_json, result)


if __name__ == "__main__":
    run()
