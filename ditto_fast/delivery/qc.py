"""QC: a file checked against a delivery profile, one requirement a line (ok, FAIL, or a note where the user
waived it, with what was measured): container and extension, completeness (a truncated file: essence shorter than
declared, packets cut short), codec and profile/level, bitrate, GOP, scan and field order, frame size and rate,
colour tags (each), pixel format, audio tracks, silence off the speech tracks, DC offset, loudness and true peak,
timecode, audio vs video duration, 608 captions decoded back. The render runs the same check on its file before the rename."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

from ditto_fast.audio.loudness import GATE_SECONDS, QUIET_LUFS, measure
from ditto_fast.core.errors import QCError, UsageError
from ditto_fast.delivery.caption_readback import read_captions
from ditto_fast.delivery.fileinfo import MediaFacts, read_facts
from ditto_fast.delivery.plain import PLAIN_OUTPUTS, plain_profile
from ditto_fast.delivery.profiles import DeliveryProfile, load_profile, shipped_profiles
from ditto_fast.media.rates import from_stream

BITRATE_TOLERANCE = 0.05        # CBR within 5 % of nominal
LOUDNESS_TOLERANCE = 0.5        # LU
SILENT_DBFS = -90.0
DC_LIMIT_DBFS = -50.0           # a DC offset (mean) above this on the speech fails
DURATION_ROUNDING = 0.01        # ffmpeg gives the declared duration in 1/100 s, rounded down
HZ = r"(\d+) Hz"
MPEG2_PL = {0x82: ("422", "high"), 0x85: ("422", "main"), 0x44: ("main", "high"), 0x48: ("main", "main")}
FILE_EXTENSIONS = {"mxf": (".mxf",), "mov": (".mov", ".qt"), "mp4": (".mp4", ".m4v"),
                   "matroska": (".mkv", ".webm"), "mpegts": (".ts", ".m2ts", ".mts"), "avi": (".avi",)}
COLOUR_KEYS = ("primaries", "transfer", "matrix", "range")
FIELD_ORDERS = {"progressive": "progressive", "top first": "top first", "bottom first": "bottom first",
                "top coded first (swapped)": "top coded first, bottom shown first (swapped)",
                "bottom coded first (swapped)": "bottom coded first, top shown first (swapped)"}
# ITU-T H.273 codes (MPEG-2's sequence display extension uses them) by ffmpeg's names for them
H273 = {"primaries": {1: "bt709", 2: "unknown", 4: "bt470m", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m",
                      8: "film", 9: "bt2020", 10: "smpte428", 11: "smpte431", 12: "smpte432"},
        "transfer": {1: "bt709", 2: "unknown", 4: "gamma22", 5: "gamma28", 6: "smpte170m", 7: "smpte240m",
                     8: "linear", 11: "iec61966-2-4", 13: "iec61966-2-1", 14: "bt2020-10", 15: "bt2020-12",
                     16: "smpte2084", 18: "arib-std-b67"},
        "matrix": {0: "gbr", 1: "bt709", 2: "unknown", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m",
                   8: "ycgco", 9: "bt2020nc", 10: "bt2020c"}}
FFMPEG_PROFILE = {"prores": {"hq": "HQ"}, "h264": {"high": "High", "main": "Main", "baseline": "Baseline"}}


@dataclass(frozen=True)
class Requirement:
    name: str
    ok: bool
    expected: str
    measured: str
    waived: bool = False            # not met, but the user said so (--loudness off): a note, not a failure

    @property
    def status(self) -> str:
        return "ok" if self.ok else "note" if self.waived else "FAIL"

    def line(self) -> str:
        return f"{self.status:<5}{self.name:<16}{self.measured}" + ("" if self.ok else f"  (expected {self.expected})")


def check_file(path: str | Path, profile: DeliveryProfile, *, size: tuple[int, int] | None = None,
               rate: Fraction | None = None, timecode: str | None = None,
               loudness: tuple[float, float] | None | str = "profile",
               facts: MediaFacts | None = None, captions: bool = False) -> list[Requirement]:
    """Every requirement of `profile` checked on the file. `size`, `rate` are what a profile that leaves them open
    is checked for (None: any); `timecode` and `loudness` override the profile's: loudness "profile", a (target,
    ceiling), "off" (measured against the profile's, a note where not met: the user chose levels as spoken) or
    None (no loudness lines; see loudness_wanted); `facts`: the file's, when already read; `captions`: 608 captions
    must be in it (as a profile's `captions: required` says in any case)."""
    facts = facts or read_facts(path)
    v = profile.video
    out: list[Requirement] = []

    def req(name: str, ok: bool, expected: str, measured: str, waived: bool = False) -> None:
        out.append(Requirement(name, bool(ok), expected, measured, bool(waived) and not ok))

    req("container", facts.container == profile.container, profile.container, facts.container)
    _extension(req, Path(path), facts, profile)
    _complete(req, facts)
    video = facts.video
    if video is None:
        req("video", False, v.codec, "no video stream")
        return out
    req("codec", video.codec == v.codec, v.codec, video.codec)      # the profile's codec names are ffmpeg's
    _profile_level(req, facts, profile)
    seconds = video.packets / float(_rate(video) or 1)
    if v.bitrate is not None and seconds > 0:
        measured = 8 * video.bytes / seconds
        req("bitrate", abs(measured / v.bitrate - 1) <= BITRATE_TOLERANCE, f"{v.bitrate / 1e6:g} Mb/s constant",
            f"{measured / 1e6:.2f} Mb/s")
    keys = [round(t * float(_rate(video) or 1)) for t in facts.keyframe_times]
    gaps = [b - k for k, b in zip(keys, keys[1:] + [video.packets])]
    req("gop", bool(keys) and keys[0] == 0 and max(gaps) <= v.gop, f"key frame every {v.gop} frames or less",
        f"key frames at {keys[:6]}{'...' if len(keys) > 6 else ''}, longest gap {max(gaps) if gaps else '-'}")
    _scan(req, facts, profile)
    got_size = re.search(r"(\d{2,5})x(\d{2,5})", video.detail)
    got = (int(got_size.group(1)), int(got_size.group(2))) if got_size else None
    want = v.size or size
    req("frame size", got is not None and (want is None or got == tuple(want)),
        "x".join(map(str, want)) if want else "any", "x".join(map(str, got)) if got else "unknown")
    want_rate = v.rate or rate
    got_rate = _rate(video)
    req("frame rate", got_rate is not None and (want_rate is None or got_rate == want_rate),
        f"{float(want_rate):.3f} fps" if want_rate else "any", f"{float(got_rate or 0):.3f} fps")
    _colour(req, facts, profile)
    pix_fmt = picture_tags(video.detail).get("pix_fmt", "unknown")
    req("pixel format", pix_fmt == v.pix_fmt, v.pix_fmt, pix_fmt)
    _audio(req, facts, profile, path, profile.loudness if loudness in ("profile", "off") else loudness,
           waived=loudness == "off")
    want_tc = timecode or profile.timecode
    req("timecode", want_tc is None or facts.timecode == want_tc, want_tc or "none", facts.timecode or "none")
    if facts.audio:
        diff = abs(facts.audio[0].seconds - seconds)
        req("duration A/V", diff <= 1 / float(_rate(video) or 25) + 1e-6, "audio as long as video (one frame)",
            f"video {seconds:.3f} s, audio {facts.audio[0].seconds:.3f} s")
    _captions(req, Path(path), captions or profile.captions.mode == "required")
    return out


def _captions(req, path: Path, wanted: bool) -> None:
    """The 608 captions as ffmpeg's decoder reads them back: where carried, channel, cues, first and last time."""
    track = decoded_captions(path)
    if track is None or not track.captions:
        measured = "none" if track is None else f"{track.carrier} present, nothing decodes"
    else:
        c = track.captions
        measured = (f"EIA-608 {track.channel} in {track.carrier}: {len(c)} cue{'s' * (len(c) != 1)}, "
                    f"{c[0].start:.3f}-{c[-1].end:.3f} s")
    req("captions", not wanted or bool(track and track.captions), "EIA-608 captions" if wanted else "any", measured)


@functools.lru_cache(maxsize=8)
def _decoded(resolved: str, mtime_ns: int, size: int):
    return read_captions(resolved)


def decoded_captions(path: Path):
    """read_captions of `path`, once per version of the file (closest_profile checks one file many times)."""
    st = path.stat()
    return _decoded(str(path.resolve()), st.st_mtime_ns, st.st_size)


def closest_profile(path: str | Path) -> tuple[DeliveryProfile, list[Requirement], list[str]]:
    """The profile a file comes closest to: of the shipped ones for its container and video codec, and what a render
    without --delivery writes in them (delivery/plain.py), the one with the fewest failing requirements (a shipped
    one on a tie); with its requirements and the names it was chosen from. UsageError for none."""
    facts = read_facts(path)
    codec = facts.video.codec if facts.video else "no video"
    candidates = [p for p in map(load_profile, shipped_profiles())
                  if p.container == facts.container and p.video.codec == codec]
    candidates += [p for p in [plain_profile(facts.container, codec)] if p is not None]
    if not candidates:
        pairs = sorted({f"{p.container} {p.video.codec}" for p in map(load_profile, shipped_profiles())})
        raise UsageError(f"{path}: no profile is for {facts.container} files of {codec}: without --delivery qc "
                         f"checks what render writes ({', '.join(PLAIN_OUTPUTS)}) and the shipped profiles' "
                         f"({', '.join(pairs)}); name the one to check with --delivery NAME|FILE.yaml")
    checked = [(p, check_file(path, p, facts=facts)) for p in candidates]       # the file read once
    best, result = min(checked, key=lambda pr: len(failures(pr[1])))
    return best, result, [p.name for p in candidates]


def loudness_wanted(profile: DeliveryProfile, value: str | float | None) -> tuple[float, float] | str | None:
    """check_file's `loudness` for a --loudness value (render's, qc's): None the profile's, "off" as it is, a
    target in LUFS that target under the profile's true-peak ceiling (-1 dBTP where it has none)."""
    if value is None or value == "off":
        return profile.loudness if value is None else "off"
    return float(value), profile.loudness[1] if profile.loudness else -1.0


def failures(requirements: list[Requirement]) -> list[Requirement]:
    """The requirements that fail (a waived one is a note, not a failure)."""
    return [r for r in requirements if not r.ok and not r.waived]


def summary(requirements: list[Requirement]) -> str:
    """'16/17 ok, 1 FAIL', '15/17 ok, 2 noted (--loudness off)'."""
    ok, bad = sum(r.ok for r in requirements), len(failures(requirements))
    noted = len(requirements) - ok - bad
    return f"{ok}/{len(requirements)} ok" + (f", {bad} FAIL" if bad else "") + \
        (f", {noted} noted (--loudness off)" if noted else "")


def require(path: str | Path, profile: DeliveryProfile, shown: str | Path | None = None,
            **expected) -> list[Requirement]:
    """check_file, raising QCError (one line naming the output and what failed) when any requirement fails."""
    result = check_file(path, profile, **expected)
    bad = failures(result)
    if bad:
        what = "; ".join(f"{r.name} {r.measured} (expected {r.expected})" for r in bad)
        raise QCError(f"{shown or path}: fails delivery profile {profile.name}: {what}; nothing was written there")
    return result


def as_json(requirements: list[Requirement]) -> list[dict]:
    """The requirements as plain dicts (name, ok, expected, measured)."""
    return [asdict(r) for r in requirements]


def _rate(stream) -> Fraction | None:
    """The stream's frame rate as ffmpeg reads it, exact for the broadcast rates."""
    m = re.search(r"([\d.]+) fps", stream.detail)
    return None if m is None else from_stream(float(m.group(1)))


def _extension(req, path: Path, facts: MediaFacts, profile: DeliveryProfile) -> None:
    """The file's name says what it holds: its extension is its container's (an MP4 named .mxf fails) and the
    profile's."""
    suffix = path.suffix.lower()
    theirs = FILE_EXTENSIONS.get(facts.container)
    fits = (theirs is None or suffix in theirs) and suffix == profile.extension
    measured = (suffix or "(none)") + ("" if theirs is None or suffix in theirs else
                                       f", but the file is {facts.container.upper()} (name it {theirs[0]})")
    req("extension", fits, profile.extension, measured)


def _complete(req, facts: MediaFacts) -> None:
    """Whether the file holds all it declares: the essence (the longest stream's packets) lasts the container's
    declared duration (to within one frame and the 1/100 s it is given in), and no packet is cut short."""
    frame = 1 / float(_rate(facts.video) or 25) if facts.video else 1 / 25
    declared, held = facts.declared_seconds, facts.essence_seconds
    short = declared is not None and held < declared - frame - DURATION_ROUNDING
    cut = [f"{s.corrupt} {s.kind} packet{'s' if s.corrupt > 1 else ''} cut short (stream {s.index})"
           for s in facts.streams if s.corrupt]
    said = f"{declared:.2f} s declared" if declared is not None else "no duration declared"
    if short or cut:
        measured = "truncated: " + "; ".join([*([f"the essence lasts {held:.3f} s of the {said}"] if short else []),
                                              *cut])
    else:
        measured = f"{held:.3f} s of essence, {said}"
    req("complete", not (short or cut), "all of the declared duration, no packet cut short", measured)


def _profile_level(req, facts: MediaFacts, profile: DeliveryProfile) -> None:
    v = profile.video
    if v.codec == "mpeg2video":
        pl = (facts.mpeg2 or {}).get("profile_level")
        got = MPEG2_PL.get(pl)
        want = (v.profile or "422", v.level or "high")
        chroma = (facts.mpeg2 or {}).get("chroma_format", "?").replace("?", "chroma unknown")
        measured = "unknown (no MPEG-2 sequence extension in the video)" if pl is None else \
            f"unknown (profile_and_level_indication 0x{pl:02x}; {chroma}, from the bitstream)" if got is None else \
            f"{got[0]}@{got[1]} ({chroma}, from the bitstream)"
        req("profile/level", got == want, f"{want[0]}@{want[1]}", measured)
    elif v.profile and v.codec in FFMPEG_PROFILE:
        name = FFMPEG_PROFILE[v.codec][v.profile]
        req("profile", f"({name})" in facts.video.detail, name,
            (re.search(r"^\s*\(([^)]*)\)", facts.video.detail) or [None, "unknown"])[1])


def picture_tags(detail: str) -> dict[str, str]:
    """What ffmpeg's stream line says in the parentheses after the pixel format, by name: range (tv, pc), matrix,
    primaries, transfer (ffmpeg's names; "unknown" where unset) and field order; a name it does not say is absent.
    The parentheses may nest ("top coded first (swapped)")."""
    items = _split_top(detail)
    for item in items[1:]:
        m = re.fullmatch(r"\s*([a-z][a-z0-9_]*)(?:\((.*)\))?\s*", item, re.S)
        if m is None:
            continue
        tags = {"pix_fmt": m.group(1)}
        for part in _split_top(m.group(2) or ""):
            part = part.strip()
            if part in ("tv", "pc"):
                tags["range"] = part
            elif part in FIELD_ORDERS:
                tags["field"] = FIELD_ORDERS[part]
            elif re.fullmatch(r"[\w-]+(/[\w-]+/[\w-]+)?", part):     # one name for all three, or matrix/primaries/trc
                names = part.split("/") * (1 if "/" in part else 3)
                tags.update(zip(("matrix", "primaries", "transfer"), names))
        return tags
    return {}


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]] if text else []


def _colour(req, facts: MediaFacts, profile: DeliveryProfile) -> None:
    """Primaries, transfer, matrix and range each against the profile's, as the container and codec say; MPEG-2's
    sequence display extension (its own colour description) as well."""
    want = profile.video.colour
    tags = picture_tags(facts.video.detail)
    got = {k: tags.get(k, "unknown") for k in COLOUR_KEYS}
    ok = got == {k: want[k] for k in COLOUR_KEYS}
    measured = ", ".join(f"{k} {got[k]}" for k in COLOUR_KEYS)
    if facts.mpeg2 is not None and profile.video.codec == "mpeg2video":
        bits = facts.mpeg2.get("colour")
        if bits is None:
            measured += "; bitstream: no colour description"
        else:
            said = {k: H273[k].get(code, f"code {code}") for k, code in bits.items()}
            ok = ok and all(said[k] == want[k] for k in said)
            measured += "; bitstream: " + ", ".join(f"{k} {said[k]}" for k in COLOUR_KEYS if k in said)
    req("colour", ok, ", ".join(f"{k} {want[k]}" for k in COLOUR_KEYS), measured)


def _scan(req, facts: MediaFacts, profile: DeliveryProfile) -> None:
    v = profile.video
    got = picture_tags(facts.video.detail).get("field", "unflagged")
    want = {"tff": "top first", "bff": "bottom first"}.get(v.field_order, "progressive")
    ok = got == want or (want == "progressive" and got == "unflagged")
    if v.codec == "mpeg2video" and facts.mpeg2:
        bits = facts.mpeg2
        stream_says = "progressive" if bits.get("progressive_sequence") else \
            "top first" if bits.get("top_field_first") else "bottom first"
        ok = ok and stream_says == want
        got = f"container/codec: {got}; bitstream: {stream_says}"
    req("scan", ok, "interlaced, " + want if v.interlaced else want, got)


def _audio(req, facts: MediaFacts, profile: DeliveryProfile, path, loudness, waived: bool = False) -> None:
    """Track layout, silence off the speech tracks, and the speech's loudness and true peak: measured on the
    profile's speech tracks wherever the file has them (a file of fewer or other tracks included), or a FAIL
    saying why not."""
    a = profile.audio
    tracks = facts.audio
    layout = "any layout" if a.channels is None else "stereo" if a.channels == 2 else "mono"
    shapes = [f"{s.codec} {_field(s.detail, HZ)} Hz {_channels(s.detail)}" for s in tracks]
    want = f"{a.tracks} x {a.codec} {a.rate} Hz {layout}"
    fits = [s == f"{a.codec} {a.rate} Hz {layout}" or a.channels is None and s.startswith(f"{a.codec} {a.rate} Hz ")
            for s in shapes]
    req("audio tracks", len(tracks) == a.tracks and all(fits), want,
        f"{len(tracks)}: " + (", ".join(sorted(set(shapes), key=shapes.index)) or "none"))
    quiet = [t for t in range(1, min(a.tracks, len(tracks)) + 1) if t not in a.speech]
    if quiet:
        peaks = [measure(path, f"[0:a:{t - 1}]aformat=sample_fmts=fltp").true_peak for t in quiet]
        req("silent tracks", all(p <= SILENT_DBFS for p in peaks), f"tracks {quiet} silent",
            f"loudest peak {max(peaks):.1f} dBTP")
    dc_expected = f"under {DC_LIMIT_DBFS:g} dBFS"
    target, ceiling = loudness or (None, None)
    expected = (f"{target:g} LUFS ±{LOUDNESS_TOLERANCE}", f"<= {ceiling:g} dBTP") if loudness else ("", "")
    missing = [t for t in a.speech if t > len(tracks)]
    if missing:
        why = (f"not measured: the speech goes on track{'s' if len(a.speech) > 1 else ''} "
               f"{', '.join(map(str, a.speech))} and the file has {len(tracks) or 'no'} audio track"
               f"{'' if len(tracks) == 1 else 's'}")
        req("dc offset", False, dc_expected, why)
        if loudness is not None:
            req("loudness", False, expected[0], why, waived)
            req("true peak", False, expected[1], why, waived)
        return
    if len(a.speech) == 2:
        graph = f"[0:a:{a.speech[0] - 1}][0:a:{a.speech[1] - 1}]amerge=inputs=2"
    else:
        graph = f"[0:a:{a.speech[0] - 1}]anull"
    got = measure(path, graph)
    dc_db = 20 * math.log10(got.dc) if got.dc > 0 else -math.inf
    req("dc offset", dc_db <= DC_LIMIT_DBFS, dc_expected, f"{dc_db:.1f} dBFS" + (" (none)" if got.dc == 0 else ""))
    if loudness is None:
        return
    seconds = min(tracks[t - 1].seconds for t in a.speech)
    if got.integrated > QUIET_LUFS:
        level = f"{got.integrated:.1f} LUFS"
    elif seconds < GATE_SECONDS:
        level = f"unmeasurable: {seconds:.2f} s of speech, under BS.1770's {GATE_SECONDS:g} s gating block"
    else:
        level = f"{got.integrated:.1f} LUFS (silent, or under BS.1770's -70 LUFS gate)"
    req("loudness", abs(got.integrated - target) <= LOUDNESS_TOLERANCE, expected[0], level, waived)
    req("true peak", got.true_peak <= ceiling, expected[1], f"{got.true_peak:.1f} dBTP", waived)


def _field(text: str, pattern: str) -> str:
    m = re.search(pattern, text)
    return m.group(1) if m else "unknown"


def _channels(detail: str) -> str:
    m = re.search(r"Hz, ([^,]+)", detail)
    return m.group(1).strip() if m else "unknown"
