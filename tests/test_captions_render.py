"""Captions end to end (tiny checkpoints): a captioned XDCAM 1080i59.94 MXF, a web H.264 MP4 and a ProRes MOV decoded
by ffmpeg's 608 decoder into the cues at their frames, their QC's captions line, MediaInfo's 608 track; sidecars and
burn-in; --script timed from the speech into whole, ordered 2x32 cues; bad timed text and a profile that requires
captions refused with one line and exit 2 before any work."""

from __future__ import annotations

import json
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from conftest import store_env
from ditto_fast.captions.cues import read_cues
from ditto_fast.captions.eia608 import cue_frame
from ditto_fast.core.errors import UsageError
from ditto_fast.delivery.caption_readback import read_captions
from ditto_fast.engine.request import RenderRequest

FF = imageio_ffmpeg.get_ffmpeg_exe()
SRT = ("1\n00:00:01,000 --> 00:00:02,200\nGOOD EVENING FROM DITTO\n\n"
       "2\n00:00:02,200 --> 00:00:02,900\nThe bridge closes,\nstarting Monday.\n")
SCRIPT = "Good evening. The council voted tonight to close the old bridge."


@pytest.fixture(scope="module")
def three_seconds(tmp_path_factory, speech_wav) -> Path:
    speech, sr = sf.read(speech_wav, dtype="float32")
    path = tmp_path_factory.mktemp("speech") / "news.wav"
    sf.write(path, speech[sr:4 * sr], sr)
    return path


@pytest.fixture(scope="module")
def captions_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("captions") / "news.srt"
    path.write_text(SRT)
    return path


@pytest.fixture(scope="module")
def captioned(engine, video_avatar, three_seconds, captions_file, tmp_path_factory):
    """render(name, **request fields) -> (output, timings), each made once per module."""
    out_dir = tmp_path_factory.mktemp("captioned")
    made: dict = {}

    def render(name: str, **fields):
        if name not in made:
            result = engine.render(RenderRequest(avatar="anchor", audio=three_seconds, output=out_dir / name, steps=2,
                                                 captions=captions_file, **fields))
            made[name] = (out_dir / name, result.timings)
        return made[name]

    return render


DELIVERABLES = {"news.mxf": ({"delivery": "xdcam-hd422-1080i5994"}, "SMPTE 436M ANC"),
                "web.mp4": ({"delivery": "web-h264", "captions_out": "scc,vtt,srt,ttml"}, "A/53 in the video"),
                "edit.mov": ({"codec": "prores", "fps": "29.97"}, "c608 track")}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DELIVERABLES))
def test_the_deliverable_carries_the_cues_on_their_frames(captioned, captions_file, name):
    fields, carrier = DELIVERABLES[name]
    out, timings = captioned(name, **fields)
    rate = Fraction(timings["rate"])
    if "delivery" in timings:
        rate = Fraction(timings["delivery"]["delivered_rate"])
        assert timings["delivery"]["qc"].endswith("ok") and "FAIL" not in timings["delivery"]["qc"]
        line = next(r for r in timings["delivery"]["requirements"] if r["name"] == "captions")
        assert line["ok"] and line["measured"].startswith(f"EIA-608 CC1 in {carrier}: 2 cues")
    cues = read_cues(captions_file, 3.0)
    track = read_captions(out)
    assert track is not None and track.carrier == carrier
    assert [(cue_frame(c.start, rate), c.text) for c in track.captions] == \
        [(cue_frame(c.start, rate), c.text) for c in cues]
    assert timings["captions"]["shown_late"] == [] and timings["captions"]["cues"] == 2
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]       # no temporaries left


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mediainfo") is None, reason="MediaInfo is not installed (apt-get install mediainfo)")
def test_mediainfo_finds_the_608_track_of_the_xdcam_mxf(captioned):
    out, _ = captioned("news.mxf", **DELIVERABLES["news.mxf"][0])
    text = subprocess.run(["mediainfo", str(out)], capture_output=True, text=True, check=True).stdout
    section = next(b for b in text.split("\n\n") if b.startswith("Text"))
    info = {k.strip(): v.strip() for k, _, v in (ln.partition(" : ") for ln in section.splitlines()[1:])}
    assert (info["Format"], info["Muxing mode"], info["Count of events"]) == ("EIA-608", "Ancillary data / CDP", "2")
    assert info["Frame rate"].startswith("29.970")


@pytest.mark.slow
def test_sidecars_beside_the_output_hold_the_cues(captioned, captions_file):
    out, timings = captioned("web.mp4", **DELIVERABLES["web.mp4"][0])
    cues = read_cues(captions_file, 3.0)
    for kind in ("scc", "vtt", "srt", "ttml"):
        side = out.with_suffix(f".{kind}")
        assert str(side) in timings["captions"]["sidecars"]
        again = read_cues(side, 3.0)
        assert [c.text for c in again] == [c.text for c in cues], kind
        assert [cue_frame(c.start, Fraction(25)) for c in again] == [cue_frame(c.start, Fraction(25)) for c in cues]


def _frame(path: Path, seconds: float) -> np.ndarray:
    raw = subprocess.run([FF, "-v", "error", "-ss", f"{seconds}", "-i", str(path), "-frames:v", "1", "-f", "rawvideo",
                          "-pix_fmt", "gray", "-s", "480x270", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(270, 480).astype(np.float32)


@pytest.mark.slow
def test_burn_in_draws_the_captions_into_the_picture(captioned):
    plain, _ = captioned("plain.mp4")
    burned, timings = captioned("burned.mp4", burn_in=True)
    assert timings["captions"]["burn_in"]
    a, b = _frame(plain, 1.4), _frame(burned, 1.4)            # during cue 1
    bottom = np.abs(a[200:] - b[200:]).mean()
    top = np.abs(a[:150] - b[:150]).mean()
    assert bottom > 4 * max(top, 0.25), (bottom, top)
    assert np.abs(_frame(plain, 0.3) - _frame(burned, 0.3))[200:].mean() < bottom / 4     # before any cue


@pytest.mark.slow
def test_a_script_becomes_whole_ordered_cues(engine, video_avatar, speech_wav, tmp_path):
    script = tmp_path / "news.txt"
    script.write_text(SCRIPT + "\n")
    out = tmp_path / "script.mp4"
    result = engine.render(RenderRequest(avatar="anchor", audio=speech_wav, output=out, steps=2, script=script,
                                         captions_out="srt"))
    assert result.timings["captions"]["timed_by"] == "alignment"
    cues = read_cues(out.with_suffix(".srt"), result.timings["audio_seconds"])
    assert " ".join(c.text for c in cues).split() == SCRIPT.split()          # whole: every word once, in order
    assert all(len(c.rows) <= 2 and all(len(r) <= 32 for r in c.rows) for c in cues)
    assert all(a.end <= b.start + 1e-3 and a.start < b.start for a, b in zip(cues, cues[1:]))
    assert 0 <= cues[0].start and cues[-1].end <= result.timings["audio_seconds"] + 1e-3
    decoded = read_captions(out)
    assert [c.text for c in decoded.captions] == [c.text for c in cues]


def test_bad_timed_text_is_one_line_and_exit_2_before_any_work(run_cli, tmp_path, video_avatar, three_seconds,
                                                              tiny_checkpoints, session_home):
    bad = tmp_path / "bad.srt"
    bad.write_text("1\n00:00:01,000 --> 00:00:02,000\nHello\n\n2\n00:00:02,5 --> 00:00:03,000\nBye\n")
    out = tmp_path / "out.mp4"
    res = run_cli(["render", "--avatar", "anchor", "--audio", three_seconds, "-o", out, "--captions", bad,
                   "--quiet"], env=store_env(session_home, tiny_checkpoints))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{bad}: line 6: expected a time line" in res.stderr and not out.exists()
    late = tmp_path / "late.srt"
    late.write_text("1\n00:00:01,000 --> 00:00:09,000\nToo long\n")
    res = run_cli(["render", "--avatar", "anchor", "--audio", three_seconds, "-o", out, "--captions", late,
                   "--quiet"], env=store_env(session_home, tiny_checkpoints))
    assert res.returncode == 2 and "past the audio's end (3.000 s)" in res.stderr and not out.exists()
    ttml = tmp_path / "late.ttml"                 # an ordinary TTML file: with --quiet, its refusal is all there is
    ttml.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<tt xmlns="http://www.w3.org/ns/ttml" xml:lang="en">'
                    '<body><div><p begin="00:00:01.000" end="00:00:09.000">Too long</p></div></body></tt>\n')
    res = run_cli(["render", "--avatar", "anchor", "--audio", three_seconds, "-o", out, "--captions", ttml,
                   "--quiet"], env=store_env(session_home, tiny_checkpoints))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "past the audio's end" in res.stderr, res.stderr


def _captions_required(tmp_path: Path) -> Path:
    """The shipped web-h264 profile with `captions: required`."""
    profile = tmp_path / "captioned-web.yaml"
    text = (Path(__file__).parents[1] / "ditto_fast/configs/delivery/web-h264.yaml").read_text()
    profile.write_text(text.replace("mode: embedded", "mode: required"))
    return profile


def test_a_profile_that_requires_captions_refuses_a_render_without_them(tmp_path, engine, video_avatar, three_seconds):
    with pytest.raises(UsageError, match="requires captions; give --captions FILE or --script FILE"):
        engine.render(RenderRequest(avatar="anchor", audio=three_seconds, output=tmp_path / "x.mp4",
                                    delivery=str(_captions_required(tmp_path))))
    assert not list(tmp_path.glob("*.mp4"))


@pytest.mark.slow
def test_a_rendered_file_meets_a_profile_that_requires_captions(run_cli, tmp_path, captioned):
    """The QC of a profile that requires captions, on a render (test_captions.py checks it on a small file)."""
    profile = _captions_required(tmp_path)
    plain, _ = captioned("plain.mp4")
    res = run_cli(["qc", plain, "--delivery", profile, "--json"])
    line = next(r for r in json.loads(res.stdout)["requirements"] if r["name"] == "captions")
    assert line["ok"] and line["expected"] == "EIA-608 captions"
    assert line["measured"].startswith("EIA-608 CC1 in A/53 in the video: 2 cues, 1.000-")
    bare = tmp_path / "bare.mp4"
    subprocess.run([FF, "-v", "error", "-i", str(plain), "-map", "0", "-c:a", "copy", "-c:v", "libx264",
                    "-a53cc", "0", str(bare)], check=True)
    res = run_cli(["qc", bare, "--delivery", profile, "--json"])
    line = next(r for r in json.loads(res.stdout)["requirements"] if r["name"] == "captions")
    assert res.returncode != 0 and not line["ok"] and line["measured"] == "none"


@pytest.mark.slow
def test_a_caption_608_cannot_load_in_time_is_a_warning(engine, video_avatar, three_seconds, tmp_path):
    tight = tmp_path / "tight.srt"
    tight.write_text("1\n00:00:01,000 --> 00:00:01,200\nOne\n\n2\n00:00:01,200 --> 00:00:02,500\n"
                     "The bridge closes,\nstarting Monday.\n")
    out = tmp_path / "tight.mp4"
    result = engine.render(RenderRequest(avatar="anchor", audio=three_seconds, output=out, steps=2, captions=tight))
    late, = result.timings["captions"]["shown_late"]
    assert late["cue"] == 2 and late["shown_frame"] > late["cue_frame"] == 30
    assert result.warnings == (f"{out}: caption 2 goes on air at frame {late['shown_frame']}, not 30: 608 loads one "
                               "byte pair a frame; start it later or the one before earlier",)
    decoded = read_captions(out).captions
    assert cue_frame(decoded[1].start, Fraction(25)) == late["shown_frame"]        # as the reader sees it


def test_a_cue_608_cannot_show_before_the_end_is_refused_before_any_work(engine, video_avatar, three_seconds,
                                                                        tmp_path):
    late = tmp_path / "end.srt"
    late.write_text("1\n00:00:02,950 --> 00:00:03,000\nA last caption too long to load\n")
    with pytest.raises(UsageError, match=f"{late}: cue 1 .* starts too near the clip's end"):
        engine.render(RenderRequest(avatar="anchor", audio=three_seconds, output=tmp_path / "x.mp4",
                                    captions=late))
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*"))
