"""What `render` writes without --delivery, as a profile `qc` can check a file against: the container and codec of
a plain output (encoding/formats.py), its pixel format, BT.709 TV-range tags, progressive, the encoders' own
key-frame interval, one audio track at 48 kHz of any layout, levels as spoken, any size, rate and timecode."""

from __future__ import annotations

from ditto_fast.core.config import CODECS
from ditto_fast.core.errors import UsageError
from ditto_fast.delivery.profiles import AudioSpec, DeliveryProfile, VideoSpec
from ditto_fast.encoding.formats import AUDIO_RATE, COLOUR_TAGS, CONTAINERS, ENCODER_KEYINT, output_format

_TAGGED = dict(zip(COLOUR_TAGS[::2], COLOUR_TAGS[1::2]))
COLOUR = {"primaries": _TAGGED["-color_primaries"], "transfer": _TAGGED["-color_trc"],
          "matrix": _TAGGED["-colorspace"], "range": _TAGGED["-color_range"]}
PLAIN_OUTPUTS = tuple(f"{suffix} {codec}" for suffix in CONTAINERS for codec in CODECS
                      if codec != "prores" or CONTAINERS[suffix] == "mov")      # ".mov prores", ...


def plain_profile(container: str, codec: str) -> DeliveryProfile | None:
    """The profile of what a render without --delivery writes as `container` (ffmpeg's muxer name: mp4, mov,
    matroska) in `codec` (ffmpeg's codec name); None for a pair it does not write."""
    suffix = next((s for s, c in CONTAINERS.items() if c == container), None)
    if suffix is None or codec not in CODECS:
        return None
    try:
        fmt = output_format(f"out{suffix}", codec)
    except UsageError:                  # ProRes outside QuickTime
        return None
    video = VideoSpec(codec=codec, profile=None, level=None, bitrate=None, crf=None, preset=None,
                      gop=1 if codec == "prores" else ENCODER_KEYINT, b_frames=0, pix_fmt=fmt.pix_fmt, size=None,
                      rate=None, interlaced=False, field_order=None, colour=dict(COLOUR))
    audio = AudioSpec(codec=fmt.audio_codec, bitrate=None, rate=AUDIO_RATE, tracks=1, channels=None, speech=(1,))
    return DeliveryProfile(name=f"render's own {suffix} {codec}", source="encoding/formats.py", sha256="",
                           container=container, video=video, audio=audio, loudness=None, timecode=None,
                           drop_frame=False)
