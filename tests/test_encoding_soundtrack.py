"""The output's soundtrack: mono and stereo as they are, 5.1/7.1 mixed to stereo by ITU-R BS.775 (levels measured
in the decoded output), what cannot be carried refused before any work, AAC's bitrate by its channels."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from conftest import store_env
from ditto_fast.audio.decode import decode_audio
from ditto_fast.audio.layout import MINUS_3DB, speakers, stereo_mix
from ditto_fast.core.errors import InputError
from ditto_fast.encoding.formats import aac_bitrate, output_format
from ditto_fast.encoding.soundtrack import plan_soundtrack
from ditto_fast.encoding.writer import VideoWriter

RATE = 48000
# one sine per channel of a 5.1 file (FL FR FC LFE BL BR), each at its own frequency, all at the same level
FREQS = {"FL": 300.0, "FR": 500.0, "FC": 700.0, "LFE": 60.0, "BL": 900.0, "BR": 1100.0}
LEVEL = 0.2


def ffmpeg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", *map(str, args)], capture_output=True)


def write_tones(path: Path, seconds: float, channels: int, freqs: list[float] | None = None) -> Path:
    """A WAV of `channels` sines (one per channel) at LEVEL, written with soundfile (ffmpeg reads its layout)."""
    t = np.arange(int(seconds * RATE)) / RATE
    freqs = freqs or [200.0 + 100 * c for c in range(channels)]
    sf.write(path, np.stack([LEVEL * np.sin(2 * np.pi * f * t) for f in freqs], 1).astype(np.float32), RATE)
    return path


def decoded(path: Path) -> tuple[np.ndarray, str]:
    """The output's audio as float32 [t, channels] at 48 kHz, and ffmpeg's line for the audio stream."""
    line = re.search(r"Stream #.*Audio:.*", ffmpeg("-i", path).stderr.decode()).group(0)
    channels = {"mono": 1, "stereo": 2}.get(re.search(r"Hz, ([^,]+),", line).group(1), 0)
    raw = ffmpeg("-v", "error", "-i", path, "-map", "0:a:0", "-f", "f32le", "-").stdout
    return np.frombuffer(raw, np.float32).reshape(-1, channels or 1), line


def stated_kbps(line: str) -> int:
    """The audio stream's bitrate as ffmpeg's probe states it (AAC's average over the stream)."""
    return int(re.search(r"(\d+) kb/s", line).group(1))


def level(x: np.ndarray, freq: float) -> float:
    """The amplitude of the sine at `freq` in x, fitted over the middle of the signal (no encoder edges)."""
    x = x[len(x) // 4: 3 * len(x) // 4].astype(np.float64)
    t = np.arange(len(x)) / RATE
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], 1)
    coef = np.linalg.lstsq(basis, x, rcond=None)[0]
    return float(np.hypot(*coef))


def test_the_stereo_mix_is_bs775():
    mix = stereo_mix(speakers(6, 0x3F))                                 # 5.1: FL FR FC LFE BL BR
    np.testing.assert_allclose(mix, [[1, 0, MINUS_3DB, 0, MINUS_3DB, 0], [0, 1, MINUS_3DB, 0, 0, MINUS_3DB]])
    mix = stereo_mix(speakers(8, 0x63F))                                # 7.1: ... BL BR SL SR
    np.testing.assert_allclose(mix[0], [1, 0, MINUS_3DB, 0, MINUS_3DB, 0, MINUS_3DB, 0])
    assert MINUS_3DB == pytest.approx(10 ** (-3.0103 / 20), rel=1e-5)


def test_mono_and_stereo_pass_and_surround_is_planned_as_stereo(tmp_path):
    mp4 = output_format(tmp_path / "o.mp4")
    for channels in (1, 2):
        track = plan_soundtrack("a.wav", channels, 0, mp4)
        assert track.channels == channels and track.mix is None and track.filters() == [] and track.note is None
    track = plan_soundtrack("a.wav", 6, 0x60F, mp4)                    # 5.1(side), as FLAC declares it
    assert track.channels == 2 and track.filters()[0].startswith("pan=stereo|c0=1*c0+0.7071067812*c2+")
    assert "LFE" not in track.filters()[0] and "c3" not in track.filters()[0]
    assert track.note == "a.wav: 5.1(side) audio mixed to stereo (ITU-R BS.775: centre and surrounds at -3 dB, " \
                         "LFE dropped)"


def test_what_cannot_be_mixed_or_carried_is_refused_naming_the_file(tmp_path):
    mp4, prores = output_format(tmp_path / "o.mp4"), output_format(tmp_path / "o.mov", "prores")
    with pytest.raises(InputError, match=r"^a\.wav: has 16 audio channels; .* give a mono, stereo or 5\.1 mix"):
        plan_soundtrack("a.wav", 16, 0, mp4)
    with pytest.raises(InputError, match=r"^a\.wav: its 6 audio channels declare no layout"):
        plan_soundtrack("a.wav", 6, 0, mp4)
    # a delivery that keeps 16 channels: AAC cannot carry them, 24-bit PCM in QuickTime can
    with pytest.raises(InputError, match=r"AAC in a mp4 file carries at most 8; .* --codec prores"):
        plan_soundtrack("a.wav", 16, 0, mp4, keep=(1, 2, 16))
    assert plan_soundtrack("a.wav", 16, 0, prores, keep=(16,)).channels == 16
    with pytest.raises(InputError, match="carries at most 24; give a mix of at most 24 channels$"):
        plan_soundtrack("a.wav", 32, 0, prores, keep=(32,))


def test_aac_bitrate_follows_the_channels():
    assert [aac_bitrate(c) for c in (1, 2, 6, 8)] == ["160k", "160k", "384k", "512k"]


def test_decoding_reads_the_layout_ffmpeg_sees(tmp_path):
    audio = decode_audio(write_tones(tmp_path / "a.wav", 0.2, 6))
    assert (audio.channels, audio.channel_mask) == (6, 0x3F)           # 6 channels of WAV: 5.1
    assert decode_audio(write_tones(tmp_path / "m.wav", 0.2, 1)).channels == 1


def _frames(writer: VideoWriter, n: int) -> None:
    for _ in range(n):
        writer.write(np.full((48, 64, 3), 128, np.uint8))


def test_aac_bitrate_scales_with_the_channels_carried(tmp_path):
    five_one = write_tones(tmp_path / "51.wav", 2.0, 6)
    fmt = output_format(tmp_path / "o.mp4")
    for keep, channels, kbps in (((1, 2, 6), 6, 384), ((1, 2), 2, 160)):
        out = tmp_path / f"o{channels}.mp4"
        with VideoWriter(out, (64, 48), audio_path=five_one, frames=50, fmt=fmt,
                         soundtrack=plan_soundtrack(five_one, 6, 0x3F, fmt, keep=keep)) as vw:
            _frames(vw, 50)
        audio, line = decoded(out)
        assert abs(stated_kbps(line) - kbps) <= 0.1 * kbps, line        # 160 kb/s was all 6 channels had
        assert ("5.1" in line) == (channels == 6) and ("stereo" in line) == (channels == 2), line


def test_a_writer_refuses_16_channels_before_the_first_frame(tmp_path):
    sixteen = write_tones(tmp_path / "16.wav", 0.5, 16)
    with pytest.raises(InputError, match=r"16\.wav: has 16 audio channels"):
        VideoWriter(tmp_path / "o.mp4", (64, 48), audio_path=sixteen, frames=12)
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*"))


def test_pcm_in_quicktime_carries_16_channels(tmp_path):
    sixteen = write_tones(tmp_path / "16.wav", 0.5, 16)
    fmt = output_format(tmp_path / "o.mov", "prores")
    with VideoWriter(tmp_path / "o.mov", (64, 48), audio_path=sixteen, frames=12, fmt=fmt,
                     soundtrack=plan_soundtrack(sixteen, 16, 0, fmt, keep=(16,))) as vw:
        _frames(vw, 12)
    line = re.search(r"Stream #.*Audio:.*", ffmpeg("-i", tmp_path / "o.mov").stderr.decode()).group(0)
    assert "pcm_s24le" in line and ("16 channels" in line or "9.1.6" in line), line


@pytest.mark.slow
def test_a_5_1_speech_file_renders_mixed_to_stereo_at_bs775_levels(run_cli, video_avatar, session_home,
                                                                    tiny_checkpoints, tmp_path):
    wav = write_tones(tmp_path / "news51.wav", 1.0, 6, list(FREQS.values()))
    out = tmp_path / "news.mp4"
    res = run_cli(["render", "--avatar", "anchor", "--audio", wav, "-o", out, "--device", "cpu", "--quiet"],
                  env=store_env(session_home, tiny_checkpoints))
    assert res.returncode == 0, res.stderr
    assert f"ditto-fast: note: {wav}: 5.1 audio mixed to stereo (ITU-R BS.775" in res.stderr
    audio, line = decoded(out)
    assert audio.shape[1] == 2 and "stereo" in line and abs(stated_kbps(line) - 160) <= 16, line
    expect = {"L": {"FL": 1.0, "FC": MINUS_3DB, "BL": MINUS_3DB}, "R": {"FR": 1.0, "FC": MINUS_3DB, "BR": MINUS_3DB}}
    for side, column in (("L", audio[:, 0]), ("R", audio[:, 1])):
        for name, freq in FREQS.items():
            got, want = level(column, freq), LEVEL * expect[side].get(name, 0.0)
            if want:
                assert 20 * np.log10(got / want) == pytest.approx(0.0, abs=0.3), (side, name, got, want)
            else:
                assert got < LEVEL * 0.01, (side, name, got)           # absent: under -40 dB (LFE dropped)


def test_16_channel_speech_is_refused_before_any_work(run_cli, video_avatar, session_home, tiny_checkpoints,
                                                     tmp_path):
    wav = write_tones(tmp_path / "multitrack.wav", 0.5, 16)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = store_env(session_home, tiny_checkpoints)
    res = run_cli(["render", "--avatar", "anchor", "--audio", wav, "-o", out_dir / "news.mp4", "--device", "cpu"],
                  env=env)
    assert res.returncode == 3, res.stderr
    assert res.stderr.strip() == f"ditto-fast: error: {wav}: has 16 audio channels; a render mixes at most 8 " \
                                 "(7.1) to stereo and cannot tell which of 16 carry the speech; give a mono, stereo " \
                                 "or 5.1 mix of it"
    assert list(out_dir.iterdir()) == []                                # nothing at (or beside) the output path
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(f'{{"avatar": "anchor", "audio": "{wav}", "output": "out/batch.mp4"}}\n')
    report = tmp_path / "report.json"
    res = run_cli(["batch", jobs, "--device", "cpu", "--quiet", "--report", report], env=env)
    assert res.returncode == 7 and list(out_dir.iterdir()) == []
    row = json.loads(report.read_text())["jobs"][0]
    assert row["exit_code"] == 3 and "has 16 audio channels" in row["error"], row


def test_a_mixed_soundtrack_is_in_the_digest_and_mono_digests_are_as_before(video_avatar, tiny_checkpoints,
                                                                            tmp_path):
    import dataclasses

    from ditto_fast.avatar import load_avatar
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.core.config import load_config
    from ditto_fast.engine.clip import check_clip
    from ditto_fast.engine.digest import clip_digest
    from ditto_fast.engine.request import RenderRequest

    avatar = load_avatar("anchor", checkpoints=find_checkpoints(tiny_checkpoints))
    mono = check_clip(RenderRequest("anchor", write_tones(tmp_path / "m.wav", 0.3, 1), tmp_path / "m.mp4"), avatar,
                      load_config())
    assert mono.notes == [] and clip_digest(mono, {}) == clip_digest(dataclasses.replace(mono, soundtrack=None), {})
    surround = check_clip(RenderRequest("anchor", write_tones(tmp_path / "s.wav", 0.3, 6), tmp_path / "s.mp4"),
                          avatar, load_config())
    assert surround.soundtrack.channels == 2 and len(surround.notes) == 1   # an old 6-channel output is not skipped
    assert clip_digest(surround, {}) != clip_digest(dataclasses.replace(surround, soundtrack=None), {})


def _over_full_scale(path: Path, speech_wav: Path, seconds: float = 1.0, gain_db: float = 9.8) -> Path:
    """Float speech raised until it peaks at +`gain_db` dBFS (a float WAV carries it; PCM cannot)."""
    speech, sr = sf.read(speech_wav, dtype="float32")
    part = speech[sr: sr + int(seconds * sr)]
    part = part / np.abs(part).max() * np.float32(10 ** (gain_db / 20))
    sf.write(path, part, sr, subtype="FLOAT")
    return path


def test_float_audio_over_full_scale_is_lowered_not_clipped(tmp_path, speech_wav):
    """Speech peaking at +9.8 dBFS written with ProRes (24-bit PCM): before, thousands of samples clipped at full
    scale and no word; now the soundtrack is lowered to a true peak of -1 dBTP, with a note, and nothing clips.
    Audio within full scale is planned as before (no filter, no note: its bytes do not change)."""
    loud = decode_audio(_over_full_scale(tmp_path / "loud.wav", speech_wav))
    assert 20 * np.log10(loud.peak) == pytest.approx(9.8, abs=0.05)
    fmt = output_format(tmp_path / "o.mov", "prores")
    track = plan_soundtrack(tmp_path / "loud.wav", 1, 0, fmt, peak=loud.peak)
    assert track.gain_db < -10 and track.filters() == [f"volume={track.gain_db:.3f}dB"]
    assert "above full scale; lowered by" in track.note and "instead of being clipped" in track.note
    with VideoWriter(tmp_path / "o.mov", (64, 48), audio_path=tmp_path / "loud.wav", frames=25, fmt=fmt,
                     soundtrack=track) as vw:
        _frames(vw, 25)
    audio, line = decoded(tmp_path / "o.mov")
    assert "pcm_s24le" in line
    assert (np.abs(audio) >= 0.999).sum() == 0 and 20 * np.log10(np.abs(audio).max()) <= -0.9
    normal = decode_audio(speech_wav)
    assert normal.peak <= 1.0
    plain = plan_soundtrack(speech_wav, 1, 0, fmt, peak=normal.peak)
    assert plain.filters() == [] and plain.note is None and plain.gain_db == 0


def _five_one_in_phase(path: Path, level: float) -> Path:
    """16-bit 5.1 (FL FR FC LFE BL BR): one tone at `level` in FL, FC and BL, in phase, so that the left of the
    BS.775 mix sums to 2.41 times it."""
    t = np.arange(48000) / 48000
    tone = level * np.sin(2 * np.pi * 440 * t)
    audio = np.zeros((len(t), 6))
    audio[:, 0] = audio[:, 2] = audio[:, 4] = tone
    sf.write(path, audio, 48000, subtype="PCM_16")
    return path


def test_a_5_1_mix_that_sums_over_full_scale_is_lowered_not_clipped(tmp_path):
    """A 16-bit 5.1 file within full scale whose mix sums to +6.7 dBFS: the mix used to clip inside ffmpeg's pan
    (integer audio), at full scale, with no word; now it is measured in float and lowered to -1 dBTP, with a note,
    leveled or not. A mix within full scale keeps its filters (and bytes)."""
    fmt = output_format(tmp_path / "o.mov", "prores")
    loud = _five_one_in_phase(tmp_path / "loud.wav", 0.9)
    info = decode_audio(loud)
    assert info.channels == 6 and info.peak <= 1.0
    for leveled in (False, True):
        track = plan_soundtrack(loud, 6, info.channel_mask, fmt, peak=info.peak, leveled=leveled)
        assert track.gain_db == pytest.approx(-7.7, abs=0.15), track
        assert track.filters()[0] == f"volume={track.gain_db:.3f}dB" and track.filters()[1].startswith("pan=")
        assert "its stereo mix summing to a true peak of +6." in track.note and "instead of being clipped" in track.note
    with VideoWriter(tmp_path / "o.mov", (64, 48), audio_path=loud, frames=25, fmt=fmt, soundtrack=track) as vw:
        _frames(vw, 25)
    audio, _ = decoded(tmp_path / "o.mov")
    assert (np.abs(audio) >= 0.999).sum() == 0 and 20 * np.log10(np.abs(audio).max()) <= -0.9
    ratio = np.abs(audio[:, 0]).max() / np.abs(audio[:, 1]).max()    # the mix's own balance is kept
    assert ratio == pytest.approx((1 + 2 * MINUS_3DB) / MINUS_3DB, rel=0.01)
    quiet = _five_one_in_phase(tmp_path / "quiet.wav", 0.3)
    plain = plan_soundtrack(quiet, 6, info.channel_mask, fmt, peak=decode_audio(quiet).peak)
    assert plain.gain_db == 0 and len(plain.filters()) == 1 and "above full scale" not in plain.note


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--codec", "prores"], ["--delivery", "prores-hq-1080p"]])
def test_a_render_of_float_audio_over_full_scale_clips_nothing(run_cli, video_avatar, session_home,
                                                                tiny_checkpoints, tmp_path, speech_wav, how):
    wav = _over_full_scale(tmp_path / "loud.wav", speech_wav, seconds=0.5)
    out = tmp_path / "news.mov"
    res = run_cli(["render", "--avatar", "anchor", "--audio", wav, "-o", out, "--device", "cpu", "--steps", "2",
                   "--quiet", *how], env=store_env(session_home, tiny_checkpoints))
    assert res.returncode == 0, res.stderr
    assert f"ditto-fast: note: {wav}: float audio peaking at +9.8 dBFS, above full scale; lowered by" in res.stderr
    audio, _ = decoded(out)
    assert (np.abs(audio) >= 0.999).sum() == 0, "clipped samples"


def test_only_audio_that_is_not_leveled_gets_the_full_scale_gain(video_avatar, tiny_checkpoints, tmp_path,
                                                                 speech_wav):
    """A delivery that levels the speech (its limiter keeps the peaks under the ceiling) takes it as it is; levels
    as spoken (ProRes HQ's profile, --loudness off) and plain outputs are lowered."""
    from ditto_fast.avatar import load_avatar
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.core.config import load_config
    from ditto_fast.engine.clip import check_clip
    from ditto_fast.engine.request import RenderRequest

    avatar = load_avatar("anchor", checkpoints=find_checkpoints(tiny_checkpoints))
    wav = _over_full_scale(tmp_path / "loud.wav", speech_wav, seconds=0.5)
    gains = {}
    for name, fields in (("web", {"delivery": "web-h264"}), ("off", {"delivery": "web-h264", "loudness": "off"}),
                         ("prores", {"delivery": "prores-hq-1080p"}), ("plain", {})):
        out = tmp_path / f"{name}{'.mov' if name == 'prores' else '.mp4'}"
        gains[name] = check_clip(RenderRequest("anchor", wav, out, **fields), avatar, load_config()).soundtrack.gain_db
    assert gains["web"] == 0 and gains["off"] < -10 and gains["prores"] < -10 and gains["plain"] < -10, gains
