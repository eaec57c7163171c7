"""A live session's request, declared once (`LiveRequest`: the render request's declarations a stream takes, where it
goes, the online loop's own), resolved into the settings a session runs with; and what the `live` command alone is
started with (`LiveOptions`). Light to import."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ditto_fast.core.config import Config
from ditto_fast.core.declare import check_fields, declared
from ditto_fast.core.errors import UsageError
from ditto_fast.live.containers import CONTAINERS

# the render request's fields that a stream has no use for (it has no audio file, output file or delivery profile)
NOT_LIVE = ("audio", "output", "delivery", "loudness", "timecode", "captions", "script", "captions_out", "burn_in")
LIVE_CODECS = ("h264", "hevc")
CONTROL_HORIZON = 10**9      # frames a live control file may name (a stream has no last frame)

SOURCE_HELP = ("Where the speech comes from: a FILE (played at its own pace), - (stdin: raw s16le 16 kHz mono, as a "
               "TTS engine pipes it; a stream that starts as a container does (" + ", ".join(CONTAINERS) + ") is "
               "decoded, and bytes that are neither are refused, not played as noise), a named pipe (read as stdin "
               "is) or a URL ffmpeg reads live (srt://, udp://, rtmp://, http://).")
DEST_HELP = ("Where the stream goes: a .ts file (written as it streams), an .m3u8 playlist (HLS, segments beside "
             "it), udp://HOST:PORT, srt://HOST:PORT (caller; ?mode=listener to wait for a caller) or rtmp://URL.")

OVERWRITE_HELP = ("Replace an --out file (a .ts, or an HLS playlist and its segments) or a --stats file that is there "
                  "already; without it such a file is refused before anything loads (POST /v1/live: \"overwrite\": "
                  "true).")


def _destination(value: Any, where: str) -> str:
    """Where a stream goes: a .ts or .m3u8 path or an srt://, udp:// or rtmp:// URL (its kind known; not opened)."""
    from ditto_fast.live.outputs import describe_destination

    if not isinstance(value, (str, Path)) or not str(value):
        raise UsageError(f"{where}: {DEST_HELP}")
    describe_destination(str(value))
    return str(value)


def _live_request_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """The render request's declarations a stream takes, then where it goes and the online loop's own."""
    from ditto_fast.engine.request import FIELDS

    from ditto_fast.motion.emotions import EMOTIONS

    own = {  # where a stream takes less than a clip: one emotion, no ProRes
        "emotion": {"help": f"{'|'.join(EMOTIONS)} or a mix like happy+surprise (a stream takes one emotion: no "
                            "auto, no schedule)."},
        "codec": {"setting": None, "choices": LIVE_CODECS, "help": "Video codec [default: config clip.codec]."}}
    kept = [(f.name, f.type, dataclasses.field(default=f.default, metadata={**f.metadata, **own.get(f.name, {})}))
            for f in FIELDS if f.name not in NOT_LIVE]
    return kept + [
        ("out", "str | None", declared(flags=("--out",), check=_destination, help=DEST_HELP)),
        ("overwrite", "bool | None", declared(flags=("--force",), kind="flag", help=OVERWRITE_HELP)),
        ("max_latency", "float | None", declared(flags=("--max-latency",), setting=("live", "max_latency"),
                                                 help="Seconds the stream may lag its speech at most: the picture "
                                                      "starts within it, and motion that falls further behind skips "
                                                      "ahead.")),
        ("overlap", "int | None", declared(flags=("--overlap",), setting=("live", "overlap"),
                                           help="The online window loop's overlap: 80 - overlap new frames per LMDM "
                                                "window (more overlap: lower latency, more LMDM work).")),
    ]


class _LiveRequestBase:
    """What a LiveRequest does besides holding its fields."""

    def __post_init__(self) -> None:
        check_fields(self)
        emotion = getattr(self, "emotion")
        if emotion is not None:
            from ditto_fast.motion.conditions import schedule_file

            if emotion.lstrip().startswith("{") or schedule_file(emotion) is not None:
                raise UsageError(f"--emotion {emotion}: a stream takes one emotion (a label or a mix like "
                                 "happy+surprise); a schedule needs a clip's length")

    def fields(self) -> dict[str, Any]:
        """The fields that are set (for a log line, or a request made again elsewhere)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def settings(self, config: Config, avatar_rate: Fraction | None = None, stop_at_end: bool = False):
        """The LiveSettings a session runs with: the config's defaults filled in, the emotion as one vector (at its
        strength), the controls read; the frame rate `fps`, else `avatar_rate` (25 until the avatar is known).
        Refused (UsageError, InputError) where a stream cannot take them: `auto`, ProRes, an unreadable control
        file."""
        from ditto_fast.engine.request import settings_with_defaults
        from ditto_fast.live.session import LiveSettings
        from ditto_fast.media.rates import parse_frame_rate
        from ditto_fast.motion.conditions import emotion_vector, neutral_blend
        from ditto_fast.motion.controls import load_controls

        values = settings_with_defaults(self.fields(), config)
        if values["codec"] not in LIVE_CODECS:
            raise UsageError(f"clip.codec {values['codec']}: a stream is {' or '.join(LIVE_CODECS)}; give --codec")
        controls = load_controls(getattr(self, "controls"), CONTROL_HORIZON) if getattr(self, "controls") else None
        fps = getattr(self, "fps")
        rate = parse_frame_rate(fps) if fps is not None else Fraction(avatar_rate or 25)
        return LiveSettings(emotion=neutral_blend(emotion_vector(values["emotion"]), values["emotion_strength"]),
                            seed=values["seed"], steps=values["steps"], codec=values["codec"],
                            overlap=getattr(self, "overlap") or config.live.overlap, rate=rate,
                            blend=values["blend"], controls=controls,
                            max_latency=getattr(self, "max_latency") or config.live.max_latency,
                            stop_at_end=stop_at_end)


# One live session, declared once and checked when made, as a RenderRequest is: the avatar, the render request's
# settings a stream takes (emotion, seed, steps, fps, codec, blend, controls, emotion_strength), where it goes
# (`out`: None for a caller that takes the frames itself), whether it may replace files there (`overwrite`: `live
# --force`, POST /v1/live's "overwrite") and the online loop's own (max_latency, overlap).
LiveRequest = dataclasses.make_dataclass("LiveRequest", _live_request_fields(), bases=(_LiveRequestBase,),
                                         frozen=True)
LiveRequest.__module__ = __name__           # pickled by name into an engine process
LIVE_REQUEST_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(LiveRequest)
LIVE_KEYS = tuple(f.name for f in LIVE_REQUEST_FIELDS)


@dataclass
class LiveOptions:
    """What the `live` command alone is started with (a session's own settings are its LiveRequest); the command's
    flags are made from these fields."""

    audio_in: str = declared(flags=("--audio-in",), required=True, help=SOURCE_HELP)
    stats: Path | None = declared(flags=("--stats",), kind="path",
                                  help="Write the session's figures here as JSON at the end (latency, real-time "
                                       "factor per stage, frames late or repeated). Latency is what a viewer sees: "
                                       "from a piece of speech being there to be spoken (its arrival, or its turn "
                                       "on the stream's clock where it came ahead, as a TTS writing a whole answer "
                                       "at once makes it) to its frame leaving.")

    def __post_init__(self) -> None:
        check_fields(self)


LIVE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(LiveOptions)
