"""The plate against the source on a grainy moving 720p30 camera clip (H.264 High, B-frames, 1 s GOP, 20 Mbit/s,
untagged; grain of std 3 levels new in every frame; a body moving 4 px a frame below the face): for the plate
before (x264 ultrafast crf 16, a keyframe every 25), the source's own stream copied (today's plate for such a clip),
and lossless H.264 (today's plate where a copy is refused, here made from the same frames): size on disk, the
luma error against the source in the moving body and on the still set (Y planes as coded), and the cost of reading
it back as a render does (mirror order, blocks decoded ahead: ffmpeg's CPU and the wall time per frame). Also what
registration pays for a copy: the copy itself, and reading it back to check it.
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from bench_common import save

SIZE, FPS = (1280, 720), 30


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _luma(path: Path) -> np.ndarray:
    """[N, H, W] uint8: every frame's Y plane as coded."""
    w, h = SIZE
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "rawvideo",
                          "-pix_fmt", "yuv420p", "pipe:1"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, h * 3 // 2, w)[:, :h]


def _read_back(path: Path, n: int) -> dict:
    """ffmpeg CPU and wall ms per frame to read `path` as a render does: 2n frames in mirror order, blocks ahead."""
    from ditto_fast.avatar.plate import PlateReader
    from ditto_fast.media.timeline import mirror_index

    order = [mirror_index(i, n) for i in range(2 * n)]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    with PlateReader(path, n, pix_fmt="planes", order=order) as reader:
        for k in order:
            reader.frame(k)
    wall = time.perf_counter() - t0
    return {"decode_cpu_ms_per_frame": 1000 * (_children_cpu() - cpu0) / len(order),
            "read_wall_ms_per_frame": 1000 * wall / len(order)}


def run(out_json: str | None = None, quick: bool = False) -> dict:
    from synthetic import moving_body_frames, write_camera_clip

    from ditto_fast.avatar.plate import plate_encoder_args
    from ditto_fast.avatar.plate_copy import plan_plate
    from ditto_fast.avatar.source import SourceFrames, open_source

    ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    n = 60 if quick else 150
    w, h = SIZE
    result: dict = {"clip": f"{w}x{h} {FPS} fps, {n} frames, H.264 High 20 Mbit/s, GOP 30, grain std 3, untagged",
                    "plates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = write_camera_clip(tmp / "camera.mp4", moving_body_frames(n, SIZE, grain=3.0), fps=FPS, matrix=None)
        info, _ = open_source(src, 1920)
        # today's plate for this clip: the copy, as registration makes and checks it
        t0 = time.perf_counter()
        made = plan_plate(info, tmp / "copy.mp4")
        copy_s = time.perf_counter() - t0
        with SourceFrames(info, ring=3, plate=made.encode_to, frame_sums=made.sums) as reader:
            count = sum(1 for _ in reader)
            reader.finish()
        cpu0, t0 = _children_cpu(), time.perf_counter()
        note = made.finish(info, count)
        result["registration"] = {"plate": made.how, "note": note, "copy_s": copy_s,
                                  "check_wall_ms_per_frame": 1000 * (time.perf_counter() - t0) / count,
                                  "check_decode_cpu_ms_per_frame": 1000 * (_children_cpu() - cpu0) / count}
        # the plate before, and the lossless one, each encoded from the source's frames as registration reads them
        before = [a for a in plate_encoder_args()]
        before[before.index("-qp"):before.index("-qp") + 2] = ["-crf", "16"]
        encodes = {"before: x264 ultrafast crf 16": before, "lossless: x264 ultrafast qp 0": plate_encoder_args()}
        paths = {"copy of the source's stream": tmp / "copy.mp4"}
        for name, args in encodes.items():
            path = tmp / f"{len(paths)}.mp4"
            cpu0 = _children_cpu()
            subprocess.run([ffmpeg, "-v", "error", "-threads", "1", "-i", str(src), *args, str(path)], check=True)
            result.setdefault("decode_encode_cpu_ms_per_frame", {})[name] = 1000 * (_children_cpu() - cpu0) / n
            paths[name] = path
        want = _luma(src).astype(np.int16)
        body, still = np.s_[:, int(h * 0.7):h - 8, 8:w - 8], np.s_[:, 8:h // 4, 8:w // 4]
        print(f"{result['clip']}; source {src.stat().st_size / n * FPS / 2**20:.1f} MiB/s")
        print(f"{'plate':32s} {'MiB/s':>6s} {'MiB/frame':>9s} {'decode CPU ms/f':>15s} {'read wall ms/f':>14s} "
              f"{'|dY| moving (max)':>18s} {'|dY| still':>10s}")
        for name, path in [("source (as decoded)", src), *paths.items()]:
            got = _luma(path)[:n].astype(np.int16)
            moving = np.abs(got[body] - want[body]).mean(axis=(1, 2))
            row = {"bytes": path.stat().st_size, "mib_per_s": path.stat().st_size / n * FPS / 2**20,
                   "luma_moving_mean": float(moving.mean()), "luma_moving_max_frame": float(moving.max()),
                   "luma_still_mean": float(np.abs(got[still] - want[still]).mean()), **_read_back(path, n)}
            result["plates"][name] = row
            print(f"{name:32s} {row['mib_per_s']:6.1f} {row['bytes'] / n / 2**20:9.3f} "
                  f"{row['decode_cpu_ms_per_frame']:15.1f} {row['read_wall_ms_per_frame']:14.1f} "
                  f"{row['luma_moving_mean']:8.2f} ({row['luma_moving_max_frame']:.2f}) {row['luma_still_mean']:10.2f}")
        reg = result["registration"]
        print(f"registration: {reg['plate']}; copy {reg['copy_s']:.2f} s, check {reg['check_wall_ms_per_frame']:.1f} "
              f"ms/frame ({reg['check_decode_cpu_ms_per_frame']:.1f} ms ffmpeg CPU); decoding the source and encoding a "
              "plate, one thread: " + ", ".join(f"{k.split(':')[0]} {v:.1f} ms/frame"
                                                for k, v in result["decode_encode_cpu_ms_per_frame"].items()))
    return save(out_json, result)
