"""Render benchmark: ms per frame per stage and end-to-end fps at 1080p; peak RSS for short vs long audio."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench_common import CACHE, anchor, checkpoints, run_child, save, speech

REGISTER = """
import json
from ditto_fast.avatar.register import register_avatar
register_avatar({video!r}, name="bench", force=True, checkpoints={ckpt!r}, device={device!r})
print(json.dumps({{}}))
"""

# the malloc policy `ditto-fast render` and `batch` set (a line of child code)
CLI_MALLOC = "from ditto_fast.core.memory import reuse_freed_memory; reuse_freed_memory()"

# the loop's ffmpeg I/O split in two: time in the plate reader's frame() and in the encoder's write()
SPLIT_WRITE = """
import time
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.encoding.writer import VideoWriter
io_s = dict(plate_read=0.0, encoder_write=0.0)
def _timed(cls, name, key):
    inner = getattr(cls, name)
    def timed(*a):
        t = time.perf_counter()
        try:
            return inner(*a)
        finally:
            io_s[key] += time.perf_counter() - t
    setattr(cls, name, timed)
_timed(PlateReader, "frame", "plate_read")
_timed(VideoWriter, "write", "encoder_write")
"""

# the putback split into its parts (ms inside YuvPutback.__call__): where a render's putback goes beyond
# bench_putback's figure (the real crops, the driven face mask, the plate's cache state)
SPLIT_PUTBACK = """
from ditto_fast.render import putback as _pb, face_mask as _fm, seam as _seam
putback_s = {{}}
def _part(owner, name, key):
    inner = getattr(owner, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            putback_s[key] = putback_s.get(key, 0.0) + time.perf_counter() - t
    setattr(owner, name, timed)
for _owner, _name, _key in ((_pb.YuvPutback, "_crop_planes", "crop_conversion"), (_fm.FaceMask, "__call__", "face_mask"),
                            (_seam.SeamMatch, "__call__", "seam_correction"), (_seam.GainMatch, "__call__", "colour_gain"),
                            (_pb, "_upsampled", "correction_upsampling"),
                            (_pb.cv2, "warpAffine", "warps"), (_pb._blend, "blend_masked_planes", "blend_kernel")):
    _part(_owner, _name, _key)
"""

CHILD = """
import json
""" + CLI_MALLOC + SPLIT_WRITE + SPLIT_PUTBACK + """
from ditto_fast.engine.renderer import Renderer, stage_table
from ditto_fast.engine.request import RenderRequest
import torch
threads_used = torch.get_num_threads()
engine = Renderer({ckpt!r}, device={device!r}, precision={precision!r}, batch_size={batch!r})
res = engine.render(RenderRequest("bench", {audio!r}, {out!r}, blend={blend!r}))
import resource
ru = resource.getrusage(resource.RUSAGE_CHILDREN)     # the ffmpeg processes: audio decode, plate decode, encode
res.timings["ffmpeg_cpu_s"] = ru.ru_utime + ru.ru_stime
res.timings["io_s"] = io_s
res.timings["putback_split_s"] = putback_s
res.timings["torch_threads"] = threads_used
print(stage_table(res.timings), flush=True)
print(json.dumps(res.timings))
"""


def _render(video, ckpt, audio, device, precision, batch="auto", threads=0, blend="seamless"
            ) -> tuple[dict, float]:
    """Register in one child, render in another; returns the render's profile and its peak RSS (MiB).
    `threads`: torch's intra-op threads in the render (0 = torch's choice), given to it as OMP_NUM_THREADS.
    Each run has a fresh store but shares the batch-size probe's verdicts (CUDA), as one machine does."""
    with tempfile.TemporaryDirectory() as home:
        (CACHE / "probes").mkdir(parents=True, exist_ok=True)
        Path(home, "probes").symlink_to(CACHE / "probes")
        run_child(REGISTER.format(video=str(video), ckpt=str(ckpt), device=device), {"DITTO_FAST_HOME": home})
        return run_child(CHILD.format(video=str(video), ckpt=str(ckpt), audio=str(audio), device=device,
                                      precision=precision, batch=batch, blend=blend,
                                      out=f"{home}/out.mp4"),
                         {"DITTO_FAST_HOME": home, **({"OMP_NUM_THREADS": str(threads)} if threads else {})})


def _main_thread(threads: int, blend: str = "seamless") -> dict:
    """The loop's own work around the networks: tiny networks, a 1080p video avatar, 100 frames, with
    `threads` intra-op threads for torch (0 = torch's choice) and `blend`; prints and returns the figures."""
    profile, _ = _render(anchor(50), checkpoints(True), speech(4.0), "cpu", "fp32", batch=1, threads=threads,
                         blend=blend)
    n, st = profile["frames"], profile["stages"]
    main = {k: round(1000 * st[k] / n, 2) for k in ("stitch", "putback", "write")}
    cpu = {k: round(1000 * profile["stages_cpu"][k] / n, 2) for k in main}
    r = {"torch_threads": profile["torch_threads"], "blend": profile["blend"], "frames": n, "ms_per_frame": main,
         "sum_ms": round(sum(main.values()), 2), "thread_cpu_ms_per_frame": cpu,
         "thread_cpu_sum_ms": round(sum(cpu.values()), 2),
         "ffmpeg_cpu_ms_per_frame": round(1000 * profile["ffmpeg_cpu_s"] / n, 2),
         "render_ms_per_frame": round(1000 * st["render"] / n, 2),
         "write_split_ms_per_frame": {k: round(1000 * v / n, 2) for k, v in profile["io_s"].items()},
         "putback_split_ms_per_frame": {k: round(1000 * v / n, 2) for k, v in profile["putback_split_s"].items()},
         "wall_ms_per_frame": round(1000 * profile["wall_seconds"] / n, 2), "target_ms": 12.0}
    print(f"\nmain thread outside the networks ({blend} putback, tiny networks, torch on {r['torch_threads']} thread(s), "
          f"1920x1080 video avatar, {n} frames), ms/frame:")
    print("  wall:              " + ", ".join(f"{k} {v:.1f}" for k, v in main.items())
          + f" = {r['sum_ms']:.1f} (target <= 12)")
    print("  the thread's CPU:  " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
          + f" = {r['thread_cpu_sum_ms']:.1f} (write's wall less its CPU = waiting for ffmpeg)")
    print("  write, split:      " + ", ".join(f"{k} {v:.1f}" for k, v in r["write_split_ms_per_frame"].items()))
    split = r["putback_split_ms_per_frame"]
    print("  putback, split:    " + ", ".join(f"{k} {v:.2f}" for k, v in split.items())
          + f"; the rest (Python, small arrays) {main['putback'] - sum(split.values()):.2f}")
    print(f"  ffmpeg's own CPU (plate decode + encode): {r['ffmpeg_cpu_ms_per_frame']:.1f}")
    print(f"  the whole render: {r['wall_ms_per_frame']:.1f} ms/frame wall, of it the tiny networks "
          f"{r['render_ms_per_frame']:.1f}")
    return r


def run(out_json: str | None, quick: bool = False, memory: bool = True, speed: bool = True,
        tiny: bool = False) -> dict:
    """Full-size (or tiny when quick) render at 1080p with stage table; the loop's work around the networks with
    tiny networks, torch on its own choice of threads and on one (the tiny networks' fastest here, and the
    other cores left to ffmpeg as on a GPU machine); tiny-network RSS for 10 s vs 120 s. `tiny`: only the
    tiny-network parts."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result: dict = {"device": device}
    tiny_speed = quick and device == "cpu"     # tiny networks for the speed runs too
    ckpt = checkpoints(tiny_speed)
    seconds = 2.0 if quick or device == "cpu" else 10.0
    for precision in (("fp16", "fp32") if device == "cuda" else ("fp32", "bf16")) if speed and not tiny else ():
        profile, rss = _render(anchor(50), ckpt, speech(seconds), device, precision)
        n = profile["frames"]
        per = {k: 1000 * v / n for k, v in profile["stages"].items()}
        per_frame_loop = {k: per[k] for k in ("motion", "stitch", "render", "putback", "write")}
        result[precision] = {"networks": "tiny" if tiny_speed else "full", "frames": n, "fps": profile["fps"],
                             "wall_s": profile["wall_seconds"], "ms_per_frame": per, "peak_rss_mib": rss,
                             "non_render_loop_ms": sum(v for k, v in per_frame_loop.items() if k != "render")}
        result[precision]["batch_size"] = profile["batch_size"]
        print(f"\n{precision} ({result[precision]['networks']} networks, 1920x1080, {n} frames, batch "
              f"{profile['batch_choice']}): "
              f"{profile['fps']:.2f} fps end to end, wall {profile['wall_seconds']:.1f} s")
        for k, v in per.items():
            print(f"  {k:<16}{v:9.1f} ms/frame")
        print("  (write = ffmpeg I/O: frames to the encoder and background frames from the plate decoder)")
        print(f"  per-frame work other than warp+decode: {result[precision]['non_render_loop_ms']:.1f} ms/frame")
    if speed:       # torch's own choice of threads, and one thread where its choice is more
        one = torch.get_num_threads() > 1
        runs = [_main_thread(0)] + ([_main_thread(1)] if one else []) + [_main_thread(1 if one else 0, "feather")]
        result["main_thread_tiny"] = {f"threads_{r['torch_threads']}_{r['blend']}": r for r in runs}
    if memory:
        tiny_ckpt = checkpoints(True)
        small = anchor(25, size=(640, 360))
        rss = {}
        for sec in ((10, 60) if quick else (10, 120)):
            profile, rss[sec] = _render(small, tiny_ckpt, speech(sec), "cpu", "fp32", batch=1)
        a, b = rss.values()
        result["memory"] = {"peak_rss_mib": rss, "growth": b / a - 1}
        print("\npeak RSS, tiny networks, 640x360: " + ", ".join(f"{s} s audio {m:.0f} MiB" for s, m in rss.items())
              + f" -> {100 * (b / a - 1):+.1f}% (target within 15%)")
    return save(out_json, result)
