"""What a render does with captions, decided when its request is checked (before any work): the cues (timed text,
read and checked now) or the script's words (timed in the render), whether 608 is embedded and on which channel,
which sidecars are written, whether they are burned in; and the output format that carries them."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ditto_fast.captions.align import FRAME_SECONDS, HEAD_LETTERS, TimedWord, frames_needed, word_symbols
from ditto_fast.captions.charset import check_608
from ditto_fast.captions.cues import Cue, read_cues
from ditto_fast.captions.eia608 import pace
from ditto_fast.captions.grouping import group_words
from ditto_fast.captions.embed import check_embeddable, embeds_in_sei
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.delivery.profiles import DeliveryProfile


@dataclass(frozen=True)
class CaptionPlan:
    source: Path                        # the timed-text or script file
    sha256: str                         # of that file (the render's digest records it)
    cues: tuple[Cue, ...] | None        # timed text's; None: the script's, timed in the render
    words: tuple[str, ...] | None       # the script's words (608's characters)
    embed: bool
    channel: str
    sidecars: tuple[str, ...]
    burn_in: bool
    notes: tuple[str, ...] = ()         # what the user should know (a cue cut short by the next one)


def plan_captions(request, profile: DeliveryProfile | None, fmt, rate: Fraction, frames: int,
                  audio_seconds: float) -> CaptionPlan | None:
    """The captions a checked request asks for, or None; UsageError (exit 2) for timed text that is malformed, runs
    past the audio, has characters 608 lacks or a cue 608 cannot show before the clip's `frames` (at `rate`) end,
    for a script that is empty, and for options that contradict."""
    mode = profile.captions.mode if profile is not None else "embedded"
    given = request.captions or request.script
    if request.captions and request.script:
        raise UsageError("--captions and --script both give the captions; give one of them")
    if given is None:
        if mode == "required":
            raise UsageError(f"--delivery {profile.name} requires captions; give --captions FILE or --script FILE")
        if request.captions_out or request.burn_in:
            raise UsageError(f"--{'captions-out' if request.captions_out else 'burn-in'} needs captions; give "
                             "--captions FILE or --script FILE")
        return None
    path = Path(given)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found; give an existing captions or script file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror}); check the file") from None
    cues = words = None
    notes: list[str] = []
    if request.captions:
        cues = tuple(read_cues(path, audio_seconds, notes))
    else:
        words = script_words(path, data)
        check_script_fits(words, audio_seconds, str(path))     # before HuBERT loads, where it surely cannot fit
    where = f"--delivery {profile.name}" if profile is not None else str(request.output or "the output")
    embed = mode != "none"
    if embed:
        try:
            check_embeddable(fmt.container, fmt.codec, rate, where)
        except UsageError:
            if profile is not None or not (request.captions_out or request.burn_in):
                raise
            embed = False               # a plain output that cannot carry 608: the sidecars or burn-in asked
    channel = profile.captions.channel if profile is not None else "CC1"
    if embed and cues is not None:
        pace(list(cues), rate, frames, channel, where=str(path))    # a cue 608 cannot show in time: refused now
    sidecars = tuple(request.captions_out.split(",")) if request.captions_out else \
        (profile.captions.sidecars if profile is not None else ())
    return CaptionPlan(path, hashlib.sha256(data).hexdigest(), cues, words, embed, channel, sidecars,
                       bool(request.burn_in), tuple(notes))


def script_words(path: Path, data: bytes) -> tuple[str, ...]:
    """The words of a plain-text script, each in 608's characters; UsageError for an empty or unreadable one."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the script as UTF-8") from None
    words = []
    for n, line in enumerate(text.splitlines(), 1):
        words += [check_608(w, f"{path}: line {n}") for w in line.split()]
    if not any(re.search(r"\w", w) for w in words):
        raise UsageError(f"{path}: the script has no words; give the text the voice reads")
    return tuple(words)


def check_script_fits(words: tuple[str, ...], audio_seconds: float, where: str) -> None:
    """Before HuBERT loads: UsageError naming the script's file where its words surely cannot be timed and shown in
    `audio_seconds` of speech, whatever the alignment finds: more letters than the head has frames for (one a
    letter, 50 a second), or more captions than 608 can load and show even with every word at its latest."""
    tokens = [t for w in words for t in word_symbols(w, HEAD_LETTERS)]
    frames = int(audio_seconds / FRAME_SECONDS) + 1
    if not tokens:
        raise UsageError(f"{where}: the script has no letters to align; give the words the voice reads")
    if frames_needed(tokens) > frames:
        raise UsageError(f"{where}: the script is longer than the speech ({len(tokens)} letters need "
                         f"{frames_needed(tokens)} frames of 20 ms, the {audio_seconds:.2f} s of speech has {frames}); "
                         "give the words this audio reads")
    group_words([TimedWord(w, audio_seconds, audio_seconds) for w in words], audio_seconds, where)


@dataclass(frozen=True)
class CaptionedFormat:
    """An output format with what captions ask of the encoder: no B frames where 608 goes into the video's SEI (each
    access unit then is its frame), and the captions drawn into the picture (`burn_in`: an SRT file for libass)."""

    base: object
    sei: bool = False
    burn_in: Path | None = None

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def with_nvenc(self, works: bool) -> "CaptionedFormat":
        return dataclasses.replace(self, base=self.base.with_nvenc(works))

    def video_filters(self, size: tuple[int, int], planes: bool) -> str:
        chain = self.base.video_filters(size, planes)
        if self.burn_in is None:
            return chain
        name = re.sub(r"([\\':,;\[\]])", r"\\\1", str(self.burn_in))
        # drawn first, on the frames as rendered (then scaled, converted and flagged as the format says)
        return f"subtitles=filename='{name}':force_style='Outline=1.5,Shadow=0',{chain}"

    def video_args(self, crf: int, preset: str) -> list[str]:
        args = self.base.video_args(crf, preset)
        return [*args, "-bf", "0"] if self.sei else args


def captioned_format(fmt, plan: CaptionPlan | None, burn_in_file: Path | None):
    """`fmt` as captions ask it to encode (itself when they ask nothing of the encoder)."""
    if plan is None:
        return fmt
    sei = plan.embed and embeds_in_sei(fmt.container, fmt.codec)
    if not sei and burn_in_file is None:
        return fmt
    return CaptionedFormat(fmt, sei, burn_in_file)
