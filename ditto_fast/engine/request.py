"""The render request: every per-clip setting of one render, declared once.

Its fields are what a `render` command line, a JSON line of a batch and a Python caller give; their
types, defaults and allowed values come from the config's declarations (`clip.*`, `motion.steps`),
so all three refuse the same values with the same message. The `render` and `batch` options and the
keys a job line may carry are made from `FIELDS`: a new setting is one field here plus its test.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ditto_fast.avatar.store import validate_name
from ditto_fast.core.checks import refuse
from ditto_fast.core.declare import check_fields, check_value, declared
from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import check_path_text, shown
from ditto_fast.delivery.profiles import (LOUDNESS_RANGE, SIDECAR_KINDS, TIMECODE, is_profile_file, load_profile,
                                         shipped_profiles)
from ditto_fast.media.rates import MOTION_FPS, NAMED_RATES, RENDER_RATES, parse_frame_rate, rate_text
from ditto_fast.motion.emotions import EMOTIONS

_WHOLE_RATES = [rate_text(r) for r in RENDER_RATES if r.denominator == 1]
_NTSC_RATES = {name: rate for name, rate in NAMED_RATES.items() if rate in RENDER_RATES}
EMOTION_HELP = (f"{'|'.join(EMOTIONS)}, a mix like happy+surprise, auto (read from the speech, frame by frame: needs "
                "the speech-emotion checkpoint), a mix like auto+happy, or a per-frame schedule (its labels may be "
                "auto too): a JSON file, or inline JSON like '{\"default\": \"neutral\", \"frames\": "
                "{\"0-49\": \"happy\"}}'.")
EMOTION_STRENGTH_HELP = "The emotion blended toward neutral: 1 as given (or as read from the speech), 0 neutral."
FPS_HELP = (f"Output frame rate: {', '.join(_WHOLE_RATES)} or the NTSC rates {', '.join(_NTSC_RATES)} (also as "
            f"{', '.join(rate_text(r) for r in _NTSC_RATES.values())}) [default: the avatar's own rate; {MOTION_FPS} "
            "for image avatars].")
CODEC_HELP = "Video codec (prores: ProRes 422 HQ with PCM audio; .mov only)."
DELIVERY_HELP = (f"A delivery profile: a name from configs/delivery ({', '.join(shipped_profiles())}) or a FILE.yaml "
                 "of the same shape. It sets container, codec, size, rate, scan, audio tracks, loudness and timecode; "
                 "the output is checked (QC) before it is renamed into place.")
LOUDNESS_HELP = (f"With --delivery: off (levels as spoken) or a target in LUFS ({LOUDNESS_RANGE[0]:g}.."
                 f"{LOUDNESS_RANGE[1]:g}) instead of the profile's.")
TIMECODE_HELP = "With --delivery: start timecode HH:MM:SS:FF (HH:MM:SS;FF drop-frame, at 29.97/59.94 only)."
CAPTIONS_HELP = ("Timed text to caption the clip with: .srt, .vtt, .scc or .ttml/.dfxp (checked before any work). "
                 "Embedded as EIA-608 CC1 (MXF ANC, A/53 in H.264/HEVC, a c608 track beside ProRes) unless the "
                 "delivery profile says captions: none.")
SCRIPT_HELP = ("The words the voice reads, as plain text: timed from the speech (CTC alignment on the HuBERT the "
               "render loads) and captioned as --captions would be.")
CAPTIONS_OUT_HELP = f"Sidecar files beside the output, comma-separated: {','.join(SIDECAR_KINDS)}."
BURN_IN_HELP = "Draw the captions into the picture too (open captions, for social)."
BLEND_HELP = ("Putback: seamless (only the face the motion changes, its colour matched to the plate at the edge; "
              "the plate's own pixels elsewhere) or feather (the whole crop square through a feathered edge, as "
              "Ditto does).")


def _avatar(value: Any, where: str) -> str:
    return validate_name(value)


def _rate(value: Any, where: str) -> str:
    """A frame rate RENDER_RATES holds, kept as given text ("25", "29.97", "30000/1001")."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Fraction)):
        refuse(where, f'must be a rate such as "25" or "30000/1001", got {shown(value)}')
    try:
        parse_frame_rate(value)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return str(value)


def _profile(value: Any, where: str) -> str:
    """A delivery profile's name or FILE.yaml, read and checked now: a bad profile fails before anything loads."""
    if not isinstance(value, (str, Path)) or not str(value):
        refuse(where, f"must be a profile name ({', '.join(shipped_profiles())}) or a FILE.yaml, got {shown(value)}")
    check_path_text(value, where)
    load_profile(value)
    return str(value)


def _loudness(value: Any, where: str) -> str | float:
    """'off' or a target in LUFS within the profiles' range."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return "off"
    try:
        target = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        target = None
    low, high = LOUDNESS_RANGE
    if target is None or not low <= target <= high:
        refuse(where, f"must be off or a target in {low:g}..{high:g} LUFS, got {shown(value)}")
    return target


def _sidecars(value: Any, where: str) -> str:
    """A comma-separated list of sidecar kinds, each once."""
    kinds = [k.strip().lower() for k in value.split(",")] if isinstance(value, str) else None
    if not kinds or any(k not in SIDECAR_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        refuse(where, f"must be one or more of {','.join(SIDECAR_KINDS)}, comma-separated, got {shown(value)}")
    return ",".join(kinds)


def _timecode(value: Any, where: str) -> str:
    if not isinstance(value, str) or not TIMECODE.match(value):
        refuse(where, f"must be HH:MM:SS:FF (HH:MM:SS;FF for drop-frame), got {shown(value)}")
    return value


@dataclass(frozen=True)
class RenderRequest:
    """One clip to render. None means the default: the config's for declared settings, the avatar's own rate
    for `fps`, `<avatar>_<audio stem>` in the current directory for `output`."""

    avatar: str = declared(flags=("--avatar",), required=True, check=_avatar,
                         help="Registered avatar name (see `ditto-fast avatars`).")
    audio: Path = declared(kind="path", flags=("--audio",), required=True, help="Speech file.")
    output: Path | None = declared(kind="path", flags=("-o", "--output"),
                                 help="Output file; .mp4, .mov or .mkv picks the container (default <avatar>_<audio "
                                      "stem>.mp4 in the current directory, .mov for ProRes).")
    steps: int | None = declared(setting=("motion", "steps"), flags=("--steps",), help="DDIM steps.")
    seed: int | None = declared(setting=("clip", "seed"), flags=("--seed",), help="Seed of the motion's noise.")
    emotion: str | None = declared(setting=("clip", "emotion"), flags=("--emotion",), help=EMOTION_HELP)
    controls: Path | None = declared(kind="path", flags=("--controls",), help="Per-frame control file (JSON).")
    fps: str | None = declared(kind="rate", flags=("--fps",), check=_rate, help=FPS_HELP)
    codec: str | None = declared(setting=("clip", "codec"), flags=("--codec",), help=CODEC_HELP)
    blend: str | None = declared(setting=("render", "blend"), flags=("--blend",), help=BLEND_HELP)
    delivery: str | None = declared(kind="profile", flags=("--delivery",), check=_profile, help=DELIVERY_HELP)
    loudness: str | float | None = declared(kind="loudness", flags=("--loudness",), check=_loudness,
                                            help=LOUDNESS_HELP)
    timecode: str | None = declared(kind="timecode", flags=("--timecode",), check=_timecode, help=TIMECODE_HELP)
    captions: Path | None = declared(kind="path", flags=("--captions",), help=CAPTIONS_HELP)
    script: Path | None = declared(kind="path", flags=("--script",), help=SCRIPT_HELP)
    captions_out: str | None = declared(flags=("--captions-out",), check=_sidecars, help=CAPTIONS_OUT_HELP)
    burn_in: bool = declared(False, kind="flag", flags=("--burn-in",), help=BURN_IN_HELP)
    emotion_strength: float | None = declared(setting=("clip", "emotion_strength"), flags=("--emotion-strength",),
                                              help=EMOTION_STRENGTH_HELP)

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_json(cls, data: Any, base: Path, where: str, defaults: dict[str, Any] | None = None) -> "RenderRequest":
        """The request of one job line (already parsed JSON): paths relative to `base`, keys not in the line from
        `defaults`; UsageError naming `where` for a line that is not a request."""
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected a JSON object like "
                             '{"avatar": "ruby", "audio": "a.wav", "output": "a.mp4"}')
        unknown = sorted(set(data) - set(JOB_KEYS))
        if unknown:
            raise UsageError(f"{where}: unknown key {shown(unknown[0])} (known: {', '.join(JOB_KEYS)})")
        for key in ("avatar", "audio", "output"):       # a job line names its output: batch writes no default names
            if not isinstance(data.get(key), str) or not data.get(key):
                raise UsageError(f"{where}: {shown(key)} is missing or not a string")
        values = {**(defaults or {}), **{k: v for k, v in data.items() if v is not None}}
        emotion = values.get("emotion")
        if isinstance(emotion, dict):               # a schedule written inline in the job line
            values["emotion"] = json.dumps(emotion, sort_keys=True)
        elif isinstance(emotion, str) and emotion.endswith(".json") and "emotion" in data:
            values["emotion"] = str(base / emotion)
        for f in FIELDS:
            if f.metadata["kind"] == "path" and f.name in data and isinstance(data[f.name], str):
                values[f.name] = base / data[f.name]
        delivery = data.get("delivery")
        if isinstance(delivery, str) and is_profile_file(delivery):
            values["delivery"] = str(base / delivery)
        try:
            return cls(**values)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None

    def with_defaults(self, config) -> dict[str, Any]:
        """The declared settings with the config's defaults filled in: {seed, steps, emotion, codec, blend,
        emotion_strength}."""
        return settings_with_defaults({f.name: getattr(self, f.name) for f in FIELDS}, config)


FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(RenderRequest)
JOB_KEYS = tuple(f.name for f in FIELDS)


def settings_with_defaults(values: dict[str, Any], config) -> dict[str, Any]:
    """The request fields that are config settings, from `values` (field name -> value, None or absent: unset) or the
    config's defaults: {seed, steps, emotion, codec, blend}."""
    return {f.name: values[f.name] if values.get(f.name) is not None else
            getattr(getattr(config, f.metadata["setting"][0]), f.metadata["setting"][1])
            for f in FIELDS if f.metadata["setting"]}


def check_field(name: str, value: Any) -> Any:
    """One field's value checked as a request checks it (`qc --loudness` as `render --loudness`)."""
    return check_value(next(f for f in FIELDS if f.name == name), value)
