"""Captions without a render: timed text read and checked (a malformed file names its line, a cue past the audio is
refused, text outside EIA-608 mapped or refused), 608 paced one pair a frame with each caption flipped on its cue's
frame, the A/53 SEI built right, CTC alignment exact on emissions built for a known path, script words grouped into
whole, ordered 2x32 cues; and 608 embedded into small MP4/MKV (A/53), MXF (436M ANC) and MOV (c608) files decoded
back by ffmpeg's cc_dec, and by MediaInfo, at the cues' frames."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import warnings
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.captions.align import TimedWord, align_logp, align_words, viterbi_path
from ditto_fast.captions.charset import check_608
from ditto_fast.captions.cues import Cue, read_cues
from ditto_fast.captions.eia608 import PAD, cue_frame, load_pairs, odd_parity, pace
from ditto_fast.captions import embed as embed_module
from ditto_fast.captions.embed import embed, insert_cc_sei, sei_nal
from ditto_fast.captions.grouping import MIN_SECONDS, group_words
from ditto_fast.captions.sidecars import caption_text
from ditto_fast.checkpoints.random_hubert import CTC_VOCAB
from ditto_fast.core.errors import UsageError
from ditto_fast.delivery.caption_readback import read_captions

FF = imageio_ffmpeg.get_ffmpeg_exe()
NTSC = Fraction(30000, 1001)
SRT = ("1\n00:00:01,500 --> 00:00:03,000\nGood evening, this is café\nthe late news\n\n"
       "2\n00:00:03,000 --> 00:00:04,200\nThe bridge closes Monday.\n\n"
       "3\n00:00:05,000 --> 00:00:05,800\nBack to you.\n")
VOCAB = {s: i for i, s in enumerate(CTC_VOCAB)}


def _srt(tmp_path: Path, text: str = SRT, name: str = "c.srt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ timed text in
def test_the_four_formats_read_to_the_same_cues(tmp_path):
    cues = read_cues(_srt(tmp_path), 6.0)
    assert [c.rows for c in cues] == [("Good evening, this is café", "the late news"),
                                      ("The bridge closes Monday.",), ("Back to you.",)]
    assert [(c.start, c.end) for c in cues] == [(1.5, 3.0), (3.0, 4.2), (5.0, 5.8)]
    for kind in ("vtt", "ttml", "scc"):
        other = tmp_path / f"c.{kind}"
        other.write_text(caption_text(cues, kind))
        again = read_cues(other, 6.0)
        assert [c.text for c in again] == [c.text for c in cues], kind
        # SCC is timed in 29.97 frames: on the cue's frame
        tolerance = 0.5 / 29.97 if kind == "scc" else 1e-3
        assert all(abs(a.start - b.start) <= tolerance for a, b in zip(again, cues)), kind


@pytest.mark.parametrize("name, text, line", [
    ("c.srt", "1\n00:00:01,000 --> 00:00:02,000\nHello\n\n2\n00:00:02,5 --> 00:00:03,000\nBye\n", 6),
    ("c.srt", "1\n00:00:01,000 --> 00:00:02,000\nHello\n\nX\n", 5),
    ("c.vtt", "WEBVTT\n\n00:01.000 --> 00:02.000\nHello\n\n00:02.000 -> 00:03.000\nBye\n", 6),
    ("c.vtt", "Hello\n", 1),
    ("c.scc", "Scenarist_SCC V1.0\n\n00:00:01:00\t9420 9420 zz20\n", 3),
    ("c.ttml", '<tt xmlns="http://www.w3.org/ns/ttml">\n<body>\n<div><p begin="1s" end="2s">Hi</div>\n</body></tt>\n', 3),
])
def test_a_malformed_file_is_refused_naming_its_line(tmp_path, name, text, line):
    with pytest.raises(UsageError, match=rf"{name}: line {line}:") as e:
        read_cues(_srt(tmp_path, text, name), 10.0)
    assert e.value.exit_code == 2


def test_a_cue_past_the_audio_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"cue 3 .* ends at 5\.800 s, past the audio's end \(5\.500 s\)"):
        read_cues(_srt(tmp_path), 5.5)


def test_text_608_lacks_is_mapped_or_refused(tmp_path):
    assert check_608("Łódź — “quoted” café ñ", "here") == "Lódz — “quoted” café ñ"        # ó is 608's own; Ł, ź are not
    with pytest.raises(UsageError, match=r"cue 1: character '字' \(U\+5B57\) has no EIA-608 equivalent"):
        read_cues(_srt(tmp_path, "1\n00:00:01,000 --> 00:00:02,000\nHello 字\n"), 5.0)


def test_a_cue_too_long_for_two_rows_is_refused(tmp_path):
    with pytest.raises(UsageError, match="does not fit 2 rows of 32 characters"):
        read_cues(_srt(tmp_path, "1\n00:00:01,000 --> 00:00:02,000\n" + "word " * 20 + "\n"), 5.0)


# ------------------------------------------------------------------ 608 pacing and SEI
def test_pacing_sends_one_pair_a_frame_and_flips_each_caption_on_its_frame(tmp_path):
    cues = read_cues(_srt(tmp_path), 6.0)
    paced = pace(cues, NTSC, 200)
    assert len(paced.pairs) == 200
    assert all(bin(b).count("1") % 2 == 1 for pair in paced.pairs for b in pair)      # odd parity, every byte
    assert paced.shown == [cue_frame(c.start, NTSC) for c in cues] == [45, 90, 150]
    eoc = (odd_parity(0x14), odd_parity(0x2F))
    assert [f for f, p in enumerate(paced.pairs) if p == eoc] == [45, 46, 90, 91, 150, 151]
    # cue 1 is replaced by cue 2's flip (no erase), cue 2 and 3 are erased on their ends' frames
    assert paced.cleared == [None, cue_frame(4.2, NTSC), cue_frame(5.8, NTSC)]
    loaded = [p for p in paced.pairs[:45] if p != PAD]
    assert loaded == load_pairs(cues[0].rows)                      # all of cue 1 loaded before its frame


def test_a_cue_too_soon_after_the_one_before_is_shown_as_soon_as_it_is_loaded():
    """One pair a frame: a two-row caption takes some 25 frames to load after the one before flips."""
    cues = [Cue(1.0, 1.5, ("First",)), Cue(1.5, 3.0, ("The bridge closes,", "starting Monday."))]
    paced = pace(cues, Fraction(25), 100)
    need = 2 + len(load_pairs(cues[1].rows))                      # the flip before, then the load
    assert paced.shown == [25, 25 + need] and need > cue_frame(1.5, Fraction(25)) - 25


def test_a_cue_that_cannot_be_loaded_before_the_clip_ends_is_refused():
    with pytest.raises(UsageError, match="news.srt: cue 1 .* starts too near the clip's end for 608 to load"):
        pace([Cue(0.1, 0.3, ("A caption far too long to load",))], NTSC, 12, where="news.srt")


def test_cues_denser_than_608_carries_are_refused_as_such():
    """Each cue shown later than its time, the lateness growing, until the last cannot be shown before the end: the
    refusal says the cues are too dense (it was "cue 7 cannot be loaded"), naming the file and the cues."""
    cues = [Cue(0.5 + 0.4 * i, 0.9 + 0.4 * i, (f"Caption number {i} of a fast", "run of captions here")) for i in range(7)]
    with pytest.raises(UsageError) as caught:
        pace(cues, Fraction(25), 100, where="news.srt")
    line = str(caught.value)
    assert line.startswith("news.srt: cues 1 to 4 come faster than EIA-608 carries them") and "cue 4 (" in line, line
    assert "merge or shorten those cues" in line


def test_an_overlap_cut_short_is_said(tmp_path):
    notes: list[str] = []
    cues = read_cues(_srt(tmp_path, "1\n00:00:01,000 --> 00:00:03,000\nFirst\n\n2\n00:00:02,000 --> 00:00:04,000\n"
                                     "Second\n"), 5.0, notes)
    assert [(c.start, c.end) for c in cues] == [(1.0, 2.0), (2.0, 4.0)]
    assert notes == [f"{tmp_path / 'c.srt'}: cue 1 ('First') overlaps cue 2: shown until 2.000 s, not 3.000 s "
                     "(608 shows one caption at a time); end it before the next starts"]


def test_a_ttml_file_reads_without_a_word(tmp_path):
    """pycaption reads TTML with BeautifulSoup's HTML parser, which warned a page about lxml for every file that
    starts as XML does: nothing is printed now (the file is checked as XML before)."""
    ttml = tmp_path / "c.ttml"
    ttml.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<tt xmlns="http://www.w3.org/ns/ttml" xml:lang="en">'
                    '<body><div><p begin="00:00:00.500" end="00:00:01.500">Good evening.</p></div></body></tt>\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")                # what a command shows (pycaption's deprecations are not)
        cues = read_cues(ttml, 5.0)
    shown = [str(w.message)[:60] for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert [c.text for c in cues] == ["Good evening."] and shown == []


def test_the_sei_carries_a53_cc_data_for_its_frame():
    nal = sei_nal((0x94, 0x20), "h264")
    assert nal[:5] == b"\x00\x00\x00\x01\x06" and nal[5] == 4            # SEI, user data registered (T.35)
    assert b"\xb5\x00\x31GA94\x03" in nal and b"\xfc\x94\x20\xfd\x80\x80" in nal
    assert b"\x00\x00\x00" not in sei_nal((0x80, 0x80), "h264")[4:]
    es = b"".join(b"\x00\x00\x00\x01\x09\xf0" + b"\x00\x00\x01\x65\x88\x84" for _ in range(3))     # AUD + IDR x3
    out = insert_cc_sei(es, [(0x94, 0x20), PAD, PAD], "h264")
    assert out.count(b"GA94") == 3 and out.index(b"GA94") < out.index(b"\x65\x88")
    with pytest.raises(ValueError, match="3 access units, the captions 2 frames"):
        insert_cc_sei(es, [PAD, PAD], "h264")



def test_emulation_prevention_escapes_the_start_code_patterns_and_nothing_else(monkeypatch):
    """Inside a NAL unit 00 00 may not be followed by 00, 01, 02 or 03 (H.264 7.4.1, HEVC 7.4.2): an 03 goes
    between, and a decoder drops it again. The SEI's body goes through it (today's cc_data holds no 00 00)."""
    rbsp = bytes.fromhex("04" "000001" "000004" "000003" "0000000002" "80")
    escaped = bytes.fromhex("04" "00000301" "000004" "00000303" "00000300000302" "80")
    assert embed_module._emulation_prevented(rbsp) == escaped
    assert [i for i in range(2, len(escaped)) if escaped[i - 2:i + 1] == b"\x00\x00\x03"] == [3, 10, 14, 17]
    assert re.sub(b"\x00\x00\x03", b"\x00\x00", escaped) == rbsp                     # what a decoder reads back
    assert embed_module._emulation_prevented(bytes.fromhex("0400fc94200000fd80")) == bytes.fromhex("0400fc94200000fd80")
    monkeypatch.setattr(embed_module, "cc_data", lambda pair: bytes([0xB5, *pair, 0x01]))
    assert sei_nal((0x00, 0x00), "h264") == bytes.fromhex("0000000106" "0404" "b5000003" "01" "80")
    assert sei_nal((0x00, 0x00), "hevc") == bytes.fromhex("000000014e01" "0404" "b5000003" "01" "80")

# ------------------------------------------------------------------ CTC alignment and grouping
def _emissions(words: list[str], gap: int = 6, hold: int = 3, lead: int = 5):
    """Log-probabilities [T, 32] of a known path: blanks, each letter held `hold` frames (a blank between a doubled
    letter's two), `gap` blank frames between words; and each word's true (start, end) in seconds."""
    frames, truth = [0] * lead, []
    for w in words:
        start = len(frames)
        for i, ch in enumerate(w.upper()):
            if i and w.upper()[i - 1] == ch:
                frames.append(0)
            frames += [VOCAB[ch]] * hold
        truth.append((start * 0.02, len(frames) * 0.02))
        frames += [0] * gap
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 0.5, (len(frames), len(VOCAB)))
    logits[np.arange(len(frames)), frames] += 6.0                       # the path's symbol clearly ahead
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return logp, truth


def test_ctc_alignment_recovers_a_known_path_exactly():
    words = ["Hello", "all", "Cool", "evening's", "news"]               # doubled letters, an apostrophe
    logp, truth = _emissions(words)
    timed = align_logp(logp, words, VOCAB)
    assert [w.text for w in timed] == words
    assert [(round(w.start, 3), round(w.end, 3)) for w in timed] == [(round(a, 3), round(b, 3)) for a, b in truth]


def test_a_word_without_letters_takes_the_time_between_its_neighbours():
    logp, truth = _emissions(["one", "two"], gap=20)
    timed = align_logp(logp, ["one", "42", "two"], VOCAB)
    assert timed[1].start == pytest.approx(truth[0][1]) and timed[1].end == pytest.approx(truth[1][0])


def test_viterbi_refuses_more_symbols_than_frames():
    with pytest.raises(ValueError, match="need 5 frames, the speech has 3"):
        viterbi_path(np.zeros((3, 32)), [5, 5, 6, 7], 0)


def test_words_group_into_whole_ordered_readable_cues():
    text = ("Good evening. Tonight, the council voted to close the old bridge on Main Street for repairs, "
            "starting Monday. Drivers should use the ferry.").split()
    words = [TimedWord(w, 0.4 + 0.35 * i, 0.4 + 0.35 * i + 0.3) for i, w in enumerate(text)]
    cues = group_words(words, 12.0)
    assert " ".join(c.text for c in cues).split() == text                # every word once, in order
    assert all(len(c.rows) <= 2 and all(len(r) <= 32 for r in c.rows) for c in cues)
    assert cues[0].text == "Good evening."                               # a sentence closes a cue
    assert all(a.end <= b.start + 1e-9 and a.start < b.start for a, b in zip(cues, cues[1:]))
    assert all(0 <= c.start < c.end <= 12.0 for c in cues)
    assert all(c.end - c.start >= MIN_SECONDS - 1e-9 for c in cues[:-1])
    paced = pace(cues, Fraction(25), 300)                                # 608 can show each on its frame
    assert paced.shown == [cue_frame(c.start, Fraction(25)) for c in cues]


def test_a_script_the_speech_cannot_hold_is_refused():
    words = [TimedWord(f"word{i}.", 0.01 * i, 0.01 * i + 0.01) for i in range(30)]
    with pytest.raises(UsageError, match="s.txt: the script makes 30 captions, more than 1.00 s of speech can show"):
        group_words(words, 1.0, where="s.txt")


def _script_plan(tmp_path: Path, text: str, audio_seconds: float):
    from types import SimpleNamespace

    from ditto_fast.captions.plan import plan_captions

    script = tmp_path / "news.txt"
    script.write_text(text)
    request = SimpleNamespace(captions=None, script=script, captions_out=None, burn_in=False, output=None)
    return plan_captions(request, None, SimpleNamespace(container="mp4", codec="h264"), Fraction(25),
                         int(audio_seconds * 25), audio_seconds)


def test_a_script_longer_than_the_speech_is_refused_naming_it_before_hubert(tmp_path):
    """Found when the request is checked (no HuBERT, no alignment): more letters than 20 ms frames, or more
    captions than 608 can show however the words fall; the line names the script."""
    assert _script_plan(tmp_path, "Good evening. Here is the news.", 3.0).words[0] == "Good"
    with pytest.raises(UsageError, match=r"news.txt: the script is longer than the speech \(\d+ letters need"):
        _script_plan(tmp_path, "Good evening and welcome to the late news " * 10, 3.0)
    with pytest.raises(UsageError, match="news.txt: the script makes .* captions, more than 3.00 s of speech"):
        _script_plan(tmp_path, "Go. Up. On. So. " * 5, 3.0)
    with pytest.raises(UsageError, match="news.txt: the script has no letters to align"):
        _script_plan(tmp_path, "1 2 3 42", 3.0)


def test_the_head_letters_are_the_published_vocabulary_s():
    from ditto_fast.captions.align import HEAD_LETTERS
    from ditto_fast.checkpoints.random_hubert import CTC_VOCAB

    assert set(HEAD_LETTERS) == {s for s in CTC_VOCAB if len(s) == 1 and s != "|"}


def test_an_alignment_refusal_names_the_script():
    with pytest.raises(UsageError, match=r"news.txt: the script is longer than the speech"):
        align_logp(np.zeros((3, len(VOCAB))), ["Goodbye"], VOCAB, where="news.txt")


# ------------------------------------------------------------------ embedded and decoded back
def _encode(path: Path, video: list[str], fmt: str, frames: int, rate: str = "30000/1001") -> None:
    audio = ["-c:a", "pcm_s24le"] if fmt in ("mxf", "mov") else ["-c:a", "aac"]
    subprocess.run([FF, "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    f"testsrc=s=320x240:r={rate}", "-f", "lavfi", "-i", "sine=r=48000", "-frames:v", str(frames),
                    "-t", str(frames / float(Fraction(rate))), *video, *audio, "-f", fmt, str(path)], check=True)


CARRIERS = {
    "mp4": (["-c:v", "libx264", "-bf", "0", "-pix_fmt", "yuv420p"], "mp4", "h264", "A/53 in the video"),
    "mkv": (["-c:v", "libx265", "-bf", "0", "-x265-params", "log-level=error"], "matroska", "hevc",
            "A/53 in the video"),
    "mxf": (["-c:v", "mpeg2video", "-b:v", "20M", "-pix_fmt", "yuv422p"], "mxf", "mpeg2video", "SMPTE 436M ANC"),
    "mov": (["-c:v", "prores_aw"], "mov", "prores", "c608 track"),
}


@pytest.mark.parametrize("ext", list(CARRIERS))
def test_embedded_608_decodes_to_the_cues_at_their_frames(tmp_path, ext):
    video, container, codec, carrier = CARRIERS[ext]
    cues = read_cues(_srt(tmp_path), 6.5)
    out = tmp_path / f"a.{ext}"
    _encode(out, video, container, 200)
    embed(out, pace(cues, NTSC, 200), NTSC, container, codec, ["-f", container])
    track = read_captions(out)
    assert track is not None and track.carrier == carrier and track.channel == "CC1"
    got = [(cue_frame(c.start, NTSC), c.text) for c in track.captions]
    assert got == [(cue_frame(c.start, NTSC), c.text) for c in cues]
    assert [cue_frame(c.end, NTSC) for c in track.captions][1:] == [cue_frame(4.2, NTSC), cue_frame(5.8, NTSC)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]        # no temporaries left


def test_a_file_without_captions_reads_as_none(tmp_path):
    out = tmp_path / "a.mp4"
    _encode(out, CARRIERS["mp4"][0], "mp4", 10)
    assert read_captions(out) is None



def test_the_qc_of_a_profile_that_requires_captions_finds_them_or_fails(tmp_path, run_cli):
    """QC against web-h264 with `captions: required`: its captions line is met by the embedded 608 (where carried,
    how many cues, first and last time) and failed by the same picture without them."""
    profile = tmp_path / "captioned-web.yaml"
    text = (Path(__file__).parents[1] / "ditto_fast/configs/delivery/web-h264.yaml").read_text()
    profile.write_text(text.replace("mode: embedded", "mode: required"))
    cues = read_cues(_srt(tmp_path), 6.5)
    captioned, bare = tmp_path / "captioned.mp4", tmp_path / "bare.mp4"
    _encode(captioned, CARRIERS["mp4"][0], "mp4", 200)
    _encode(bare, CARRIERS["mp4"][0], "mp4", 10)
    embed(captioned, pace(cues, NTSC, 200), NTSC, "mp4", "h264", ["-f", "mp4"])
    lines = {}
    for out in (captioned, bare):
        res = run_cli(["qc", out, "--delivery", profile, "--json"])
        lines[out] = next(r for r in json.loads(res.stdout)["requirements"] if r["name"] == "captions")
    first, last = (float(cue_frame(t, NTSC) / NTSC) for t in (cues[0].start, cues[-1].end))
    assert lines[captioned]["ok"] and lines[captioned]["expected"] == "EIA-608 captions"
    assert lines[captioned]["measured"] == f"EIA-608 CC1 in A/53 in the video: 3 cues, {first:.3f}-{last:.3f} s"
    assert res.returncode == 8 and not lines[bare]["ok"] and lines[bare]["measured"] == "none"

@pytest.mark.skipif(shutil.which("mediainfo") is None, reason="MediaInfo is not installed (apt-get install mediainfo)")
def test_mediainfo_reads_the_mxf_caption_track(tmp_path):
    """MediaInfo (another reader than the writer's ffmpeg) finds the 608 service in the ANC track, spanning the file,
    with each pop-on caption and its rows (its start times vary with the file's timecode: cc_dec checks the frames)."""
    cues = read_cues(_srt(tmp_path), 6.5)
    out = tmp_path / "a.mxf"
    _encode(out, CARRIERS["mxf"][0], "mxf", 200)
    embed(out, pace(cues, NTSC, 200), NTSC, "mxf", "mpeg2video", ["-f", "mxf"])
    text = subprocess.run(["mediainfo", str(out)], capture_output=True, text=True, check=True).stdout
    section = next(b for b in text.split("\n\n") if b.startswith("Text"))
    info = {k.strip(): v.strip() for k, _, v in (ln.partition(" : ") for ln in section.splitlines()[1:])}
    assert info["ID"].endswith("CC1") and info["Format"] == "EIA-608"
    assert info["Muxing mode"] == "Ancillary data / CDP"
    assert info["Duration"] == "6 s 673 ms"                              # the 200 frames: a pair in every one
    assert (info["Count of events"], info["Count of PopOn events"]) == ("3", "3")
    assert (info["Count of lines"], info["Maximum count of lines per event"]) == ("4", "2")


def test_a_job_line_takes_captions_and_a_script_beside_it(tmp_path):
    from ditto_fast.engine.request import JOB_KEYS, RenderRequest

    assert {"captions", "script", "captions_out", "burn_in"} <= set(JOB_KEYS)
    line = {"avatar": "ruby", "audio": "a.wav", "output": "a.mp4", "captions": "a.srt", "captions_out": "SRT,vtt",
            "burn_in": True}
    request = RenderRequest.from_json(line, tmp_path, "jobs.jsonl:1")
    assert request.captions == tmp_path / "a.srt" and request.captions_out == "srt,vtt" and request.burn_in
    assert RenderRequest.from_json({**line, "captions": None, "script": "a.txt"}, tmp_path, "x").script == \
        tmp_path / "a.txt"
    with pytest.raises(UsageError, match=r"jobs.jsonl:2: captions_out must be one or more of scc,vtt,srt,ttml"):
        RenderRequest.from_json({**line, "captions_out": "srt,pdf"}, tmp_path, "jobs.jsonl:2")
    with pytest.raises(UsageError, match="burn_in must be true or false"):
        RenderRequest.from_json({**line, "burn_in": "yes"}, tmp_path, "jobs.jsonl:3")


def test_the_character_head_rides_on_the_feature_windows(tiny_hubert_dir, tmp_path):
    """--script's log-probabilities come from the same pass as the features (which they leave unchanged): two 50 Hz
    frames per feature row, a distribution over init-random's 32-symbol vocab.json each; a HuBERT without the head
    is refused naming its folder."""
    import json

    from ditto_fast.audio.hubert import HubertFeatures
    from ditto_fast.core.errors import CheckpointError

    vocab = json.loads((tiny_hubert_dir / "vocab.json").read_text())
    assert len(vocab) == 32 == json.loads((tiny_hubert_dir / "config.json").read_text())["vocab_size"]
    assert vocab["<pad>"] == 0 and vocab["|"] == 4
    hf = HubertFeatures(tiny_hubert_dir)
    audio = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    plain = hf.features(audio)
    feats, logp = hf.features(audio, ctc=True)
    np.testing.assert_array_equal(feats, plain)
    assert logp.shape == (2 * len(feats), 32)
    np.testing.assert_allclose(np.exp(logp).sum(1), 1.0, rtol=1e-5)
    words = align_words(logp, ("good", "evening"), tiny_hubert_dir)
    assert [w.text for w in words] == ["good", "evening"] and 0 <= words[0].start <= words[1].start <= 1.0
    bare = tmp_path / "bare"
    shutil.copytree(tiny_hubert_dir, bare)
    from safetensors.torch import load_file, save_file

    state = {k: v for k, v in load_file(bare / "model.safetensors").items() if not k.startswith("lm_head")}
    save_file(state, str(bare / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"bare: this HuBERT has no character head"):
        HubertFeatures(bare).features(audio, ctc=True)
