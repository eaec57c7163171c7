"""The output's soundtrack, decided before any work: how many channels it carries and how the speech file's
channels are mixed into them. Mono and stereo pass as they are; 3 to 8 channels of a known layout (5.1, 7.1,
...) are mixed to stereo by audio/layout.py's rule, with a note saying so; more channels, a layout no one
declared, or more than the output's audio codec carries are refused with one line (exit 3). Float audio above
full scale, and a stereo mix whose sum goes above it (loud channels in phase), are lowered to a true peak of
HEADROOM_DBTP, with a note, instead of being clipped where they become PCM, or inside the mix itself (audio and
mixes that stay within full scale keep their bytes)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from ditto_fast.audio.layout import MAX_MIXED, layout_name, speakers, stereo_mix
from ditto_fast.audio.loudness import measure
from ditto_fast.core.errors import InputError
from ditto_fast.encoding.formats import AUDIO_RATE, Format

SPEECH_LAYOUTS = (1, 2)         # channel counts an output carries as they are (delivery profiles may name theirs)
_PAN_LAYOUTS = {1: "mono", 2: "stereo"}
HEADROOM_DBTP = -1.0            # where audio over full scale is lowered to (true peak at 48 kHz, 4x oversampled)


@dataclass(frozen=True)
class Soundtrack:
    """What the output's audio carries: `channels`, the gains that make them from the file's channels, and a gain
    that keeps audio over full scale from being clipped."""

    channels: int
    mix: tuple[tuple[float, ...], ...] | None = None    # [out, in]; None: the file's channels as they are
    note: str | None = None                             # what was done, for the user
    gain_db: float = 0.0                                # below 0: the file peaks over full scale, lowered by this

    def filters(self) -> list[str]:
        """ffmpeg audio filters that make it from the file's channels: a volume, a pan, both or none. The volume
        comes first: it turns integer audio into float, so that a mix lowered for its overs sums nothing it clips."""
        gain = [f"volume={self.gain_db:.3f}dB"] if self.gain_db else []
        if self.mix is None:
            return gain
        outs = ["c{}={}".format(o, "+".join(f"{g:.10g}*c{i}" for i, g in enumerate(row) if g) or "0*c0")
                for o, row in enumerate(self.mix)]
        return [*gain, "pan=" + "|".join([_PAN_LAYOUTS.get(self.channels, f"{self.channels}c"), *outs])]


def plan_soundtrack(path: str | os.PathLike, channels: int, mask: int, fmt: Format,
                    keep: tuple[int, ...] = SPEECH_LAYOUTS, peak: float = 0.0, leveled: bool = False) -> Soundtrack:
    """The soundtrack of an output in `fmt` from a speech file of `channels` with speaker `mask` and sample `peak`
    (see DecodedAudio; above 1.0 the output is lowered, with a note, unless it is `leveled`: leveling's limiter
    keeps it under the ceiling; a stereo mix whose channels' peaks could sum above full scale is measured, and
    lowered if it does, leveled or not);
    InputError naming the file and the fix when it cannot be made."""
    if channels in keep:
        track = Soundtrack(channels)
    elif channels > MAX_MIXED:
        raise InputError(f"{path}: has {channels} audio channels; a render mixes at most 8 (7.1) to stereo and "
                         f"cannot tell which of {channels} carry the speech; give a mono, stereo or 5.1 mix of it")
    else:
        names = speakers(channels, mask)
        if names is None:
            raise InputError(f"{path}: its {channels} audio channels declare no layout, so which is the centre is "
                             "unknown; give a mono or stereo mix, or a file that declares its layout (5.1, 7.1, ...)")
        track = Soundtrack(2, tuple(tuple(float(g) for g in row) for row in stereo_mix(names)),
                           f"{path}: {layout_name(channels, mask)} audio mixed to stereo (ITU-R BS.775: centre and "
                           "surrounds at -3 dB, LFE dropped)")
    if track.channels > fmt.max_audio_channels:
        pcm = "" if fmt.audio_codec != "aac" else ", or render a .mov with --codec prores (24-bit PCM)"
        raise InputError(f"{path}: {track.channels} audio channels, and {fmt.audio_codec.upper()} in a "
                         f"{fmt.container} file carries at most {fmt.max_audio_channels}; give a mix of at most "
                         f"{fmt.max_audio_channels} channels{pcm}")
    over = peak > 1.0 and not leveled
    # a mix is measured only where its channels' peaks could sum above full scale
    summed = track.mix is not None and peak * max(sum(abs(g) for g in row) for row in track.mix) > 1.0
    return _below_full_scale(path, track, peak if over else 0.0) if over or summed else track


def _below_full_scale(path: str | os.PathLike, track: Soundtrack, peak: float) -> Soundtrack:
    """`track` with a gain taking its true peak (as the output carries it: mixed, at 48 kHz; measured in float, so
    that nothing is clipped before it is measured) to HEADROOM_DBTP, where the file's float samples go above full
    scale (`peak` > 1) or the mix sums above it (true peak over 0 dBTP); otherwise `track` as it is."""
    graph = "[0:a:0]" + ",".join(["aformat=sample_fmts=dbl", *track.filters(), f"aresample={AUDIO_RATE}"])
    true_peak = measure(path, graph).true_peak
    gain = min(0.0, HEADROOM_DBTP - true_peak)
    if gain == 0.0 or (peak <= 1.0 and true_peak <= 0.0):
        return track
    what = f"float audio peaking at {20 * math.log10(peak):+.1f} dBFS" if peak > 1.0 else \
        f"its stereo mix summing to a true peak of {true_peak:+.1f} dBTP"
    note = (f"{path}: {what}, above full scale; lowered by {-gain:.1f} dB (true peak {HEADROOM_DBTP:g} dBTP) "
            "instead of being clipped")
    return replace(track, gain_db=round(gain, 3), note="; ".join(n for n in (track.note, note) if n))


__all__ = ["SPEECH_LAYOUTS", "Soundtrack", "plan_soundtrack"]
