"""Programme loudness: integrated loudness (ITU-R BS.1770-4, gated), true peak and DC offset, measured by ffmpeg's
ebur128 and astats (delivery/leveling.py takes a clip's speech to a profile's target with it)."""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg

from ditto_fast.core.errors import InputError

QUIET_LUFS = -70.0              # at or below: silent or too quiet to level (BS.1770's absolute gate)
GATE_SECONDS = 0.4              # BS.1770's gating block: a shorter programme has no integrated loudness


@dataclass(frozen=True)
class Loudness:
    integrated: float           # LUFS (-70.0 for silence)
    true_peak: float            # dBTP
    dc: float = 0.0             # the largest DC offset (mean) of any channel, linear (1.0: full scale)

    def as_dict(self) -> dict:
        return {"integrated_lufs": self.integrated, "true_peak_dbtp": self.true_peak}


def measure(path: str | Path, graph: str) -> Loudness:
    """Loudness of the signal `graph` (an ffmpeg filter graph head on input 0, e.g. "[0:a:0]aresample=48000")
    makes from the file at `path` (integrated -70 LUFS where there is none: silence, or under GATE_SECONDS), and
    its DC offset."""
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-nostats", "-i", str(path),
           "-filter_complex", f"{graph},astats=measure_perchannel=DC_offset:measure_overall=none,"
                              "ebur128=peak=true:framelog=quiet", "-f", "null", "-"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    summary = res.stderr.rsplit("Summary:", 1)[-1]
    i = re.search(r"I:\s+(-?[\d.]+|-inf|nan) LUFS", summary)
    peak = re.search(r"True peak:\s+Peak:\s+(-?[\d.]+|-inf|nan) dBFS", summary)
    if res.returncode != 0 or i is None or peak is None:
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"ffmpeg exit {res.returncode}"
        raise InputError(f"{path}: cannot measure its loudness ({last}); check it is a readable audio or video file")
    integrated = float(i.group(1))
    dc = [abs(float(d)) for d in re.findall(r"^\[Parsed_astats_\d+ @ [^\]]+\] DC offset:\s+(-?[\d.]+)$", res.stderr,
                                            re.M)]
    return Loudness(integrated if math.isfinite(integrated) else QUIET_LUFS, float(peak.group(1)), max(dc, default=0.0))
