"""Frame rates as exact fractions: the broadcast rates, parsing `--fps`, the 25 fps motion rate, frame counts; and
the sample rate of the speech the networks hear. Light to import (no numpy): the request's checks use it; the
per-frame arrays are in timeline.py."""

from __future__ import annotations

from fractions import Fraction


SPEECH_SAMPLE_RATE = 16000     # Hz: the mono speech HuBERT and the emotion classifier hear (every source resampled)
STREAM_SAMPLE_RATE = 48000     # Hz: a live stream's audio, the speech as it came (its band kept up to 24 kHz)
BAND_PER_SAMPLE = STREAM_SAMPLE_RATE // SPEECH_SAMPLE_RATE     # stream audio samples per sample the networks hear
MOTION_FPS = 25                # the LMDM's motion frames a second: SPEECH_SAMPLE_RATE / MOTION_FPS samples each
STANDARD_RATES = (Fraction(24000, 1001), Fraction(24), Fraction(25), Fraction(30000, 1001), Fraction(30),
                  Fraction(48), Fraction(50), Fraction(60000, 1001), Fraction(60))
# --fps spellings: the rates a render may be asked for
NAMED_RATES = {"23.976": Fraction(24000, 1001), "29.97": Fraction(30000, 1001), "59.94": Fraction(60000, 1001)}
RENDER_RATES = (Fraction(24000, 1001), Fraction(24), Fraction(25), Fraction(30000, 1001), Fraction(30),
                Fraction(50), Fraction(60000, 1001), Fraction(60))


def rate_text(rate: Fraction) -> str:
    """'25', '30000/1001': how ffmpeg and the avatar record write a rate exactly."""
    return str(rate.numerator) if rate.denominator == 1 else f"{rate.numerator}/{rate.denominator}"


def nearest_standard(fps: float) -> Fraction:
    """The standard rate closest to `fps` (relative distance)."""
    return min(STANDARD_RATES, key=lambda r: abs(float(r) - fps) / float(r))


def from_stream(fps: float) -> Fraction:
    """An exact rate for a decimal one as ffmpeg prints it ("29.97"): the standard rate within 0.1%, else
    the decimal as a fraction (at most 1001 in the denominator)."""
    std = nearest_standard(fps)
    if abs(float(std) - fps) <= 1e-3 * float(std):
        return std
    return Fraction(fps).limit_denominator(1001)


def parse_frame_rate(text: str | float | Fraction) -> Fraction:
    """A render's frame rate from '25', '29.97', '30000/1001' (or a number); ValueError naming the accepted ones."""
    if isinstance(text, Fraction):
        rate = text
    else:
        s = str(text).strip()
        try:
            rate = NAMED_RATES.get(s) or Fraction(s)
        except (ValueError, ZeroDivisionError):
            rate = None
    if rate not in RENDER_RATES:
        raise ValueError(f"frame rate {text!r} is not one of {', '.join(accepted_rates())}")
    return rate


def accepted_rates() -> list[str]:
    """The --fps values, as a user may write them."""
    return [rate_text(r) if r.denominator == 1 else f"{rate_text(r)} ({float(r):.3f})" for r in RENDER_RATES]


def frames_for(samples: int, rate: Fraction) -> int:
    """Frames at `rate` covering `samples` samples of speech (at SPEECH_SAMPLE_RATE): ceil(samples * rate / 16000)."""
    num = samples * rate.numerator
    den = SPEECH_SAMPLE_RATE * rate.denominator
    return max(0, -(-num // den))
