"""A render request checked into a Clip: what checking produced (the decoded audio, the opened avatar, the
output's rate, format, soundtrack and frame count, the emotion per frame, the controls), which the engine
renders and the digest is made from. Nothing here loads a network."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np

from ditto_fast.audio.decode import AUDIO_FILE, DecodedAudio, decode_audio
from ditto_fast.avatar import Avatar
from ditto_fast.avatar.store import avatar_signature
from ditto_fast.captions.plan import CaptionPlan, plan_captions
from ditto_fast.captions.sidecars import sidecar_path
from ditto_fast.core.config import Config
from ditto_fast.core.errors import UsageError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.media.claims import check_unclaimed
from ditto_fast.media.inputs import check_input_file
from ditto_fast.media.outputs import check_writes
from ditto_fast.media.rates import frames_for, parse_frame_rate
from ditto_fast.motion.conditions import emotion_plan, neutral_blend, read_schedule_file, schedule_file
from ditto_fast.motion.controls import Controls, load_controls, read_control_file
from ditto_fast.delivery.format import DeliveryFormat
from ditto_fast.encoding.formats import Format, default_suffix, output_format
from ditto_fast.delivery.profiles import DeliveryProfile, check_timecode, load_profile, profile_path
from ditto_fast.delivery.qc import loudness_wanted
from ditto_fast.encoding.soundtrack import Soundtrack, plan_soundtrack
from ditto_fast.encoding.writer import check_output_path


@dataclass(frozen=True)
class Clip:
    """One render's inputs, checked and read: everything the engine and the digest need, no file read again."""

    request: RenderRequest
    avatar: Avatar
    output: Path
    audio: DecodedAudio
    frames: int                         # N output frames at `rate`
    rate: Fraction
    format: Format
    steps: int
    seed: int
    emotion: np.ndarray                 # [N, 8] (with emotion_auto: the fixed part, before the strength)
    emotion_source: str                 # the emotion as given, or the sha256 of its schedule file
    controls: Controls | None
    controls_sha256: str | None
    avatar_key: tuple | None = None     # the signature of the avatar's files when the clip was checked
    blend: str = "feather"              # the putback: seamless or feather
    delivery: DeliveryProfile | None = None     # the delivery profile (`format` is then its DeliveryFormat)
    loudness: tuple[float, float] | None = None  # (target LUFS, true-peak ceiling dBTP) the audio is leveled to
    soundtrack: Soundtrack | None = None        # the output's audio channels, mixed from the file's
    inputs: tuple[Path, ...] = ()       # every file and folder the render reads (no file it writes may be one)
    captions: CaptionPlan | None = None         # the captions asked for (captions/plan.py)
    emotion_auto: np.ndarray | None = None      # [N] each frame's share of the speech's emotion (`auto`); None: none
    emotion_strength: float = 1.0               # the emotion blended toward neutral (1: as given, 0: neutral)

    @property
    def notes(self) -> list[str]:
        """What checking decided that a user should hear of (a 5.1 file mixed to stereo, a caption cut short by the
        next one, say)."""
        return ([self.soundtrack.note] if self.soundtrack and self.soundtrack.note else []) + \
            (list(self.captions.notes) if self.captions is not None else [])


def default_output(avatar: str, audio: Path, codec: str | None = None, suffix: str | None = None) -> Path:
    """<avatar>_<audio stem>.mp4 (.mov for ProRes, `suffix` for a delivery profile) in the current directory."""
    return Path.cwd() / f"{avatar}_{Path(audio).stem}{suffix or default_suffix(codec)}"


def request_inputs(request: RenderRequest, default_emotion: str) -> list[Path]:
    """The files a request reads: its audio, controls, emotion schedule, delivery profile file, captions or script."""
    schedule = schedule_file(request.emotion or default_emotion)
    profile = profile_path(request.delivery) if request.delivery else None
    return [p for p in (request.audio, request.controls, schedule, profile, request.captions, request.script)
            if p is not None]


def check_clip(request: RenderRequest, avatar: Avatar, config: Config, audio: DecodedAudio | None = None,
               max_seconds: float | None = None,
               decode: Callable[[Path, float | None], DecodedAudio] = decode_audio) -> Clip:
    """Check one request against its opened avatar without any network: the output can be written, no other
    process claims it and it is none of the inputs, its container and codec pair, the audio decodes (unless
    `audio` is its decoding already; at most `max_seconds` of it, when given; by `decode`, a server's in turn) and
    its channels go into the output (encoding/soundtrack.py), emotion and controls parse for its length. Raises the
    DittoError a user caused."""
    key = avatar_signature(avatar.dir)
    settings = request.with_defaults(config)
    profile = load_profile(request.delivery) if request.delivery else None
    if profile is None and (request.loudness is not None or request.timecode is not None):
        raise UsageError(f"--{'loudness' if request.loudness is not None else 'timecode'} goes with --delivery; "
                         "name a delivery profile")
    output = request.output or default_output(request.avatar, request.audio, settings["codec"],
                                              profile.extension if profile else None)
    check_output_path(output)
    check_unclaimed(output)                     # not being written by another process now
    check_input_file(request.audio, AUDIO_FILE)  # a folder or a FIFO is named as such, not as an overwritten input
    emotion = settings["emotion"]
    emotion_file = schedule_file(emotion)
    inputs = (*request_inputs(request, emotion), avatar.dir)
    check_writes([("output", output)], inputs)
    if profile is None:
        fmt = output_format(output, settings["codec"])
        rate = avatar.rate if request.fps is None else parse_frame_rate(request.fps)
    else:
        fmt, rate = delivery_format(request, profile, avatar, output)
    audio = audio or decode(request.audio, max_seconds)
    loudness = _loudness_target(request, profile)
    # audio over full scale is lowered unless it is leveled (leveling's limiter keeps it under the ceiling); a mix
    # that sums over full scale is lowered in any case
    soundtrack = plan_soundtrack(request.audio, audio.channels, audio.channel_mask, fmt, peak=audio.peak,
                                 leveled=loudness is not None)
    n = frames_for(len(audio.samples), rate)
    if profile is not None and profile.video.field_rate:
        n += n % 2                          # fields come in pairs: the audio is padded to the last one
    delivered = n // 2 if profile is not None and profile.video.field_rate else n     # frames the file holds
    captions = plan_captions(request, profile, fmt, fmt.rate if profile is not None else rate, delivered,
                             audio.seconds)
    if captions is not None:                    # a sidecar overwrites no input (news.srt beside news.mp4)
        check_writes([(f"{kind} sidecar", sidecar_path(output, kind)) for kind in captions.sidecars], inputs)
    schedule = read_schedule_file(emotion_file) if emotion_file else None
    per_frame, auto = emotion_plan(emotion, n, schedule)
    strength = float(settings["emotion_strength"])
    if auto is None:
        per_frame = neutral_blend(per_frame, strength)
    controls = read_control_file(request.controls) if request.controls else None
    return Clip(request, avatar, output, audio, n, rate, fmt, settings["steps"], settings["seed"], per_frame,
                hashlib.sha256(schedule).hexdigest() if schedule is not None else emotion,
                load_controls(request.controls, n, controls) if controls is not None else None,
                hashlib.sha256(controls).hexdigest() if controls is not None else None, key, settings["blend"],
                profile, loudness, soundtrack, inputs, captions, auto, strength)


CODEC_OF_PROFILE = {"prores": "prores", "h264": "h264"}     # a profile codec that --codec also names


def delivery_format(request: RenderRequest, profile: DeliveryProfile, avatar: Avatar,
                    output: Path) -> tuple[DeliveryFormat, Fraction]:
    """The delivered format and rate of a request with a profile; UsageError for an output name, --fps, --codec,
    --timecode or an avatar's aspect that contradicts the profile."""
    v, where = profile.video, f"--delivery {profile.name}"
    if output.suffix.lower() != profile.extension:
        raise UsageError(f"{output}: {where} writes {profile.container.upper()}; name the output "
                         f"{output.with_suffix(profile.extension).name}")
    if request.codec is not None and CODEC_OF_PROFILE.get(v.codec) != request.codec:
        raise UsageError(f"--codec {request.codec} contradicts {where} ({v.codec}); leave --codec out")
    rate = v.rate or (avatar.rate if request.fps is None else parse_frame_rate(request.fps))   # delivered frames/s
    if request.fps is not None and parse_frame_rate(request.fps) != rate:
        raise UsageError(f"--fps {request.fps} contradicts {where} ({float(rate):g} frames/s); leave --fps out")
    size = v.size or avatar.size
    aw, ah = avatar.size
    if abs(aw * size[1] - ah * size[0]) > 0.01 * ah * size[0]:
        raise UsageError(f"avatar {request.avatar} is {aw}x{ah}, another aspect than {where}'s "
                         f"{size[0]}x{size[1]}; register a source of that aspect")
    timecode = request.timecode or profile.timecode
    if timecode is not None:
        try:
            check_timecode(timecode, rate)
        except ValueError as e:
            raise UsageError(f"--timecode {e}") from None
    return DeliveryFormat(profile, tuple(size), rate, timecode=timecode), rate * (2 if v.field_rate else 1)


def _loudness_target(request: RenderRequest, profile: DeliveryProfile | None) -> tuple[float, float] | None:
    """The (target, ceiling) the audio is leveled to: the profile's, or --loudness (off: none; a target keeps the
    profile's ceiling, or -1 dBTP)."""
    wanted = None if profile is None else loudness_wanted(profile, request.loudness)
    return None if wanted == "off" else wanted
