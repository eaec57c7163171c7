"""Leveling: the gain (plus a true-peak limiter only where the gain would push the peaks past the ceiling) that takes
a clip's speech to a delivery's loudness target. The speech the motion is made from is not touched: only the
delivered audio is leveled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ditto_fast.audio.loudness import GATE_SECONDS, QUIET_LUFS, Loudness, measure

LIMIT_OVERSAMPLE = 192000       # the limiter runs at 4x 48 kHz, so it catches inter-sample (true) peaks
TOLERANCE_LU = 0.2              # how close to the target the planned gain is refined to (the QC allows 0.5)
MARGIN_DB = 0.3                 # the limiter's ceiling below the profile's, for the resampling back to 48 kHz


@dataclass(frozen=True)
class Leveling:
    """The filters that level a clip's speech (empty: none), what was measured before and after, and a warning
    when the speech was too quiet to level."""

    filters: str
    measured_in: Loudness
    measured_out: Loudness
    gain_db: float
    limited: bool
    warning: str | None = None

    def as_dict(self) -> dict:
        return {"input": self.measured_in.as_dict(), "planned_output": self.measured_out.as_dict(),
                "gain_db": round(self.gain_db, 2), "limited": self.limited, "warning": self.warning}


def level(path: str | Path, programme: str, measured_as: str, target: float, ceiling: float,
          seconds: float | None = None) -> Leveling:
    """The gain (and, where needed, true-peak limiting) taking the speech in `path` to `target` LUFS with peaks
    under `ceiling` dBTP. `programme` makes the delivered signal from the file, `measured_as` what is measured of
    it (two mono tracks as a stereo pair); `seconds`: the delivered length (the speech padded or cut to it, as the
    file will have it). Speech that cannot be leveled (at or below -70 LUFS, or shorter than one gating block) gets
    no gain and a warning saying why."""
    pad = "" if seconds is None else f",apad=whole_dur={seconds:.6f},atrim=end={seconds:.6f}"   # as the writer does
    before = measure(path, f"[0:a:0]{programme}{pad},{measured_as}")
    if before.integrated <= QUIET_LUFS:
        why = f"is {seconds:.2f} s long, under BS.1770's {GATE_SECONDS:g} s gating block, so its loudness cannot " \
              "be measured" if seconds is not None and seconds < GATE_SECONDS else \
              f"is silent or quieter than {QUIET_LUFS:g} LUFS"
        return Leveling("", before, before, 0.0, False, f"{path}: the speech {why}; it cannot be leveled")
    gain, limit, filters, after = target - before.integrated, ceiling - MARGIN_DB, "", before
    for _ in range(4):                  # refine: the limiter takes a little loudness with the peaks
        limited = before.true_peak + gain > ceiling - MARGIN_DB
        filters = f"volume={gain:.3f}dB" + (
            f",aresample={LIMIT_OVERSAMPLE},alimiter=limit={10 ** (limit / 20):.5f}:attack=1:release=50:level=false"
            f":latency=true,aresample=48000" if limited else "")
        after = measure(path, f"[0:a:0]{programme},{filters}{pad},{measured_as}")
        off, over = target - after.integrated, after.true_peak - ceiling
        if abs(off) <= TOLERANCE_LU and over <= 0:
            break
        gain += off
        limit -= max(0.0, over + 0.1)
    return Leveling(filters, before, after, gain, limited)
