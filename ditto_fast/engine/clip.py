"""A render request checked into a Clip: what checking produced (the decoded audio, the opened avatar, the
output's rate, format, soundtrack and frame count, the emotion per frame, the controls), which the engine
renders and the digest is made from. Nothing here loads a network."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from ditto_fast.audio.decode import DecodedAudio, decode_audio
from ditto_fast.avatar import Avatar
from ditto_fast.avatar.format import PKL_NAME
from ditto_fast.core.config import Config
from ditto_fast.core.errors import UsageError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.media.claims import check_unclaimed
from ditto_fast.media.rates import frames_for, parse_rate
from ditto_fast.motion.conditions import emotion_schedule, read_schedule_file, schedule_file
from ditto_fast.motion.controls import Controls, load_controls, read_control_file
from ditto_fast.render.formats import Format, default_suffix, output_format
from ditto_fast.render.soundtrack import Soundtrack, plan_soundtrack
from ditto_fast.render.writer import check_output_path


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
    emotion: np.ndarray                 # [N, 8]
    emotion_source: str                 # the emotion as given, or the sha256 of its schedule file
    controls: Controls | None
    controls_sha256: str | None
    avatar_key: tuple[int, int] | None = None   # the avatar record's identity when the clip was checked
    blend: str = "feather"              # the putback: seamless or feather
    soundtrack: Soundtrack | None = None        # the output's audio channels, mixed from the file's

    @property
    def notes(self) -> list[str]:
        """What checking decided that a user should hear of (a 5.1 file mixed to stereo, say)."""
        return [self.soundtrack.note] if self.soundtrack and self.soundtrack.note else []


def avatar_identity(avatar_dir: Path) -> tuple[int, int] | None:
    """What changes when an avatar directory is replaced: its record file's inode and mtime (None if gone)."""
    try:
        st = os.stat(avatar_dir / PKL_NAME)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def default_output(avatar: str, audio: Path, codec: str | None = None) -> Path:
    """<avatar>_<audio stem>.mp4 (.mov for ProRes) in the current directory."""
    return Path.cwd() / f"{avatar}_{Path(audio).stem}{default_suffix(codec)}"


def overwrites(output: Path, source: Path) -> bool:
    """Whether writing `output` would replace `source` or a file inside it (symbolic links followed)."""
    if not os.path.lexists(source):
        return False
    out, src = output.resolve(), source.resolve()
    return out == src or src in out.parents


def check_clip(request: RenderRequest, avatar: Avatar, config: Config, audio: DecodedAudio | None = None) -> Clip:
    """Check one request against its opened avatar without any network: the output can be written, no other
    process claims it and it is none of the inputs, its container and codec pair, the audio decodes (unless
    `audio` is its decoding already) and its channels go into the output (render/soundtrack.py), emotion and
    controls parse for its length. Raises the DittoError a user caused."""
    key = avatar_identity(avatar.dir)
    settings = request.with_defaults(config)
    output = request.output or default_output(request.avatar, request.audio, settings["codec"])
    check_output_path(output)
    check_unclaimed(output)                     # not being written by another process now
    emotion = settings["emotion"]
    emotion_file = schedule_file(emotion)
    for p in (request.audio, *([request.controls] if request.controls else []),
              *([emotion_file] if emotion_file else []), avatar.dir):
        if overwrites(output, p):
            raise UsageError(f"{output}: the output would overwrite an input ({p}); choose another output path")
    fmt = output_format(output, settings["codec"])
    rate = avatar.rate if request.fps is None else parse_rate(request.fps)
    audio = audio or decode_audio(request.audio)
    soundtrack = plan_soundtrack(request.audio, audio.channels, audio.channel_mask, fmt)
    n = frames_for(len(audio.samples), rate)
    schedule = read_schedule_file(emotion_file) if emotion_file else None
    per_frame = emotion_schedule(emotion, n, schedule)
    controls = read_control_file(request.controls) if request.controls else None
    return Clip(request, avatar, output, audio, n, rate, fmt, settings["steps"], settings["seed"], per_frame,
                hashlib.sha256(schedule).hexdigest() if schedule is not None else emotion,
                load_controls(request.controls, n, controls) if controls is not None else None,
                hashlib.sha256(controls).hexdigest() if controls is not None else None, key, settings["blend"],
                soundtrack)
