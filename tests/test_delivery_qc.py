"""`ditto-fast qc` on files it did not make: a truncated file is called truncated (the container's declared
duration against what the essence holds, packets cut short), each colour tag is checked against the profile,
and its messages say what they mean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import imageio_ffmpeg
import pytest

from ditto_fast.delivery.profiles import load_profile
from ditto_fast.delivery.qc import check_file, picture_tags

FF = imageio_ffmpeg.get_ffmpeg_exe()
BT709 = "setparams=colorspace=bt709:color_primaries=bt709:color_trc=bt709:range=tv"


def ffmpeg(*args) -> None:
    subprocess.run([FF, "-v", "error", "-y", *map(str, args)], check=True)


def lines(requirements) -> dict:
    return {r.name: r for r in requirements}


def dnxhd_mxf(out: Path, seconds: float = 0.6) -> Path:
    """DNxHD 120 1080i50 in MXF with four mono PCM tracks, as the dnxhd-1080i50 profile has it."""
    ffmpeg("-f", "lavfi", "-i", f"testsrc2=s=1920x1080:r=25:d={seconds}", "-f", "lavfi", "-i",
           f"sine=f=440:d={seconds}:sample_rate=48000", "-filter_complex",
           f"[0:v]{BT709},setfield=tff[v];[1:a]asplit=4[a1][a2][a3][a4]", "-map", "[v]",
           *[x for t in range(1, 5) for x in ("-map", f"[a{t}]")], "-c:v", "dnxhd", "-b:v", "120M",
           "-pix_fmt", "yuv422p", "-flags", "+ildct", "-c:a", "pcm_s24le", "-timecode", "10:00:00:00", out)
    return out


def xdcam_mxf(out: Path, seconds: float = 0.6, tags: str = BT709) -> Path:
    """MPEG-2 4:2:2 50 Mb/s long GOP 1080i50 in MXF with eight mono PCM tracks (XDCAM HD422's shape)."""
    ffmpeg("-f", "lavfi", "-i", f"testsrc2=s=1920x1080:r=25:d={seconds}", "-f", "lavfi", "-i",
           f"sine=f=440:d={seconds}:sample_rate=48000", "-filter_complex",
           f"[0:v]{tags},setfield=tff[v];[1:a]asplit=8[a1][a2][a3][a4][a5][a6][a7][a8]", "-map", "[v]",
           *[x for t in range(1, 9) for x in ("-map", f"[a{t}]")], "-c:v", "mpeg2video", "-profile:v", "0",
           "-level:v", "2", "-b:v", "50M", "-minrate", "50M", "-maxrate", "50M", "-bufsize", "17825792", "-g", "12",
           "-bf", "2", "-pix_fmt", "yuv422p", "-flags", "+ildct+ilme", "-c:a", "pcm_s24le",
           "-timecode", "10:00:00:00", out)
    return out


def cut(path: Path, percent: int) -> Path:
    """A copy of the file's first `percent` % of bytes (a transfer that stopped)."""
    data = path.read_bytes()
    out = path.with_name(f"{path.stem}-{percent}{path.suffix}")
    out.write_bytes(data[: len(data) * percent // 100])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("make, profile", [(dnxhd_mxf, "dnxhd-1080i50"), (xdcam_mxf, "xdcam-hd422-1080i50")])
def test_a_truncated_file_is_called_truncated(tmp_path, make, profile, run_cli):
    """Cut to 40, 75 and 95 % of its bytes, an MXF still declares its whole duration in its header: QC finds the
    essence shorter or a packet cut short and fails the file as truncated (exit 8); the whole file passes that
    line. MediaInfo, where installed, agrees (IsTruncated)."""
    whole = make(tmp_path / "whole.mxf")
    complete = lines(check_file(whole, load_profile(profile)))["complete"]
    assert complete.ok and "truncated" not in complete.measured, complete.line()
    for percent in (40, 75, 95):
        part = cut(whole, percent)
        got = lines(check_file(part, load_profile(profile)))["complete"]
        assert not got.ok and got.measured.startswith("truncated: "), (percent, got.line())
        if shutil.which("mediainfo"):
            info = subprocess.run(["mediainfo", str(part)], capture_output=True, text=True).stdout
            assert "IsTruncated" in info
    res = run_cli(["qc", part, "--delivery", profile])
    assert res.returncode == 8 and "FAIL complete        truncated" in res.stdout, res.stdout


def test_picture_tags_read_each_colour_tag_and_the_field_order():
    assert picture_tags(" (4:2:2), yuv422p(tv, bt470bg/bt470bg/bt709, top first), 1920x1080 [SAR 1:1 DAR 16:9], "
                        "25 fps") == {"pix_fmt": "yuv422p", "range": "tv", "matrix": "bt470bg",
                                      "primaries": "bt470bg", "transfer": "bt709", "field": "top first"}
    assert picture_tags(" (High) (avc1 / 0x31637661), yuv420p(tv, bt709, progressive), 320x180") == {
        "pix_fmt": "yuv420p", "range": "tv", "matrix": "bt709", "primaries": "bt709", "transfer": "bt709",
        "field": "progressive"}
    swapped = picture_tags(" (4:2:2), yuv422p(tv, top coded first (swapped)), 1920x1080, 25 fps")
    assert swapped == {"pix_fmt": "yuv422p", "range": "tv",
                       "field": "top coded first, bottom shown first (swapped)"}
    assert picture_tags(", yuv420p, 64x36, 25 fps") == {"pix_fmt": "yuv420p"}


@pytest.mark.parametrize("tags, ok", [
    (BT709, True),
    ("setparams=colorspace=bt470bg:color_primaries=bt470bg:color_trc=smpte170m:range=tv", False),     # BT.601
    ("setparams=colorspace=bt2020nc:color_primaries=bt2020:color_trc=smpte2084:range=tv", False),     # HDR10
    ("setparams=colorspace=bt709:color_primaries=bt709:color_trc=smpte170m:range=tv", False),         # one tag off
])
def test_each_colour_tag_is_checked_against_the_profile(tmp_path, tags, ok):
    """An XDCAM tagged BT.601, BT.2020/PQ, or BT.709 with another transfer (which only the MPEG-2 bitstream's own
    colour description says: MXF writes BT.601's transfer as BT.709's) fails the colour line; BT.709 passes."""
    out = xdcam_mxf(tmp_path / "x.mxf", seconds=0.2, tags=tags)
    colour = lines(check_file(out, load_profile("xdcam-hd422-1080i50")))["colour"]
    assert colour.ok == ok, colour.line()
    assert colour.expected == "primaries bt709, transfer bt709, matrix bt709, range tv"


def test_an_h264_tagged_hdr_fails_web_h264(tmp_path):
    out = tmp_path / "hdr.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=320x180:r=25:d=0.2", "-vf",
           "setparams=colorspace=bt2020nc:color_primaries=bt2020:color_trc=smpte2084:range=tv", "-c:v", "libx264",
           "-pix_fmt", "yuv420p", out)
    colour = lines(check_file(out, load_profile("web-h264")))["colour"]
    assert not colour.ok and colour.measured == "primaries bt2020, transfer smpte2084, matrix bt2020nc, range tv"


def small_file(out: Path, audio: list[str], seconds: float = 1.0, codec: str = "pcm_s24le") -> Path:
    """64x36 H.264 (BT.709) with one audio track per lavfi source in `audio`, `seconds` long."""
    inputs = [x for src in audio for x in ("-f", "lavfi", "-i", f"{src}:d={seconds}")]
    maps = [x for i in range(len(audio)) for x in ("-map", f"{i + 1}:a")]
    ffmpeg("-f", "lavfi", "-i", f"color=c=black:s=64x36:r=25:d={seconds}", *inputs, "-map", "0:v", *maps,
           "-vf", BT709, "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", codec, "-ar", "48000", "-ac", "1", out)
    return out


def test_levels_as_spoken_are_noted_not_failed_and_only_when_asked(tmp_path, run_cli):
    """A 0 dBTP tone: the profile's loudness and true peak FAIL (exit 8); with --loudness off (as the render was
    told) the same two lines are measured and noted, not failed, and qc exits 0 if nothing else fails."""
    tone = small_file(tmp_path / "tone.mov", ["aevalsrc=sin(2*PI*997*t):s=48000"], codec="pcm_s24le")
    profile = load_profile("web-h264")
    strict = lines(check_file(tone, profile))
    off = lines(check_file(tone, profile, loudness="off"))
    for name in ("loudness", "true peak"):
        assert strict[name].status == "FAIL" and off[name].status == "note", (strict[name], off[name])
        assert off[name].measured == strict[name].measured
    assert float(off["true peak"].measured.split()[0]) > -1
    res = run_cli(["qc", tone, "--delivery", "web-h264"])
    assert res.returncode == 8 and "FAIL loudness" in res.stdout
    res = run_cli(["qc", tone, "--delivery", "web-h264", "--loudness", "off"])
    assert "note loudness" in res.stdout and "note true peak" in res.stdout
    assert "FAIL loudness" not in res.stdout and "FAIL true peak" not in res.stdout


def test_speech_too_short_to_gate_or_silent_fails_saying_why(tmp_path):
    """0.3 s has no 400 ms gating block: "unmeasurable", a FAIL; silence reads -70 LUFS and says it is the gate."""
    short = lines(check_file(small_file(tmp_path / "short.mov", ["sine=f=997:sample_rate=48000"], 0.3),
                             load_profile("web-h264")))["loudness"]
    assert short.status == "FAIL" and short.measured.startswith("unmeasurable: 0.3") and "gating block" in \
        short.measured
    silent = lines(check_file(small_file(tmp_path / "silent.mov", ["anullsrc=r=48000:cl=mono"]),
                              load_profile("web-h264")))["loudness"]
    assert silent.status == "FAIL" and silent.measured == "-70.0 LUFS (silent, or under BS.1770's -70 LUFS gate)"


def test_a_file_of_fewer_tracks_is_still_measured(tmp_path):
    """Two mono tracks checked against XDCAM's eight: the track line fails, and the speech on tracks 1 and 2 is
    measured (it used to lose its loudness lines without a word); a file of one track says why it is not."""
    two = small_file(tmp_path / "two.mov", ["sine=f=997:sample_rate=48000", "sine=f=997:sample_rate=48000"])
    got = lines(check_file(two, load_profile("xdcam-hd422-1080i50")))
    assert not got["audio tracks"].ok and got["audio tracks"].measured.startswith("2: ")
    assert got["loudness"].measured.endswith(" LUFS") and got["true peak"].measured.endswith(" dBTP")
    one = small_file(tmp_path / "one.mov", ["sine=f=997:sample_rate=48000"])
    got = lines(check_file(one, load_profile("xdcam-hd422-1080i50")))
    assert got["loudness"].status == "FAIL"
    assert got["loudness"].measured == "not measured: the speech goes on tracks 1, 2 and the file has 1 audio track"


def test_a_dc_offset_fails(tmp_path):
    """Speech riding on a DC offset of 0.4 (-8 dBFS): the dc offset line fails; a tone without one passes."""
    offset = small_file(tmp_path / "dc.mov", ["aevalsrc=0.4+0.3*sin(2*PI*440*t):s=48000"])
    dc = lines(check_file(offset, load_profile("prores-hq-1080p")))["dc offset"]     # a profile without loudness
    assert dc.status == "FAIL" and dc.measured == "-8.0 dBFS" and dc.expected == "under -50 dBFS"
    clean = small_file(tmp_path / "clean.mov", ["aevalsrc=0.3*sin(2*PI*440*t):s=48000"])
    assert lines(check_file(clean, load_profile("prores-hq-1080p")))["dc offset"].ok


def test_qc_messages_say_what_they_mean(tmp_path, run_cli):
    """A missing file and a folder say so (exit 3); an MP4 named .mxf fails its extension; what a file does not
    say reads "unknown" (no "?@"); every measured value closes its parentheses."""
    res = run_cli(["qc", tmp_path / "none.mxf"])
    assert res.returncode == 3 and "none.mxf: file not found" in res.stderr, res.stderr
    res = run_cli(["qc", tmp_path])
    assert res.returncode == 3 and f"{tmp_path}: is a directory" in res.stderr, res.stderr
    mp4 = small_file(tmp_path / "web.mp4", ["aevalsrc=0.1*sin(2*PI*440*t):s=48000"], codec="aac")
    renamed = tmp_path / "web.mxf"
    renamed.write_bytes(mp4.read_bytes())
    res = run_cli(["qc", renamed])
    assert res.returncode == 8 and "FAIL extension       .mxf, but the file is MP4 (name it .mp4)" in res.stdout
    got = lines(check_file(mp4, load_profile("xdcam-hd422-1080i50")))
    assert got["profile/level"].measured == "unknown (no MPEG-2 sequence extension in the video)"
    assert lines(check_file(mp4, load_profile("web-h264")))["extension"].ok
    swapped = tmp_path / "swapped.mxf"             # -field_order tt without the frames' own: top coded first, swapped
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=1920x1080:r=25:d=0.12", "-vf", BT709, "-c:v", "mpeg2video",
           "-pix_fmt", "yuv422p", "-b:v", "50M", "-flags", "+ildct+ilme", "-field_order", "tb", swapped)
    for r in check_file(swapped, load_profile("xdcam-hd422-1080i50")):
        assert r.measured.count("(") == r.measured.count(")") and "?" not in r.measured, r.line()


@pytest.mark.slow
def test_qc_checks_a_plain_render_against_what_render_writes(video_avatar, session_home, tiny_checkpoints, clips,
                                                             tmp_path, run_cli):
    """A .mov H.264 and a .mkv HEVC that render wrote without --delivery (no shipped profile is for either) pass
    `qc FILE` against render's own expectations; a tag they lack fails it; a pair render never writes is one line
    (exit 2) saying what qc takes."""
    from conftest import store_env

    env = store_env(session_home, tiny_checkpoints)
    for name, codec in (("a.mov", "h264"), ("b.mkv", "hevc")):
        out = tmp_path / name
        r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", out, "--codec", codec, "--device",
                     "cpu", "--quiet"], env)
        assert r.returncode == 0, r.stderr
        r = run_cli(["qc", out], env)
        own = f"render's own {out.suffix} {codec}"
        assert r.returncode == 0 and f"checked against {own}, the closest of {own}" in r.stderr, r.stdout + r.stderr
        said = {ln.split()[1]: ln for ln in r.stdout.splitlines()}
        assert said["container"].split()[2] == {"a.mov": "mov", "b.mkv": "matroska"}[name]
        assert "bt709" in r.stdout and "48000 Hz" in r.stdout and "loudness" not in said, r.stdout
    untagged = tmp_path / "untagged.mov"                 # the same pictures with no colour tags: a FAIL, exit 8
    ffmpeg("-i", tmp_path / "a.mov", "-map", "0", "-c", "copy", "-bsf:v", "h264_metadata=colour_primaries=2:"
           "transfer_characteristics=2:matrix_coefficients=2", "-color_primaries", "unknown", "-color_trc", "unknown",
           "-colorspace", "unknown", untagged)
    r = run_cli(["qc", untagged], env)
    assert r.returncode == 8 and "FAIL colour" in r.stdout, r.stdout
    other = tmp_path / "c.mkv"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=320x180:r=25:d=0.4", "-c:v", "mpeg4", other)
    r = run_cli(["qc", other], env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no profile is for matroska files of mpeg4: without --delivery qc checks what render writes (.mp4 h264, " \
           ".mp4 hevc, .mov h264, .mov hevc, .mov prores, .mkv h264, .mkv hevc)" in r.stderr, r.stderr
