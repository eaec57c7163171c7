"""The anchor's picture as shot, per kind of source: registration and render time per frame (tiny networks: the
picture work, not the networks), plate size on disk per second, and the six colour patches' error (mean/max
levels) before (as the code read these sources until the picture was kept as shot) and now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from bench_common import REPO, checkpoints, save, speech
from synthetic import patch_error, patched_frames

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709"]
TO_709 = "scale=out_color_matrix=bt709:out_range=tv"
PQ = ("scale=out_color_matrix=bt709:out_range=tv,format=yuv444p,setparams=colorspace=bt709:color_primaries=bt709:"
      "color_trc=bt709:range=tv,zscale=t=linear:npl=203,format=gbrpf32le,"
      "zscale=p=bt2020:t=smpte2084:m=bt2020nc:r=tv:npl=203,format=yuv420p10le")
# name: (display size, ffmpeg output args from RGB at the display size, extra register args, "before" register args)
KINDS = {
    "HD 1080p 8-bit 4:2:0, tagged": ((1920, 1080), ["-vf", f"{TO_709},format=yuv420p", "-c:v", "libx264", "-crf", "10",
                                                     *TAGS], [], None),
    "HD 1080p untagged (BT.709 pixels)": ((1920, 1080), ["-vf", f"{TO_709},format=yuv420p,setparams=colorspace=unknown",
                                                         "-c:v", "libx264", "-crf", "10"], [], ["--source-colour", "bt601"]),
    "HDV 1440x1080, SAR 4:3": ((1920, 1080), ["-vf", f"{TO_709},scale=1440:1080,format=yuv420p,setsar=4/3",
                                              "-c:v", "libx264", "-crf", "10", *TAGS], [], None),
    "PAL 720x576, SAR 64:45": ((1024, 576), ["-vf", "scale=720:576:out_color_matrix=bt601:out_range=tv,setsar=64/45,"
                                             "format=yuv420p", "-c:v", "libx264", "-crf", "10", "-colorspace",
                                             "smpte170m"], [], None),
    "HDR PQ 10-bit HEVC 1080p": ((1920, 1080), ["-vf", PQ, "-c:v", "libx265", "-crf", "4", "-x265-params",
                                                "log-level=error:colorprim=bt2020:transfer=smpte2084:colormatrix=bt2020nc"],
                                 [], None),
    "ProRes 422 HQ 10-bit 1080p": ((1920, 1080), ["-vf", f"{TO_709},format=yuv422p10le", "-c:v", "prores_ks",
                                                  "-profile:v", "3", *TAGS], [], None),
    "UHD 2160p, --max-size 3840": ((3840, 2160), ["-vf", f"{TO_709},format=yuv420p", "-c:v", "libx264", "-crf", "10",
                                                  *TAGS], ["--max-size", "3840"], None),
}


def _source(path: Path, size: tuple[int, int], args: list[str], n: int) -> Path:
    w, h = size
    frames = patched_frames(size, n)
    subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", "25",
                    "-i", "pipe:0", *args, str(path)], input=b"".join(f.tobytes() for f in frames), check=True)
    return path


def _first_rgb(path: Path, index: int = 3) -> np.ndarray:
    gen = imageio_ffmpeg.read_frames(str(path))
    w, h = next(gen)["size"]
    for i, f in enumerate(gen):
        if i == index:
            return np.frombuffer(f, np.uint8).reshape(h, w, 3)
    raise RuntimeError(f"{path}: fewer than {index + 1} frames")


def _cli(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", *args], capture_output=True, text=True, env=env,
                       cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(f"ditto-fast {' '.join(args[:2])} failed: {r.stderr[-500:]}")
    return time.perf_counter() - t0


def _mislabelled_hdr(src: Path, size: tuple[int, int]) -> np.ndarray:
    """What the code made of a PQ source before: the matrix converted, the PQ code values shown as SDR."""
    raw = subprocess.run([FFMPEG, "-v", "error", "-i", str(src), "-vf", "select=eq(n\\,3),scale=in_color_matrix=bt2020:"
                          "out_color_matrix=bt709", "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(size[1], size[0], 3)


def _one(name: str, work: Path, ckpt: Path, audio: Path, n: int, seconds: float) -> dict:
    size, args, extra, before_args = KINDS[name]
    src = _source(work / "src.mov", size, args, n)
    env = dict(os.environ, DITTO_FAST_HOME=str(work / "home"), DITTO_FAST_CHECKPOINTS=str(ckpt))
    reg_s = _cli(["register", str(src), "--name", "a", "--quiet", "--force", *extra], env)
    plate = next((work / "home").rglob("plate.mp4"))
    line = subprocess.run([FFMPEG, "-hide_banner", "-i", str(plate)], capture_output=True, text=True).stderr
    layout = next((w for w in ("yuv422p10le", "yuv420p10le", "yuv422p", "yuv420p") if f"{w}(" in line), "?")
    out, prof = work / "out.mov", work / "timings.json"
    codec = ["--codec", "prores"] if "ProRes" in name else []
    render_s = _cli(["render", "--avatar", "a", "--audio", str(audio), "-o", str(out), "--quiet", "--timings",
                     str(prof), *codec], env)
    timings = json.loads(prof.read_text())
    frames = int(timings.get("frames") or round(seconds * 25))
    stages = timings["stages"]
    after = patch_error(_first_rgb(out))
    if before_args is not None:
        _cli(["register", str(src), "--name", "b", "--quiet", "--force", *extra, *before_args], env)
        _cli(["render", "--avatar", "b", "--audio", str(audio), "-o", str(work / "before.mov"), "--quiet", *codec], env)
        before = patch_error(_first_rgb(work / "before.mov"))
    elif "HDR" in name:
        before = patch_error(_mislabelled_hdr(src, size))
    else:
        before = None
    out_size = tuple(_first_rgb(out, 0).shape[1::-1])
    return {"registered_ms_per_frame": 1000 * reg_s / n, "render_ms_per_frame": 1000 * render_s / frames,
            "render_frame_loop_ms_per_frame": 1000 * sum(stages.get(k, 0) for k in ("stitch", "render", "putback",
                                                                                     "write")) / frames,
            "plate": layout, "plate_mb_per_s": plate.stat().st_size / 1e6 / (n / 25), "output_size": out_size,
            "patches_before": before, "patches_after": after}


def run(out_json: str | None, quick: bool = False) -> dict:
    """Register and render each kind of source (tiny networks) and print the table."""
    ckpt = checkpoints(tiny=True)
    n, seconds = (10, 1.0) if quick else (25, 2.0)
    audio = speech(seconds)
    result = {"networks": "tiny", "frames_registered": n, "seconds_rendered": seconds, "kinds": {}}
    for name in KINDS:
        with tempfile.TemporaryDirectory() as d:
            result["kinds"][name] = _one(name, Path(d), ckpt, audio, n, seconds)
    print(f"{'source':36} {'plate':12} {'MB/s':>6} {'reg ms/f':>9} {'render ms/f':>11} {'loop ms/f':>9} "
          f"{'output':>10}  patches before -> now (mean/max levels)")
    for name, r in result["kinds"].items():
        b = "-" if r["patches_before"] is None else "{:.1f}/{:.0f}".format(*r["patches_before"])
        a = "{:.1f}/{:.0f}".format(*r["patches_after"])
        print(f"{name:36} {r['plate']:12} {r['plate_mb_per_s']:6.1f} {r['registered_ms_per_frame']:9.0f} "
              f"{r['render_ms_per_frame']:11.0f} {r['render_frame_loop_ms_per_frame']:9.1f} "
              f"{'x'.join(map(str, r['output_size'])):>10}  {b} -> {a}")
    print("reg/render ms/f: whole CLI calls (start-up and model loading included) over the frames; loop: the frame\n"
          "loop's stitch + render + putback + write stages from --timings (tiny networks)")
    return save(out_json, result)
