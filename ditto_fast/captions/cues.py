"""Caption cues from a timed-text file (SRT, WebVTT, SCC, TTML/DFXP), checked before any work: a malformed file is
refused naming its line, a cue past the audio's end is refused, and so is text EIA-608 cannot show
(captions/charset.py). Reading is pycaption's; the line-by-line syntax check before it is ours, since pycaption
names no line."""

from __future__ import annotations

import re
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.core.files import shown

TIMED_TEXT = {".srt": "srt", ".vtt": "vtt", ".scc": "scc", ".ttml": "ttml", ".dfxp": "ttml", ".xml": "ttml"}
ROWS, COLUMNS = 2, 32           # what one 608 pop-on caption shows here: 2 rows of 32 characters
_SRT_TIME = r"\d{1,2}:\d{2}:\d{2}[,.]\d{3}"
_VTT_TIME = r"(?:\d{1,2}:)?\d{2}:\d{2}\.\d{3}"
_SCC_LINE = re.compile(r"^\d{2}:\d{2}:\d{2}[:;.]\d{2}\t[0-9a-fA-F]{4}( [0-9a-fA-F]{4})*\s*$")


@dataclass(frozen=True)
class Cue:
    """One caption: shown from `start` to `end` (seconds), its rows of text (at most ROWS of COLUMNS characters)."""

    start: float
    end: float
    rows: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.rows)


def timed_text_kind(path: Path) -> str:
    """srt, vtt, scc or ttml, by the file's extension; UsageError naming the kinds otherwise."""
    kind = TIMED_TEXT.get(Path(path).suffix.lower())
    if kind is None:
        raise UsageError(f"{path}: not a timed-text file this reads; give .srt, .vtt, .scc or .ttml/.dfxp")
    return kind


def read_cues(path: str | Path, audio_seconds: float, notes: list[str] | None = None) -> list[Cue]:
    """The cues of a timed-text file, checked: ordered, none past `audio_seconds`, each wrapped into at most ROWS rows
    of COLUMNS characters of EIA-608's set. UsageError (exit 2) naming the file, its line or cue, and the fix. A cue
    cut short because the next one starts before it ends (608 shows one caption at a time) is said in `notes`."""
    from ditto_fast.captions.charset import check_608

    path = Path(path)
    kind = timed_text_kind(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: captions file not found; give an existing .srt/.vtt/.scc/.ttml file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot be read as UTF-8 text ({e}); save it as UTF-8") from None
    _check_syntax(path, kind, text)
    cues = _parse(path, kind, text, notes if notes is not None else [])
    if not cues:
        raise UsageError(f"{path}: holds no captions; give a file with at least one cue, or leave --captions out")
    out = []
    for n, cue in enumerate(cues, 1):
        if cue.end > audio_seconds + 1e-3:
            raise UsageError(f"{path}: cue {n} ({shown(cue.text[:40])}) ends at {cue.end:.3f} s, past the audio's end "
                             f"({audio_seconds:.3f} s); shorten or remove it")
        out.append(Cue(cue.start, cue.end, tuple(check_608(r, f"{path}: cue {n}") for r in cue.rows)))
    return out


def wrap_rows(text: str, where: str, columns: int = COLUMNS, rows: int = ROWS) -> tuple[str, ...]:
    """`text` (its own line breaks kept where they fit) as at most `rows` rows of `columns` characters, broken at
    spaces; UsageError naming `where` when it does not fit."""
    words = " ".join(text.split()).split(" ") if text.strip() else []
    given = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]
    if len(given) <= rows and all(len(ln) <= columns for ln in given):
        return tuple(given)
    out: list[str] = []
    for word in words:
        if out and len(out[-1]) + 1 + len(word) <= columns:
            out[-1] += " " + word
        else:
            out.append(word)
    if len(out) > rows or any(len(r) > columns for r in out):
        raise UsageError(f"{where}: {shown(text[:60])} does not fit {rows} rows of {columns} characters (EIA-608); "
                         "split the cue")
    return tuple(out)


def _check_syntax(path: Path, kind: str, text: str) -> None:
    """UsageError naming the first line that is not what its format allows."""
    lines = text.splitlines()

    def bad(n: int, what: str) -> None:
        raise UsageError(f"{path}: line {n}: {what}; fix that line")

    if kind == "srt":
        arrow = re.compile(rf"^\s*{_SRT_TIME}\s*-->\s*{_SRT_TIME}(\s.*)?$")
        expect = "number"
        for n, ln in enumerate(lines, 1):
            s = ln.strip()
            if expect == "number":
                if not s:
                    continue
                if not s.isdigit():
                    bad(n, f"expected a cue number, got {shown(s[:40])}")
                expect = "time"
            elif expect == "time":
                if not arrow.match(s):
                    bad(n, f"expected a time line like 00:00:01,000 --> 00:00:02,500, got {shown(s[:40])}")
                expect = "text"
            elif not s:
                expect = "number"
        if expect == "time":
            bad(len(lines), "the file ends where a time line should be")
    elif kind == "vtt":
        if not lines or not lines[0].startswith("WEBVTT"):
            bad(1, "a WebVTT file starts with WEBVTT")
        arrow = re.compile(rf"^{_VTT_TIME}\s+-->\s+{_VTT_TIME}(\s.*)?$")
        for n, ln in enumerate(lines, 1):
            if ("-->" in ln or re.match(rf"^{_VTT_TIME}\s", ln.strip())) and not arrow.match(ln.strip()):
                bad(n, f"expected a time line like 00:00:01.000 --> 00:00:02.500, got {shown(ln.strip()[:40])}")
    elif kind == "scc":
        if not lines or lines[0].strip() != "Scenarist_SCC V1.0":
            bad(1, "an SCC file starts with Scenarist_SCC V1.0")
        for n, ln in enumerate(lines[1:], 2):
            if ln.strip() and not _SCC_LINE.match(ln):
                bad(n, f"expected HH:MM:SS:FF, a tab and 4-digit hex words, got {shown(ln.strip()[:40])}")
    else:
        try:
            ET.fromstring(text.encode("utf-8"))
        except ET.ParseError as e:
            bad(e.position[0], f"not well-formed XML ({str(e).split(':')[0]})")


def pycaption():
    """The pycaption module (timed text read and written); UsageError naming the extra that installs it."""
    try:
        import pycaption as module
    except ImportError:
        raise UsageError("timed text needs pycaption: pip install 'ditto-fast[captions]'") from None
    return module


def _parse(path: Path, kind: str, text: str, notes: list[str]) -> list[Cue]:
    """The file's cues as pycaption reads them, in time order, each wrapped for 608; an overlap cut short is noted."""
    pc = pycaption()
    DFXPReader, SCCReader, SRTReader, WebVTTReader = pc.DFXPReader, pc.SCCReader, pc.SRTReader, pc.WebVTTReader
    CaptionReadError = pc.exceptions.CaptionReadError

    reader = {"srt": SRTReader, "vtt": WebVTTReader, "scc": SCCReader, "ttml": DFXPReader}[kind]()
    try:
        with warnings.catch_warnings():     # TTML is checked as XML above; pycaption reads it with BeautifulSoup's
            warnings.filterwarnings("ignore", message=".*HTML parser to parse an XML document")   # forgiving parser
            captions = reader.read(text)
    except (CaptionReadError, ValueError, KeyError, IndexError) as e:
        raise UsageError(f"{path}: cannot be read as {kind.upper()} ({str(e)[:120] or type(e).__name__}); "
                         "fix the file") from None
    langs = captions.get_languages()
    if not langs:
        return []
    cues = []
    for n, c in enumerate(captions.get_captions(langs[0]), 1):
        start, end = c.start / 1e6, c.end / 1e6
        if end <= start:
            raise UsageError(f"{path}: cue {n} ends ({end:.3f} s) before it starts ({start:.3f} s); fix its times")
        body = c.get_text()
        if body.strip():
            cues.append(Cue(start, end, wrap_rows(body, f"{path}: cue {n}")))
    cues.sort(key=lambda c: c.start)
    for n, (a, b) in enumerate(zip(cues, cues[1:]), 1):
        if b.start < a.end - 1e-3:          # one caption at a time on air: an overlap ends the earlier one
            cues[n - 1] = Cue(a.start, b.start, a.rows)
            notes.append(f"{path}: cue {n} ({shown(a.text[:40])}) overlaps cue {n + 1}: shown until {b.start:.3f} s, "
                         f"not {a.end:.3f} s (608 shows one caption at a time); end it before the next starts")
    return cues
