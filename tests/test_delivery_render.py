"""Delivery profiles end to end: every shipped profile renders (tiny checkpoints, 10 frames) and passes its own QC,
an independent reader (MediaInfo) reports XDCAM HD422 as such, loudness meets the target without touching the
motion, contradictions and bad profiles are refused with one line, a failed QC leaves nothing at the output."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf
import yaml

from conftest import store_env
from ditto_fast.audio.loudness import measure
from ditto_fast.delivery.leveling import level
from ditto_fast.core.config import CONFIG_DIR
from ditto_fast.core.errors import QCError, UsageError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.media.ffpipe import container_comment
from ditto_fast.delivery.format import DeliveryFormat, measured_as, programme_chain
from ditto_fast.delivery.profiles import load_profile
from ditto_fast.delivery.qc import check_file
from ditto_fast.encoding.writer import VideoWriter

SHIPPED = {"xdcam-hd422-1080i50": ".mxf", "xdcam-hd422-1080i5994": ".mxf", "dnxhd-1080i50": ".mxf",
           "prores-hq-1080p": ".mov", "web-h264": ".mp4"}
FF = imageio_ffmpeg.get_ffmpeg_exe()


def video_md5(path: Path) -> list[str]:
    """The decoded video frames' md5s (audio left out)."""
    out = subprocess.run([FF, "-v", "error", "-i", str(path), "-map", "0:v:0", "-f", "framemd5", "-"],
                         capture_output=True, text=True, check=True).stdout
    return [line.rsplit(",", 1)[1].strip() for line in out.splitlines() if not line.startswith("#")]


@pytest.fixture(scope="module")
def rendered(engine, video_avatar, clips, tmp_path_factory):
    """render(profile, **request fields) -> (output, profile JSON), each made once per module."""
    out_dir = tmp_path_factory.mktemp("delivered")
    made: dict = {}

    def render(profile: str, **fields):
        key = (profile, tuple(sorted(fields.items())))
        if key not in made:
            out = out_dir / f"{profile}-{len(made)}{SHIPPED.get(profile, '.mxf')}"
            result = engine.render(RenderRequest(avatar="anchor", audio=clips[0], output=out, delivery=profile,
                                                 steps=2, **fields))
            made[key] = (out, result.timings, result.warnings)
        return made[key]

    return render


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_shipped_profile_renders_and_passes_its_own_qc(rendered, name, run_cli):
    out, profile, _ = rendered(name)
    assert out.suffix == SHIPPED[name] and profile["delivery"]["profile"] == name
    total = len(profile["delivery"]["requirements"])
    assert profile["delivery"]["qc"] == f"{total}/{total} ok"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]       # no temporaries left
    assert container_comment(out) == profile["digest"]          # batch finds it finished (MXF included)
    res = run_cli(["qc", out, "--delivery", name, "--json"])
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and {r["name"] for r in report["requirements"]} >= {"container", "codec", "scan", "timecode"}


def _mediainfo(path: Path) -> dict[str, list[dict[str, str]]]:
    """MediaInfo's report, by section kind (General, Video, Audio, Other), each a list of key: value dicts."""
    text = subprocess.run(["mediainfo", str(path)], capture_output=True, text=True, check=True).stdout
    sections: dict[str, list[dict[str, str]]] = {}
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        kind = lines[0].split(" #")[0].strip()
        sections.setdefault(kind, []).append(
            {k.strip(): v.strip() for k, _, v in (ln.partition(" : ") for ln in lines[1:])})
    return sections


needs_mediainfo = pytest.mark.skipif(shutil.which("mediainfo") is None,
                                     reason="MediaInfo is not installed (apt-get install mediainfo): the independent "
                                            "reader of MXF/MOV files")


@pytest.mark.slow
@needs_mediainfo
def test_mediainfo_reports_xdcam_hd422(engine, video_avatar, speech_wav, tmp_path):
    """2.4 s (60 frames, five GOPs: MediaInfo names the format only once it has seen a whole GOP)."""
    speech, sr = sf.read(speech_wav, dtype="float32")
    sf.write(tmp_path / "s.wav", speech[sr:int(3.4 * sr)], sr)
    out = tmp_path / "x.mxf"
    engine.render(RenderRequest(avatar="anchor", audio=tmp_path / "s.wav", output=out,
                                delivery="xdcam-hd422-1080i50", steps=2))
    info = _mediainfo(out)
    general, video, audio = info["General"][0], info["Video"][0], info["Audio"]
    assert general["Commercial name"] == video["Commercial name"] == "XDCAM HD422"
    assert video["Format settings, GOP"] == "M=3, N=12"
    assert (general["Format"], general["Format profile"]) == ("MXF", "OP-1a")
    assert (video["Format"], video["Format version"], video["Format profile"]) == ("MPEG Video", "Version 2",
                                                                                  "4:2:2@High")
    assert (video["Bit rate mode"], video["Bit rate"]) == ("Constant", "50.0 Mb/s")
    assert (video["Scan type"], video["Scan order"]) == ("Interlaced", "Top Field First")
    assert (video["Width"], video["Height"], video["Frame rate"]) == ("1 920 pixels", "1 080 pixels", "25.000 FPS")
    assert (video["Chroma subsampling"], video["Matrix coefficients"]) == ("4:2:2", "BT.709")
    assert video["Time code of first frame"] == "10:00:00:00"
    assert len(audio) == 8 and all((a["Format"], a["Channel(s)"], a["Bit depth"], a["Sampling rate"]) ==
                                   ("PCM", "1 channel", "24 bits", "48.0 kHz") for a in audio)


@pytest.mark.slow
@needs_mediainfo
@pytest.mark.parametrize("name, fmt, scan", [("dnxhd-1080i50", "VC-3", "Interlaced"),
                                             ("prores-hq-1080p", "ProRes", "Progressive"),
                                             ("web-h264", "AVC", "Progressive")])
def test_mediainfo_reads_the_other_profiles(rendered, name, fmt, scan):
    out, _, _ = rendered(name)
    video = _mediainfo(out)["Video"][0]
    assert (video["Format"], video["Scan type"]) == (fmt, scan)


@pytest.mark.slow
def test_ntsc_drop_frame_timecode_from_the_command_line(rendered):
    out, profile, _ = rendered("xdcam-hd422-1080i5994", timecode="09:59:50;02")
    checked = {r["name"]: r for r in profile["delivery"]["requirements"]}
    assert checked["timecode"]["measured"] == "09:59:50;02" and checked["frame rate"]["measured"] == "29.970 fps"
    assert profile["rate"] == "30000/1001"


@pytest.mark.slow
def test_loudness_leaves_the_motion_alone_and_is_reported(rendered):
    leveled, with_gain, _ = rendered("web-h264")
    as_spoken, without, _ = rendered("web-h264", loudness="off")
    assert video_md5(leveled) == video_md5(as_spoken)             # same seed, same frames
    ld = with_gain["delivery"]["loudness"]
    assert abs(ld["output"]["integrated_lufs"] - -16) <= 0.5 and ld["output"]["true_peak_dbtp"] <= -1
    assert ld["input"]["integrated_lufs"] != ld["output"]["integrated_lufs"]
    assert without["delivery"]["loudness"] is None
    off = measure(as_spoken, "[0:a:0]anull").integrated
    assert abs(off - ld["input"]["integrated_lufs"]) <= 0.5         # off: levels as spoken


def _speech_at(path: Path, speech_wav: Path, gain_db: float, seconds: float = 6.0) -> Path:
    audio, sr = sf.read(speech_wav, dtype="float32")
    sf.write(path, audio[: int(seconds * sr)] * np.float32(10 ** (gain_db / 20)), sr, subtype="FLOAT")
    return path


def _deliver(out: Path, profile_name: str, speech: Path, target: tuple[float, float] | None) -> list:
    """Small black frames and `speech` written as the profile delivers them (through its leveling), then QC'd."""
    profile = load_profile(profile_name)
    rate = profile.video.rate or Fraction(25)
    size = profile.video.size or (64, 36)
    gain = level(speech, programme_chain(profile), measured_as(profile), *target).filters if target else ""
    seconds = sf.info(speech).duration
    n = int(seconds * rate)
    fmt = DeliveryFormat(profile, size, rate, gain=gain)
    w, h = size
    with VideoWriter(out, size, fps=rate, audio_path=speech, frames=n, fmt=fmt, pix_fmt="yuv420p") as writer:
        frame = np.full((h * 3 // 2, w), 16, np.uint8)
        frame[h:] = 128
        for _ in range(n):
            writer.write(frame)
    return check_file(out, profile, size=size, rate=rate, loudness=target)


@pytest.mark.slow
@pytest.mark.parametrize("input_lufs", [-35, -23, -10])
@pytest.mark.parametrize("name", ["web-h264", "xdcam-hd422-1080i5994"])
def test_loudness_meets_the_target_from_quiet_and_loud_speech(tmp_path, speech_wav, input_lufs, name):
    profile = load_profile(name)
    speech = tmp_path / "speech.wav"
    _speech_at(speech, speech_wav, 0.0)
    now = measure(speech, f"[0:a:0]{programme_chain(profile)},{measured_as(profile)}").integrated
    _speech_at(speech, speech_wav, input_lufs - now)
    if name.startswith("xdcam"):            # 1080 frames are slow to write: only a second of them
        _speech_at(speech, speech_wav, input_lufs - now, seconds=1.5)
    result = {r.name: r for r in _deliver(tmp_path / f"out{profile.extension}", name, speech, profile.loudness)}
    assert result["loudness"].ok and result["true peak"].ok, (result["loudness"], result["true peak"])
    got = float(result["loudness"].measured.split()[0])
    assert abs(got - profile.loudness[0]) <= 0.5


@pytest.mark.slow
def test_a_dc_offset_is_blocked_in_the_delivered_programme(tmp_path, speech_wav):
    """0.5 x speech + 0.4 (a DC offset of -8 dBFS) delivered as XDCAM: the programme's DC blocker takes the offset
    out (QC's dc offset line under -50 dBFS; it was delivered as it came), the loudness still on target."""
    audio, sr = sf.read(speech_wav, dtype="float32")
    speech = tmp_path / "dc.wav"
    sf.write(speech, 0.5 * audio[sr: 2 * sr] + np.float32(0.4), sr, subtype="FLOAT")
    profile = load_profile("xdcam-hd422-1080i50")
    result = {r.name: r for r in _deliver(tmp_path / "dc.mxf", profile.name, speech, profile.loudness)}
    assert result["dc offset"].ok and float(result["dc offset"].measured.split()[0]) < -60, result["dc offset"]
    assert result["loudness"].ok and result["true peak"].ok


def test_silent_speech_gets_no_gain_and_a_warning(tmp_path):
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(16000 * 2, np.float32), 16000)
    profile = load_profile("web-h264")
    leveled = level(silent, programme_chain(profile), measured_as(profile), *profile.loudness)
    assert leveled.filters == "" and leveled.gain_db == 0 and "quieter than -70 LUFS" in leveled.warning


def test_qc_finds_what_a_file_does_not_meet(tmp_path, run_cli):
    """Any file: an MP4 made by ffmpeg itself checked against XDCAM HD422 fails, line by line, exit 8."""
    clip = tmp_path / "web.mp4"
    subprocess.run([FF, "-v", "error", "-f", "lavfi", "-i", "testsrc2=s=320x180:r=25:d=1", "-f", "lavfi", "-i",
                    "sine=f=440:d=1", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", str(clip)], check=True)
    res = run_cli(["qc", clip, "--delivery", "xdcam-hd422-1080i50"])
    assert res.returncode == QCError.exit_code == 8
    lines = {ln.split()[1]: ln.split()[0] for ln in res.stdout.splitlines()}
    assert lines["container"] == "FAIL" and lines["codec"] == "FAIL" and lines["scan"] == "FAIL"
    assert "requirements of xdcam-hd422-1080i50 fail" in res.stderr
    ok = run_cli(["qc", clip, "--delivery", "web-h264"])
    assert "FAIL loudness" in ok.stdout and "ok   codec" in ok.stdout      # a 440 Hz tone is not at -16 LUFS


@pytest.mark.slow
def test_qc_without_a_profile_takes_the_closest_shipped_one(rendered, run_cli, tmp_path):
    """Without --delivery: of the shipped profiles for the file's container and codec, the one it meets best; a file
    no shipped profile is for is checked against what render writes in that container and codec (here: it has no
    audio track, a FAIL)."""
    for name in ("xdcam-hd422-1080i50", "xdcam-hd422-1080i5994"):
        out, _, _ = rendered(name)
        res = run_cli(["qc", out, "--json"])
        assert res.returncode == 0 and json.loads(res.stdout)["profile"] == name, res.stderr
        assert f"checked against {name}, the closest of xdcam-hd422-1080i50, xdcam-hd422-1080i5994" in res.stderr
    mkv = tmp_path / "a.mkv"
    subprocess.run([FF, "-v", "error", "-f", "lavfi", "-i", "testsrc2=s=320x180:r=25:d=1", "-c:v", "libx264",
                    str(mkv)], check=True)
    res = run_cli(["qc", mkv])
    assert res.returncode == 8 and "checked against render's own .mkv h264" in res.stderr, res.stderr
    assert "FAIL audio tracks    0: none" in res.stdout, res.stdout


def test_contradictions_are_refused_before_anything_loads(run_cli, video_avatar, clips, tmp_path, tiny_checkpoints,
                                                          session_home):
    env = store_env(session_home, tiny_checkpoints)
    base = ["render", "--avatar", "anchor", "--audio", clips[0], "--delivery", "xdcam-hd422-1080i50"]
    house = tmp_path / "house-4x3.yaml"
    data = yaml.safe_load((CONFIG_DIR / "delivery" / "xdcam-hd422-1080i50.yaml").read_text())
    data["video"]["size"] = "1440x1080"
    house.write_text(yaml.safe_dump(data))
    for extra, words in ((["-o", tmp_path / "x.mp4"], "name the output x.mxf"),
                         (["-o", tmp_path / "x.mxf", "--fps", "50"], "--fps 50 contradicts"),
                         (["-o", tmp_path / "x.mxf", "--codec", "h264"], "--codec h264 contradicts"),
                         (["-o", tmp_path / "x.mxf", "--timecode", "10:00:00;00"], "29.97 and 59.94 fps only"),
                         (["-o", tmp_path / "x.mxf", "--loudness", "-2"], "loudness must be off or a target"),
                         (["-o", tmp_path / "x.mxf", "--delivery", house], "another aspect")):
        res = run_cli([*base, *extra], env=env)
        assert res.returncode == 2 and words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "y.mp4", "--loudness", "-23"],
                  env=env)
    assert res.returncode == 2 and "goes with --delivery" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["house-4x3.yaml"]


def test_a_job_line_names_its_delivery(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "house.yaml").write_text((CONFIG_DIR / "delivery" / "web-h264.yaml").read_text())
    r = RenderRequest.from_json({"avatar": "a", "audio": "a.wav", "output": "a.mp4", "delivery": "p/house.yaml",
                                 "loudness": -20, "timecode": "01:00:00:00"}, tmp_path, "jobs:1")
    assert r.delivery == str(tmp_path / "p" / "house.yaml") and r.loudness == -20.0
    with pytest.raises(UsageError, match="jobs:2: .*loudness.target"):
        bad = tmp_path / "bad.yaml"
        data = yaml.safe_load((CONFIG_DIR / "delivery" / "web-h264.yaml").read_text())
        data["loudness"]["target"] = -50
        bad.write_text(yaml.safe_dump(data))
        RenderRequest.from_json({"avatar": "a", "audio": "a.wav", "output": "a.mp4", "delivery": "bad.yaml"},
                                tmp_path, "jobs:2")


@pytest.mark.slow
def test_a_deliverable_failing_qc_is_a_failed_job_and_nothing_is_written(tmp_path, video_avatar, clips,
                                                                         tiny_checkpoints, session_home, run_cli):
    """A profile no speech can meet (-5 LUFS under a -10 dBTP ceiling): QC fails, exit 8, the output path stays empty;
    in a batch the job fails (exit 7) beside a good one, whose report row carries the loudness in and out."""
    impossible = tmp_path / "loud.yaml"
    data = yaml.safe_load((CONFIG_DIR / "delivery" / "web-h264.yaml").read_text())
    data["loudness"] = {"target": -5, "true_peak": -10}
    impossible.write_text(yaml.safe_dump(data))
    env = store_env(session_home, tiny_checkpoints)
    out = tmp_path / "loud.mp4"
    res = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", out, "--delivery", impossible,
                   "--steps", "2", "--quiet"], env=env)
    assert res.returncode == 8 and "fails delivery profile loud: loudness" in res.stderr, res.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(j) for j in (
        {"avatar": "anchor", "audio": str(clips[1]), "output": "good.mp4", "delivery": "web-h264", "steps": 2},
        {"avatar": "anchor", "audio": str(clips[2]), "output": "bad.mp4", "delivery": "loud.yaml", "steps": 2})) + "\n")
    report = tmp_path / "report.json"
    res = run_cli(["batch", jobs, "--report", report, "--quiet"], env=env)
    rows = json.loads(report.read_text())["jobs"]
    assert res.returncode == 7 and [r["status"] for r in rows] == ["done", "failed"]
    assert rows[1]["exit_code"] == 8 and not (tmp_path / "bad.mp4").exists()
    ld = rows[0]["delivery"]["loudness"]
    assert rows[0]["delivery"]["qc"].endswith("ok") and abs(ld["output"]["integrated_lufs"] + 16) <= 0.5
    assert re.match(r"-?\d", str(ld["input"]["integrated_lufs"]))


@pytest.mark.slow
def test_field_rate_motion_renders_each_field_at_its_own_time(engine, rendered, video_avatar, clips, tmp_path):
    """`fields: field-rate`: 50 frames a second rendered, woven in pairs into 25 interlaced ones, still XDCAM HD422
    by QC; twice the frames of PsF through the loop."""
    data = yaml.safe_load((CONFIG_DIR / "delivery" / "xdcam-hd422-1080i50.yaml").read_text())
    data["video"]["fields"] = "field-rate"
    house = tmp_path / "xdcam-fields.yaml"
    house.write_text(yaml.safe_dump(data))
    out = tmp_path / "fields.mxf"
    result = engine.render(RenderRequest(avatar="anchor", audio=clips[0], output=out, delivery=str(house), steps=2))
    psf_out, psf, _ = rendered("xdcam-hd422-1080i50")
    d = result.timings["delivery"]
    assert d["qc"].endswith("ok") and d["scan"] == "interlaced tff, field-rate motion" and d["delivered_rate"] == "25"
    assert result.timings["rate"] == "50" and result.timings["frames"] == 2 * psf["frames"]
    assert len(video_md5(out)) == len(video_md5(psf_out)) == psf["frames"]


@pytest.mark.slow
def test_the_render_and_qc_run_one_check(engine, video_avatar, clips, tmp_path, run_cli):
    """A 0 dBTP tone delivered as XDCAM with --loudness off: the render's QC has the loudness and true-peak lines
    (noted, not failed, and said in a warning), line for line what `qc --loudness off` prints of the file; plain
    `qc` holds it to the profile (exit 8). Speech that cannot be leveled (silent; 0.3 s, under one gating block) is
    exit 8 before any frame, nothing delivered, where the render used to drop those lines and deliver it."""
    t = np.arange(int(0.4 * 48000)) / 48000
    tone = tmp_path / "tone.wav"
    sf.write(tone, np.sin(2 * np.pi * 997 * t).astype(np.float32), 48000, subtype="FLOAT")
    out = tmp_path / "tone.mxf"
    result = engine.render(RenderRequest(avatar="anchor", audio=tone, output=out, delivery="xdcam-hd422-1080i50",
                                         loudness="off", steps=2))
    rendered_qc = {r["name"]: r for r in result.timings["delivery"]["requirements"]}
    assert rendered_qc["loudness"]["waived"] and rendered_qc["true peak"]["waived"]
    assert result.timings["delivery"]["qc"].endswith(", 2 noted (--loudness off)")
    assert any("true peak" in w and "--loudness off" in w for w in result.warnings)
    res = run_cli(["qc", out, "--delivery", "xdcam-hd422-1080i50", "--loudness", "off", "--json"])
    assert res.returncode == 0, res.stdout
    assert {r["name"]: r for r in json.loads(res.stdout)["requirements"]} == rendered_qc
    assert run_cli(["qc", out, "--delivery", "xdcam-hd422-1080i50"]).returncode == 8
    silent, short = tmp_path / "silent.wav", tmp_path / "short.wav"
    sf.write(silent, np.zeros(16000, np.float32), 16000)
    speech, sr = sf.read(clips[1], dtype="float32")
    sf.write(short, speech[: int(0.3 * sr)], sr)
    for audio, why in ((silent, "is silent or quieter than -70 LUFS"), (short, "under BS.1770's 0.4 s gating block")):
        target = tmp_path / f"{audio.stem}.mxf"
        with pytest.raises(QCError, match=why):
            engine.render(RenderRequest(avatar="anchor", audio=audio, output=target,
                                        delivery="xdcam-hd422-1080i50", steps=2))
        assert not target.exists()
