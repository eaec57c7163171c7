"""The output's soundtrack, decided before any work: how many channels it carries and how the speech file's
channels are mixed into them. Mono and stereo pass as they are; 3 to 8 channels of a known layout (5.1, 7.1,
...) are mixed to stereo by audio/layout.py's rule, with a note saying so; more channels, a layout no one
declared, or more than the output's audio codec carries are refused with one line (exit 3)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ditto_fast.audio.layout import MAX_MIXED, layout_name, speakers, stereo_mix
from ditto_fast.core.errors import InputError
from ditto_fast.render.formats import Format

SPEECH_LAYOUTS = (1, 2)         # channel counts an output carries as they are (delivery profiles may name theirs)
_PAN_LAYOUTS = {1: "mono", 2: "stereo"}


@dataclass(frozen=True)
class Soundtrack:
    """What the output's audio carries: `channels`, and the gains that make them from the file's channels."""

    channels: int
    mix: tuple[tuple[float, ...], ...] | None = None    # [out, in]; None: the file's channels as they are
    note: str | None = None                             # what was done, for the user

    def filters(self) -> list[str]:
        """ffmpeg audio filters that make it from the file's channels: a pan, or none."""
        if self.mix is None:
            return []
        outs = ["c{}={}".format(o, "+".join(f"{g:.10g}*c{i}" for i, g in enumerate(row) if g) or "0*c0")
                for o, row in enumerate(self.mix)]
        return ["pan=" + "|".join([_PAN_LAYOUTS.get(self.channels, f"{self.channels}c"), *outs])]


def plan_soundtrack(path: str | os.PathLike, channels: int, mask: int, fmt: Format,
                    keep: tuple[int, ...] = SPEECH_LAYOUTS) -> Soundtrack:
    """The soundtrack of an output in `fmt` from a speech file of `channels` with speaker `mask` (see
    DecodedAudio); InputError naming the file and the fix when it cannot be made."""
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
    return track


__all__ = ["SPEECH_LAYOUTS", "Soundtrack", "plan_soundtrack"]
