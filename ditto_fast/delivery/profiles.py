"""Delivery profiles: what a station's playout takes (container, video, audio layout, loudness, timecode), as
YAML data in `configs/delivery/NAME.yaml` or a user's file of the same shape, checked key by key when read.

A profile is refused with one line naming the file and the key: an unknown key, a value of the wrong kind, a
codec/container or codec/pixel-format pairing ffmpeg cannot write, a number outside its range (RANGES, BITRATES,
MPEG2_LIMITS, DNXHD_BITRATES: each declared once here), all before anything loads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

from ditto_fast.core.checks import check_choice, check_flag, check_number, refuse
from ditto_fast.core.config import CONFIG_DIR, declaration, read_yaml_file
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.encoding.formats import CONTAINERS
from ditto_fast.media.rates import RENDER_RATES, parse_frame_rate

PROFILE_DIR = CONFIG_DIR / "delivery"
PROFILE_FILE_SUFFIXES = (".yaml", ".yml")       # a --delivery value ending so names a profile file
EXTENSIONS = {"mxf": ".mxf", **{container: suffix for suffix, container in CONTAINERS.items()}}   # and render's
# what each container carries (the pairs ffmpeg's muxers write and playout servers read)
CONTAINER_VIDEO = {"mxf": ("mpeg2video", "dnxhd"), "mov": ("prores", "dnxhd", "h264", "mpeg2video"),
                   "mp4": ("h264",)}
CONTAINER_AUDIO = {"mxf": ("pcm_s16le", "pcm_s24le"), "mov": ("pcm_s16le", "pcm_s24le", "aac"), "mp4": ("aac",)}
PIX_FMTS = {"mpeg2video": ("yuv422p", "yuv420p"), "dnxhd": ("yuv422p", "yuv422p10le"),
            "prores": ("yuv422p10le",), "h264": ("yuv420p",)}
PROFILES = {"mpeg2video": ("422", "main"), "prores": ("hq",), "h264": ("high", "main", "baseline"),
            "dnxhd": ()}
LEVELS = {"mpeg2video": ("high", "main")}
INTERLACED_CODECS = ("mpeg2video", "dnxhd")
KEYS = {
    "": ("container", "video", "audio", "loudness", "timecode", "captions"),
    "video": ("codec", "profile", "level", "bitrate", "crf", "preset", "gop", "b_frames", "pix_fmt", "size", "rate",
              "scan", "field_order", "fields", "colour"),
    "colour": ("primaries", "transfer", "matrix", "range"),
    "audio": ("codec", "bitrate", "rate", "tracks", "channels", "speech"),
    "loudness": ("target", "true_peak"),
    "timecode": ("start", "drop_frame"),
    "captions": ("mode", "channel", "sidecars"),
}
CAPTION_MODES = ("none", "embedded", "required")    # none: never embedded; embedded: when given; required: always
CAPTION_CHANNELS = ("CC1",)
SIDECAR_KINDS = ("scc", "vtt", "srt", "ttml")
TIMECODE = re.compile(r"^(\d\d):([0-5]\d):([0-5]\d)([:;])(\d\d)$")
# the range of every number a profile holds: (low, high, unit)
RANGES: dict[str, tuple[float, float, str]] = {
    "video.crf": (declaration("render", "crf")["low"], declaration("render", "crf")["high"], ""),   # as render.crf
    "video.gop": (1, 300, "frames"),
    "video.b_frames": (0, 4, "frames"),
    "video.size": (64, 8192, "pixels a side"),
    "audio.tracks": (1, 16, "tracks"),
    "audio.channels": (1, 2, "channels a track"),
    "audio.rate": (48000, 48000, "Hz"),
    "audio.bitrate": (32_000, 512_000, "bits/s"),           # AAC
    "loudness.target": (-40, -5, "LUFS"),
    "loudness.true_peak": (-10, 0, "dBTP"),
}
# video bits/s by codec (ProRes takes none: its profile sets the rate); MPEG-2's upper bound is its level's
BITRATES = {"mpeg2video": (10_000_000, 300_000_000), "h264": (100_000, 800_000_000)}
# MPEG-2 (profile, level): the largest picture and bitrate it allows (ISO/IEC 13818-2, table 8-12/8-13)
MPEG2_LIMITS = {("422", "high"): (1920, 1088, 300_000_000), ("422", "main"): (720, 608, 50_000_000),
                ("main", "high"): (1920, 1152, 80_000_000), ("main", "main"): (720, 576, 15_000_000)}
# DNxHD: the bitrates (Mb/s) ffmpeg's encoder has for each picture (width, height, interlaced, pixel format)
DNXHD_BITRATES = {
    (1920, 1080, False, "yuv422p"): (36, 45, 75, 90, 115, 120, 145, 175, 185, 220, 240, 290, 365, 440),
    (1920, 1080, False, "yuv422p10le"): (175, 185, 365, 440),
    (1920, 1080, True, "yuv422p"): (120, 145, 185, 220),
    (1920, 1080, True, "yuv422p10le"): (185, 220),
    (1440, 1080, False, "yuv422p"): (63, 84, 100, 110),
    (1440, 1080, True, "yuv422p"): (80, 90, 100, 110, 120, 145),
    (1280, 720, False, "yuv422p"): (60, 75, 90, 110, 120, 145, 180, 220),
    (1280, 720, False, "yuv422p10le"): (90, 180, 220),
    (960, 720, False, "yuv422p"): (42, 60, 75, 115),
}
LOUDNESS_RANGE = RANGES["loudness.target"][:2]
TRUE_PEAK_RANGE = RANGES["loudness.true_peak"][:2]


@dataclass(frozen=True)
class VideoSpec:
    codec: str
    profile: str | None
    level: str | None
    bitrate: int | None             # constant bitrate, bits/s
    crf: int | None                 # constant quality (h264)
    preset: str | None
    gop: int                        # frames from an I frame to the next (1: intra only)
    b_frames: int
    pix_fmt: str
    size: tuple[int, int] | None    # None: the avatar's own
    rate: Fraction | None           # frames/s (interlaced: two fields each); None: the avatar's own or --fps
    interlaced: bool
    field_order: str | None         # tff or bff
    colour: dict[str, str]
    field_rate: bool = False        # interlaced: each field its own moment (rendered at twice the frame rate)


@dataclass(frozen=True)
class AudioSpec:
    codec: str
    bitrate: str | None             # aac only
    rate: int
    tracks: int
    channels: int | None            # per track (None: any layout, as a plain render keeps the speech's)
    speech: tuple[int, ...]         # 1-based tracks that carry the speech


@dataclass(frozen=True)
class CaptionSpec:
    mode: str = "none"              # CAPTION_MODES
    channel: str = "CC1"            # the 608 channel embedded
    sidecars: tuple[str, ...] = ()  # SIDECAR_KINDS written beside the file when captions are given


@dataclass(frozen=True)
class DeliveryProfile:
    """One delivery: container, video, audio layout, loudness target (None: levels as spoken), start timecode."""

    name: str
    source: str                     # the file it was read from
    sha256: str                     # of its checked content (the render digest records it)
    container: str
    video: VideoSpec
    audio: AudioSpec
    loudness: tuple[float, float] | None    # (target LUFS, true-peak ceiling dBTP)
    timecode: str | None
    drop_frame: bool
    captions: CaptionSpec = CaptionSpec()   # what it asks of captions (none by default)

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.container]


def shipped_profiles() -> list[str]:
    """The names of the profiles in configs/delivery."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def is_profile_file(value: str | Path) -> bool:
    """Whether a --delivery value names a YAML file (a shipped profile's name never ends so)."""
    return str(value).lower().endswith(PROFILE_FILE_SUFFIXES)


def profile_path(name_or_file: str | Path) -> Path:
    """The file a --delivery value names: a shipped profile's name or a YAML file; UsageError for neither."""
    text = str(name_or_file)
    if re.fullmatch(r"[a-z0-9][a-z0-9-]*", text) and (PROFILE_DIR / f"{text}.yaml").is_file():
        return PROFILE_DIR / f"{text}.yaml"
    path = Path(text)
    if is_profile_file(path):
        if not path.exists():       # a folder, a FIFO or a device is refused by name when read
            raise InputError(f"{path}: delivery profile not found; give a YAML file or one of "
                             f"{', '.join(shipped_profiles())}")
        return path
    raise UsageError(f"unknown delivery profile {text!r}; use one of {', '.join(shipped_profiles())} or a "
                     "FILE.yaml of the same shape")


def load_profile(name_or_file: str | Path) -> DeliveryProfile:
    """The profile a --delivery value names, read and checked (cached per file and modification time)."""
    path = profile_path(name_or_file)
    return _load(str(path.resolve()), path.stat().st_mtime_ns, str(path))


@lru_cache(maxsize=64)
def _load(resolved: str, mtime_ns: int, shown: str) -> DeliveryProfile:
    path = Path(resolved)
    data = read_yaml_file(path, "a delivery profile", shown)
    return check_profile(data, shown, path.stem)


def check_profile(data: Any, where: str, name: str) -> DeliveryProfile:
    """A profile from its parsed YAML, every key checked; UsageError '<where>: <key> ...' for the first bad one."""
    err = _Checker(where)
    top = err.mapping(data, "", required=("container", "video", "audio"))
    container = err.choice(top["container"], "container", tuple(CONTAINER_VIDEO))
    v = err.mapping(top["video"], "video", required=("codec", "pix_fmt", "scan"))
    codec = err.choice(v["codec"], "video.codec", tuple(PIX_FMTS))
    if codec not in CONTAINER_VIDEO[container]:
        err.fail("video.codec", f"{codec} cannot go in {container} (there: {', '.join(CONTAINER_VIDEO[container])})")
    pix_fmt = err.choice(v["pix_fmt"], "video.pix_fmt", PIX_FMTS[codec])
    scan = err.choice(v["scan"], "video.scan", ("progressive", "interlaced"))
    interlaced = scan == "interlaced"
    if interlaced and codec not in INTERLACED_CODECS:
        err.fail("video.scan", f"interlaced {codec} is not made here; use progressive "
                               f"(interlaced: {', '.join(INTERLACED_CODECS)})")
    field_order, fields = None, v.get("fields", "psf")
    if interlaced:
        field_order = err.choice(v.get("field_order"), "video.field_order", ("tff", "bff"))
        err.choice(fields, "video.fields", ("psf", "field-rate"))
        if fields == "field-rate" and v.get("rate") is None:
            err.fail("video.fields", "field-rate needs a fixed rate (video.rate)")
    elif v.get("field_order") is not None or "fields" in v:
        err.fail("video.field_order" if v.get("field_order") is not None else "video.fields",
                 "goes with scan: interlaced")
    bitrate = err.bitrate(v.get("bitrate"), "video.bitrate")
    crf = err.integer(v.get("crf"), "video.crf") if v.get("crf") is not None else None
    if codec in ("mpeg2video", "dnxhd") and bitrate is None:
        err.fail("video.bitrate", f"{codec} needs a constant bitrate such as 50M")
    if codec == "h264" and crf is None and bitrate is None:
        err.fail("video.crf", "h264 needs crf (constant quality) or bitrate")
    if codec == "prores" and bitrate is not None:
        err.fail("video.bitrate", "ProRes has no bitrate to choose (the HQ profile sets it); leave it out")
    gop = err.integer(v.get("gop", 1), "video.gop")
    b_frames = err.integer(v.get("b_frames", 0), "video.b_frames")
    if b_frames and gop <= b_frames:
        err.fail("video.b_frames", f"{b_frames} B frames need a gop longer than that (gop {gop})")
    profile = None
    if v.get("profile") is not None:
        profile = err.choice(str(v["profile"]).lower(), "video.profile", PROFILES[codec] or ("(none)",))
    level = None
    if v.get("level") is not None:
        level = err.choice(str(v["level"]).lower(), "video.level", LEVELS.get(codec, ("(none)",)))
    if codec == "mpeg2video":           # what the encoder writes when the profile leaves them out (delivery.py)
        profile, level = profile or ("422" if pix_fmt == "yuv422p" else "main"), level or "high"
    size = err.size(v.get("size"), "video.size")
    _codec_limits(err, codec, profile, level, pix_fmt, interlaced, size, bitrate)
    preset = v.get("preset")
    presets = declaration("render", "preset")["choices"]       # render.preset's: one list of x264 presets
    if preset is not None and (codec != "h264" or preset not in presets):
        err.fail("video.preset", f"one of {', '.join(presets)}, for h264 only")
    colour = err.mapping(v.get("colour") or {"primaries": "bt709", "transfer": "bt709", "matrix": "bt709",
                                             "range": "tv"}, "colour", required=KEYS["colour"])
    colour = {k: err.choice(colour[k], f"video.colour.{k}", ("bt709",) if k != "range" else ("tv",))
              for k in KEYS["colour"]}
    video = VideoSpec(codec, profile, level, bitrate, crf, preset, gop, b_frames, pix_fmt, size,
                      err.rate(v.get("rate"), "video.rate"), interlaced, field_order, colour, fields == "field-rate")

    a = err.mapping(top["audio"], "audio", required=("codec", "tracks", "channels", "speech"))
    acodec = err.choice(a["codec"], "audio.codec", ("pcm_s16le", "pcm_s24le", "aac"))
    if acodec not in CONTAINER_AUDIO[container]:
        err.fail("audio.codec", f"{acodec} cannot go in {container} (there: {', '.join(CONTAINER_AUDIO[container])})")
    tracks = err.integer(a["tracks"], "audio.tracks")
    channels = err.integer(a["channels"], "audio.channels")
    if container == "mxf" and channels != 1:
        err.fail("audio.channels", "MXF OP1a carries one mono PCM stream per track; use channels: 1")
    rate = err.integer(a.get("rate", 48000), "audio.rate")
    speech = a["speech"]
    if not isinstance(speech, list) or not speech or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            and 1 <= t <= tracks for t in speech):
        err.fail("audio.speech", f"must be a list of track numbers in 1..{tracks}, got {speech!r}")
    if len(set(speech)) != len(speech) or len(speech) * channels > 2:
        err.fail("audio.speech", "the speech is mono or a stereo pair: one or two mono tracks, or one stereo track")
    abitrate = a.get("bitrate")
    if acodec == "aac":
        if not isinstance(abitrate, str) or not re.fullmatch(r"\d{2,3}k", abitrate):
            err.fail("audio.bitrate", f"AAC needs a bitrate such as 160k, got {abitrate!r}")
        err.integer(int(abitrate[:-1]) * 1000, "audio.bitrate")
    elif abitrate is not None:
        err.fail("audio.bitrate", "PCM has no bitrate to choose; leave it out")
    audio = AudioSpec(acodec, abitrate, rate, tracks, channels, tuple(speech))

    loudness = None
    if top.get("loudness") is not None:
        ld = err.mapping(top["loudness"], "loudness", required=("target", "true_peak"))
        loudness = (err.number(ld["target"], "loudness.target"), err.number(ld["true_peak"], "loudness.true_peak"))
    timecode, drop = None, False
    if top.get("timecode") is not None:
        tc = err.mapping(top["timecode"], "timecode", required=("start",))
        drop = err.flag(tc.get("drop_frame", False), "timecode.drop_frame")
        try:
            timecode = check_timecode(tc["start"], video.rate, drop)
        except ValueError as e:
            err.fail("timecode.start", str(e))
    captions = CaptionSpec()
    if top.get("captions") is not None:
        cc = err.mapping(top["captions"], "captions", required=("mode",))
        sidecars = cc.get("sidecars", [])
        if not isinstance(sidecars, list) or not all(isinstance(k, str) and k in SIDECAR_KINDS for k in sidecars):
            err.fail("captions.sidecars", f"must be a list of {', '.join(SIDECAR_KINDS)}, got {sidecars!r}")
        captions = CaptionSpec(err.choice(cc["mode"], "captions.mode", CAPTION_MODES),
                               err.choice(cc.get("channel", "CC1"), "captions.channel", CAPTION_CHANNELS),
                               tuple(sidecars))
    import hashlib                      # here: the commands' options import this module, and hashlib is not light

    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    return DeliveryProfile(name, where, digest, container, video, audio, loudness, timecode, drop, captions)


def _codec_limits(err: "_Checker", codec: str, profile: str | None, level: str | None, pix_fmt: str,
                  interlaced: bool, size: tuple[int, int] | None, bitrate: int | None) -> None:
    """The bitrate and picture size the codec allows: BITRATES, MPEG-2's level (MPEG2_LIMITS), DNxHD's pictures and
    their bitrates (DNXHD_BITRATES)."""
    if codec == "dnxhd":
        pictures = {k[:2] for k in DNXHD_BITRATES}
        if size is None or size not in pictures:
            err.fail("video.size", f"DNxHD is made at {', '.join(f'{w}x{h}' for w, h in sorted(pictures))} only; "
                                   "name one, got " + ("x".join(map(str, size)) if size else "none (the avatar's own)"))
        rates = DNXHD_BITRATES.get((*size, interlaced, pix_fmt))
        scan = "interlaced" if interlaced else "progressive"
        if rates is None:
            err.fail("video.size", f"DNxHD has no {scan} {pix_fmt} at {size[0]}x{size[1]}")
        if bitrate % 1_000_000 or bitrate // 1_000_000 not in rates:
            err.fail("video.bitrate", f"must be one of {', '.join(f'{r}M' for r in rates)} for DNxHD "
                                      f"{size[0]}x{size[1]} {scan} {pix_fmt}, got {bitrate / 1e6:g}M")
        return
    if bitrate is not None:
        low, high = BITRATES[codec]
        if codec == "mpeg2video":
            high = min(high, MPEG2_LIMITS[(profile, level)][2])
        if not low <= bitrate <= high:
            at = f" at {profile}@{level}" if codec == "mpeg2video" else ""
            err.fail("video.bitrate",
                     f"must be {low / 1e6:g}M..{high / 1e6:g}M for {codec}{at}, got {bitrate / 1e6:g}M")
    if codec == "mpeg2video" and size is not None:
        width, height, _ = MPEG2_LIMITS[(profile, level)]
        if size[0] > width or size[1] > height:
            err.fail("video.size", f"{profile}@{level} MPEG-2 is at most {width}x{height}, got {size[0]}x{size[1]}")


def check_timecode(text: Any, rate: Fraction | None, drop_frame: bool | None = None) -> str:
    """A start timecode HH:MM:SS:FF (HH:MM:SS;FF drop-frame, only at 29.97 and 59.94) valid at `rate` (None: any
    rate, checked again when the render's rate is known); ValueError saying what is wrong."""
    m = TIMECODE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"must be HH:MM:SS:FF (HH:MM:SS;FF for drop-frame), got {text!r}")
    hh, mm, ss, sep, ff = m.groups()
    drop = sep == ";"
    if drop_frame is not None and drop != drop_frame:
        raise ValueError(f"{text} is {'drop' if drop else 'non-drop'}-frame but drop_frame is "
                         f"{str(drop_frame).lower()}; write ';' before the frames for drop-frame, ':' otherwise")
    if int(hh) > 23:
        raise ValueError(f"hours must be 00..23, got {text}")
    if rate is not None:
        fps = round(float(rate))
        if drop and rate.denominator != 1001:
            raise ValueError(f"drop-frame timecode ({text}) is for 29.97 and 59.94 fps only, not {float(rate):g}")
        if int(ff) >= fps:
            raise ValueError(f"frames must be below {fps} at {float(rate):g} fps, got {text}")
        if drop and int(ss) == 0 and int(mm) % 10 and int(ff) < 2 * (fps // 30):
            raise ValueError(f"{text} does not exist in drop-frame timecode (frames dropped at that minute)")
    return text


class _Checker:
    """Checks one profile's values (with core/checks.py, as every setting is); every failure is a UsageError naming
    the file and the key."""

    def __init__(self, where: str):
        self.where = where

    def at(self, key: str) -> str:
        return f"{self.where}: {key or 'profile'}"

    def fail(self, key: str, what: str) -> None:
        refuse(self.at(key), what)

    def mapping(self, value: Any, key: str, required: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            self.fail(key, "must be a mapping of keys")
        known = KEYS[key]
        for k in value:
            if k not in known:
                self.fail(f"{key}.{k}" if key else str(k), f"is not a profile key; known here: {', '.join(known)}")
        for k in required:
            if value.get(k) is None:
                self.fail(f"{key}.{k}" if key else k, "is missing")
        return value

    def choice(self, value: Any, key: str, choices: tuple[str, ...]) -> str:
        return check_choice(value, choices, self.at(key))

    def flag(self, value: Any, key: str) -> bool:
        return check_flag(value, self.at(key))

    def integer(self, value: Any, key: str) -> int:
        """A whole number in its RANGES range."""
        low, high, unit = RANGES[key]
        return check_number(value, low, high, self.at(key), integer=True, unit=unit)

    def number(self, value: Any, key: str) -> float:
        low, high, unit = RANGES[key]
        return check_number(value, low, high, self.at(key), integer=False, unit=unit)

    def bitrate(self, value: Any, key: str) -> int | None:
        if value is None:
            return None
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kM])", str(value))
        if m is None:
            self.fail(key, f"must be bits per second such as 50M or 8000k, got {value!r}")
        return int(float(m.group(1)) * (1_000_000 if m.group(2) == "M" else 1000))

    def size(self, value: Any, key: str) -> tuple[int, int] | None:
        if value is None:
            return None
        low, high, _ = RANGES[key]
        m = re.fullmatch(r"(\d{2,4})x(\d{2,4})", str(value))
        if m is None or int(m.group(1)) % 2 or int(m.group(2)) % 2 or \
                not all(low <= int(n) <= high for n in m.groups()):
            self.fail(key, f"must be WIDTHxHEIGHT (even numbers, {low}..{high} each) such as 1920x1080, got {value!r}")
        return int(m.group(1)), int(m.group(2))

    def rate(self, value: Any, key: str) -> Fraction | None:
        if value is None:
            return None
        try:
            return parse_frame_rate(value)
        except ValueError:
            self.fail(key, f"must be one of {', '.join(str(r) for r in RENDER_RATES)} (or null), got {value!r}")
