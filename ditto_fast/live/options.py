"""What `live` is started with, declared once (the engine's options and the render request's live settings aside:
those are the same declarations `render` uses), and the request's settings resolved for a stream. Light to import."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ditto_fast.core.config import Config
from ditto_fast.core.declare import check_fields, declared
from ditto_fast.core.errors import UsageError

# the render request's fields that a stream has no use for (it has no audio file, output file or delivery profile)
NOT_LIVE = ("audio", "output", "delivery", "loudness", "timecode", "captions", "script", "captions_out", "burn_in")
LIVE_CODECS = ("h264", "hevc")
CONTROL_HORIZON = 10**9      # frames a live control file may name (a stream has no last frame)

SOURCE_HELP = ("Where the speech comes from: a FILE (played at its own pace), - (raw s16le 16 kHz mono on stdin, as a "
               "TTS engine pipes it) or a URL ffmpeg reads live (srt://, udp://, rtmp://, http://).")
DEST_HELP = ("Where the stream goes: a .ts file (written as it streams), an .m3u8 playlist (HLS, segments beside "
             "it), udp://HOST:PORT, srt://HOST:PORT (caller; ?mode=listener to wait for a caller) or rtmp://URL.")


@dataclass
class LiveOptions:
    """`live`'s own options; the command's flags are made from these fields."""

    audio_in: str = declared(flags=("--audio-in",), required=True, help=SOURCE_HELP)
    out: str = declared(flags=("--out",), required=True, help=DEST_HELP)
    max_latency: float | None = declared(flags=("--max-latency",), setting=("live", "max_latency"),
                                         help="Seconds the stream may lag its speech at most: the picture starts "
                                              "within it, and motion that falls further behind skips ahead.")
    overlap: int | None = declared(flags=("--overlap",), setting=("live", "overlap"),
                                   help="The online window loop's overlap: 80 - overlap new frames per LMDM window "
                                        "(more overlap: lower latency, more LMDM work).")
    stats: Path | None = declared(flags=("--stats",), kind="path",
                                  help="Write the session's figures here as JSON at the end (latency, real-time "
                                       "factor per stage, frames late or repeated).")

    def __post_init__(self) -> None:
        check_fields(self)


LIVE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(LiveOptions)


def check_live_request(request: dict[str, Any], config: Config) -> dict[str, Any]:
    """The request's live settings (its values, or the config's defaults) checked before anything loads, the emotion as
    one vector (at its strength) and the controls read; refused where a stream cannot take them (a per-frame emotion
    schedule, `auto`, which reads a whole clip's speech, ProRes)."""
    from ditto_fast.engine.request import settings_with_defaults
    from ditto_fast.motion.conditions import emotion_vector, neutral_blend, schedule_file
    from ditto_fast.motion.controls import load_controls

    settings = settings_with_defaults(request, config)
    emotion = settings["emotion"]
    if emotion.lstrip().startswith("{") or schedule_file(emotion) is not None:
        raise UsageError(f"--emotion {emotion}: a stream takes one emotion (a label or a mix like happy+surprise); "
                         "a schedule needs a clip's length")
    if settings["codec"] not in LIVE_CODECS:
        raise UsageError(f"--codec {settings['codec']}: a stream is {' or '.join(LIVE_CODECS)}")
    controls = load_controls(request["controls"], CONTROL_HORIZON) if request.get("controls") else None
    vector = neutral_blend(emotion_vector(emotion), settings["emotion_strength"])
    return {**settings, "emotion": vector, "controls": controls}


def live_settings(request: dict[str, Any], checked: dict[str, Any], options: LiveOptions, config: Config, avatar,
                  stop_at_end: bool):
    """The LiveSettings of a stream from the request (its rate) and its settings checked by check_live_request."""
    from ditto_fast.live.session import LiveSettings
    from ditto_fast.media.rates import parse_frame_rate

    rate = avatar.rate if request.get("fps") is None else parse_frame_rate(request["fps"])
    return LiveSettings(emotion=checked["emotion"], seed=checked["seed"], steps=checked["steps"],
                        overlap=options.overlap or config.live.overlap, rate=Fraction(rate), blend=checked["blend"],
                        controls=checked["controls"], max_latency=options.max_latency or config.live.max_latency,
                        stop_at_end=stop_at_end)
