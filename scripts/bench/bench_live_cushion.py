"""The live clock's cushion, before and now: the clock used to start a window and two frames after the first frame
was ready; now two frames and that frame's compute again (`live/stats.clock_cushion`). Each case is one in-process
session (tiny networks, 10 steps, 25 fps, the warp + decode standing in for a GPU's: the real one's first crop again
in 5 ms, so that the clock and the window loop's lumps are what is tried, not the CPU's rendering speed), speech
pushed in 20 ms pieces at the pace it is spoken after 1.5 s of silence; its delay, cushion and frames on time.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import wave
from pathlib import Path

import numpy as np

from bench_common import anchor, checkpoints, save, speech


class _FastFused:
    """The warp + decode as a GPU would time it here: the real one's first crop, again, in 5 ms."""

    def __init__(self, real):
        self.real, self.crop = real, None

    def __call__(self, features, x_s, x_d):
        if self.crop is None:
            self.crop = self.real(features, x_s, x_d)
        time.sleep(0.005)
        return self.crop


def _session(engine, overlap: int, wav: Path) -> dict:
    from ditto_fast.live.frame_output import FrameOutput
    from ditto_fast.live.options import LiveRequest
    from ditto_fast.live.pushed import PushedSource
    from ditto_fast.live.start import plate_pix_fmt, stream_live

    with wave.open(str(wav), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    source = PushedSource()

    def speak() -> None:
        time.sleep(1.5)
        t0 = time.monotonic()
        for k, i in enumerate(range(0, len(pcm), 320)):
            source.push(pcm[i:i + 320])
            time.sleep(max(0.0, t0 + (k + 1) * 0.02 - time.monotonic()))
        source.end()

    threading.Thread(target=speak, daemon=True).start()
    out = lambda avatar, settings: FrameOutput(avatar.size, plate_pix_fmt(avatar), lambda i, rgb, a: None)  # noqa: E731
    request = LiveRequest(avatar="anchor", steps=10, overlap=overlap)
    return stream_live(engine, request, source, True, lambda line: None, output=out,
                       fused=_FastFused(engine.fused.twin()))


def run(out_json: str | None = None, quick: bool = False) -> dict:
    import ditto_fast.live.session as session
    from ditto_fast import Renderer
    from ditto_fast.avatar.register import register_avatar
    from ditto_fast.media.rates import MOTION_FPS

    os.environ["DITTO_FAST_HOME"] = tempfile.mkdtemp(prefix="bench_cushion_")
    ckpt = checkpoints(tiny=True)
    register_avatar(anchor(25, (960, 540)), name="anchor", checkpoints=ckpt, device="cpu")
    engine = Renderer(ckpt, device="cpu", precision="fp32")
    wav, now = speech(6.0), session.clock_cushion
    ways = {"before": lambda window, compute: (window + 2) / MOTION_FPS, "now": now}
    rows = []
    try:
        for overlap in (70, 75):
            for _ in range(1 if quick else 2):
                for way, cushion in ways.items():
                    session.clock_cushion = cushion
                    s = _session(engine, overlap, wav)
                    b, f = s["latency_budget_ms"], s["frames"]
                    rows.append({"overlap": overlap, "way": way, "delay_ms": b["delay"], "cushion_ms": b["cushion"],
                                 "first_frame_latency_s": s["first_frame_latency_s"], "latency_s": s["latency_s"],
                                 "frames": f})
                    print(f"overlap {overlap} {way:>6}: delay {b['delay']:6.0f} ms (cushion {b['cushion']:4.0f}), "
                          f"{f['on_time']} of {f['sent']} frames on time, {f['late']} late")
    finally:
        session.clock_cushion = now
    return save(out_json, {"cases": rows})
