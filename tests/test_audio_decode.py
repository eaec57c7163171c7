"""Audio decoding: every format to 16 kHz mono float32, same numbers as librosa.load, clear errors.

librosa's numbers are recorded in tests/data/librosa_load.npz (`python tests/test_audio_decode.py --record`, with
librosa installed): installed beside transformers, librosa's scikit-learn is imported by every process that loads
HuBERT (about 0.6 s each), so the test stacks leave it out."""

from __future__ import annotations

import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from ditto_fast.audio.declared import declared_seconds
from ditto_fast.audio.decode import frame_count, load_audio
from ditto_fast.core.errors import InputError

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
LIBROSA_LOAD = Path(__file__).parent / "data" / "librosa_load.npz"     # librosa.load(path, sr=16000) of each WAV
WAVS = [(16000, 1, "PCM_16"), (44100, 2, "PCM_24"), (22050, 1, "FLOAT"), (8000, 1, "PCM_U8"), (48000, 6, "PCM_16")]


def audio_duration(path: Path) -> float:
    """Duration in seconds as ffmpeg reports it from the container (no full decode)."""
    res = subprocess.run([FFMPEG, "-nostdin", "-hide_banner", "-i", f"file:{path.resolve()}"], capture_output=True)
    h, m, s = re.search(r"Duration:\s*(\d+):(\d+):(\d+(?:\.\d+)?)", res.stderr.decode("utf-8", "replace")).groups()
    return int(h) * 3600 + int(m) * 60 + float(s)


def sine(freq: float, rate: int, seconds: float, channels: int = 1, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    x = (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def ffmpeg_sine(path: Path, rate: int, channels: int, seconds: float, *codec: str) -> Path:
    """A 440 Hz sine of amplitude 0.5 in every channel, encoded by ffmpeg with codec."""
    src = path.with_suffix(".src.wav")
    sf.write(src, sine(440, rate, seconds, channels), rate, subtype="FLOAT")
    subprocess.run([FFMPEG, "-v", "error", "-y", "-i", str(src), *codec, str(path)], check=True)
    return path


def peak_hz(x: np.ndarray, rate: int = 16000) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * rate / len(x))


def expected_len(n: int, rate: int) -> int:
    return math.ceil(n * 16000 / rate)


def reference_wav(folder: Path, rate: int, channels: int, subtype: str) -> Path:
    """0.3 s of the 440 Hz sine as that WAV: the file librosa's recorded numbers were made from."""
    path = folder / f"ref_{rate}_{channels}_{subtype}.wav"
    sf.write(path, sine(440, rate, 0.3, channels), rate, subtype=subtype)
    return path


@pytest.mark.parametrize("rate,channels,subtype", WAVS)
def test_wav_variants(tmp_path, rate, channels, subtype):
    x = sine(440, rate, 1.5, channels)
    path = tmp_path / f"s_{rate}_{channels}_{subtype}.wav"
    sf.write(path, x, rate, subtype=subtype)
    a = load_audio(path)
    assert a.dtype == np.float32 and a.ndim == 1
    assert a.shape[0] == expected_len(x.shape[0], rate)
    assert abs(peak_hz(a) - 440) < 2
    tol = 0.02 if subtype == "PCM_U8" else 2e-3
    core = slice(800, -800)  # resampler edges aside, the sine keeps its amplitude
    assert abs(np.abs(a[core]).max() - 0.5) < 0.5 * tol + 5e-3


def test_the_same_numbers_as_librosa_load(tmp_path):
    """What Ditto's inference.py does (librosa.load(path, sr=16000)), sample for sample, for each WAV."""
    recorded = np.load(LIBROSA_LOAD)
    for rate, channels, subtype in WAVS:
        a, ref = load_audio(reference_wav(tmp_path, rate, channels, subtype)), recorded[f"{rate}-{channels}-{subtype}"]
        assert a.shape == ref.shape, (rate, channels, subtype)
        np.testing.assert_allclose(a, ref, atol=1e-5, err_msg=f"{rate} Hz, {channels} ch, {subtype}")


def test_wav_16k_mono_is_bit_exact(tmp_path):
    x = (np.random.default_rng(1).standard_normal(16000 * 2) * 3000).astype(np.int16)
    path = tmp_path / "pcm16.wav"
    sf.write(path, x, 16000, subtype="PCM_16")
    np.testing.assert_array_equal(load_audio(path), x.astype(np.float32) / 32768)


def test_stereo_is_channel_mean(tmp_path):
    rate = 16000
    left, right = sine(440, rate, 1.0), sine(1000, rate, 1.0, amp=0.25)
    path = tmp_path / "lr.wav"
    sf.write(path, np.stack([left, right], 1), rate, subtype="FLOAT")
    np.testing.assert_allclose(load_audio(path), (left + right) / 2, atol=1e-7)


@pytest.mark.parametrize("ext,rate,channels,codec", [
    ("mp3", 44100, 2, ("-c:a", "libmp3lame", "-b:a", "128k")),
    ("flac", 48000, 1, ("-c:a", "flac")),
    ("m4a", 44100, 2, ("-c:a", "aac", "-b:a", "128k")),
    ("ogg", 24000, 1, ("-c:a", "libvorbis")),
])
def test_compressed_formats(tmp_path, ext, rate, channels, codec):
    path = ffmpeg_sine(tmp_path / f"s.{ext}", rate, channels, 2.0, *codec)
    a = load_audio(path)
    assert a.dtype == np.float32 and a.ndim == 1
    assert abs(a.shape[0] - 32000) <= 8, a.shape
    assert abs(peak_hz(a) - 440) < 2
    assert abs(np.abs(a[2000:-2000]).max() - 0.5) < 0.03


def test_odd_file_names(tmp_path):
    path = tmp_path / "-news: take 2 (é).wav"
    sf.write(path, sine(440, 16000, 0.5), 16000)
    assert load_audio(path).shape == (8000,)
    assert abs(audio_duration(path) - 0.5) < 0.01


def test_silence_is_fine(tmp_path):
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros(16000, np.float32), 44100)
    a = load_audio(path)
    assert a.shape[0] == expected_len(16000, 44100) and not a.any()


def test_one_frame_is_enough(tmp_path):
    path = tmp_path / "one.wav"
    sf.write(path, sine(440, 16000, 0.04), 16000)
    assert load_audio(path).shape == (640,)


def test_frame_count():
    assert [frame_count(n) for n in (0, 1, 639, 640, 641, 1280, 16000, 16001)] == [0, 1, 1, 1, 2, 2, 25, 26]
    for n in range(0, 200000, 641):
        assert frame_count(n) == math.ceil(n / 640)


def test_audio_duration(tmp_path):
    path = tmp_path / "d.wav"
    sf.write(path, np.zeros(44100 * 3, np.float32), 44100)
    assert abs(audio_duration(path) - 3.0) < 0.02


# ---------------------------------------------------------------- bad input


def _wav_bytes(tag: int, data: bytes) -> bytes:
    fmt = struct.pack("<HHIIHH", tag, 1, 16000, 32000, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)


def _bad(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"bad_{kind}.wav"
    if kind == "missing":
        return tmp_path / "nope.wav"
    if kind == "directory":
        (tmp_path / "adir").mkdir()
        return tmp_path / "adir"
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "corrupt":
        p.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    elif kind == "text":
        p = tmp_path / "notes.txt"
        p.write_text("this is not audio\n" * 50)
    elif kind == "codec":
        p.write_bytes(_wav_bytes(0x9999, b"\x01\x02" * 4000))
    elif kind == "no_audio_stream":
        p = tmp_path / "image.png"
        subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "lavfi", "-i", "color=c=red:s=32x32",
                        "-frames:v", "1", str(p)], check=True)
    elif kind == "video_only":
        p = tmp_path / "video.mp4"
        subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "lavfi", "-i", "color=c=red:s=32x32",
                        "-t", "0.5", "-c:v", "mpeg4", str(p)], check=True)
    elif kind == "zero_samples":
        sf.write(p, np.zeros(0, np.float32), 16000)
    elif kind == "too_short":
        sf.write(p, sine(440, 16000, 0.03), 16000)  # 480 samples < 640
    elif kind == "too_short_resampled":
        sf.write(p, sine(440, 44100, 0.035), 44100)  # 1544 samples -> 561 at 16 kHz
    elif kind == "nan":
        x = sine(440, 16000, 0.5)
        x[100] = np.nan
        sf.write(p, x, 16000, subtype="FLOAT")
    elif kind == "inf":
        x = sine(440, 16000, 0.5)
        x[-3] = -np.inf
        sf.write(p, x, 16000, subtype="FLOAT")
    else:
        raise AssertionError(kind)
    return p


@pytest.mark.parametrize("kind,words", [
    ("missing", "not found"),
    ("directory", "directory"),
    ("empty", "empty"),
    ("corrupt", "cannot be decoded"),
    ("text", "no audio stream"),  # ffmpeg reads text as a (video) tty stream
    ("codec", "cannot be decoded"),
    ("no_audio_stream", "no audio stream"),
    ("video_only", "no audio stream"),
    ("zero_samples", "no audio samples"),
    ("too_short", "too short"),
    ("too_short_resampled", "too short"),
    ("nan", "NaN"),
    ("inf", "NaN or infinite"),
])
def test_bad_input(tmp_path, kind, words):
    path = _bad(tmp_path, kind)
    with pytest.raises(InputError) as info:
        load_audio(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert words in msg


@pytest.mark.parametrize("rate", [1, 100, 3999, 2_000_000])
def test_a_header_stating_an_absurd_sample_rate_is_refused(tmp_path, rate):
    """1.6 s of samples said to be at 1 Hz would be hours of audio (and a render that never ends)."""
    path = tmp_path / "odd.wav"
    sf.write(path, np.zeros(25600, np.float32), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:28] = struct.pack("<I", rate)               # the fmt chunk's sample rate
    data[28:32] = struct.pack("<I", rate * 2)           # and its byte rate, to match
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"states a sample rate of {rate} Hz") as e:
        load_audio(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


# ---------------------------------------------------------------- files cut short


def cut_short(path: Path, keep: float) -> Path:
    """`path` with only the first `keep` of its bytes (a copy that stopped part way), written beside it."""
    data = path.read_bytes()
    cut = path.with_name(f"cut_{path.name}")
    cut.write_bytes(data[:int(len(data) * keep)])
    return cut


def ten_seconds(tmp_path: Path, ext: str, **kw) -> Path:
    """10 s of a 440 Hz sine at 16 kHz, written by libsndfile as `ext`."""
    path = tmp_path / f"ten.{ext}"
    sf.write(path, sine(440, 16000, 10.0), 16000, **kw)
    return path


@pytest.mark.parametrize("ext,kw", [("wav", {"subtype": "PCM_16"}), ("wav", {"subtype": "FLOAT"}),
                                    ("aiff", {"subtype": "PCM_16"}), ("flac", {})])
def test_a_file_cut_short_is_refused_with_both_lengths(tmp_path, ext, kw):
    path = cut_short(ten_seconds(tmp_path, ext, **kw), 0.03)
    with pytest.raises(InputError, match=r"declares 10\.00 s of audio but holds 0\.[23]\d s \(cut short") as e:
        load_audio(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("ext,kw", [("wav", {"subtype": "PCM_24"}), ("aiff", {"subtype": "PCM_16"}), ("flac", {})])
def test_a_complete_file_declares_what_it_holds(tmp_path, ext, kw):
    path = ten_seconds(tmp_path, ext, **kw)
    assert declared_seconds(path) == 10.0
    assert len(load_audio(path)) == 160000


@pytest.mark.parametrize("name,codec", [
    ("rf64.wav", ["-rf64", "always"]),                       # the length in the ds64 chunk
    ("ext.wav", ["-ac", "6", "-c:a", "pcm_s24le"]),          # WAVE_FORMAT_EXTENSIBLE
    ("float.aifc", ["-c:a", "pcm_f32be", "-f", "aiff"]),
    ("mulaw.wav", ["-c:a", "pcm_mulaw"]),
])
def test_declared_lengths_of_other_layouts(tmp_path, name, codec):
    path = ffmpeg_sine(tmp_path / name, 22050, 2, 1.5, *codec)
    assert abs(declared_seconds(path) - 1.5) < 1e-6
    load_audio(path)
    with pytest.raises(InputError, match=r"declares 1\.50 s"):
        load_audio(cut_short(path, 0.5))


def test_headers_without_a_length_are_not_judged(tmp_path):
    """A streaming writer's 0xFFFFFFFF data size, compressed WAV data, MP3: no declared length, decoded as before."""
    src = ffmpeg_sine(tmp_path / "s.wav", 16000, 1, 2.0, "-c:a", "pcm_s16le")
    piped = tmp_path / "piped.wav"
    piped.write_bytes(subprocess.run([FFMPEG, "-v", "error", "-i", str(src), "-f", "wav", "-"],
                                     capture_output=True, check=True).stdout)
    adpcm = ffmpeg_sine(tmp_path / "adpcm.wav", 16000, 1, 2.0, "-c:a", "adpcm_ima_wav")
    mp3 = ffmpeg_sine(tmp_path / "m.mp3", 16000, 1, 2.0)
    for path in (piped, adpcm, mp3):
        assert declared_seconds(path) is None, path
        assert len(load_audio(path)) >= 31000
    assert len(load_audio(cut_short(piped, 0.5))) < 17000      # nothing declared: what is there is the clip


def test_up_to_one_frame_missing_is_accepted(tmp_path):
    """A header that declares at most 40 ms more than the data holds (an exporter rounding its last block) passes;
    more is refused."""
    path = tmp_path / "round.wav"
    sf.write(path, sine(440, 16000, 1.0), 16000, subtype="PCM_16")
    data = path.read_bytes()
    for missing_ms, ok in ((39, True), (41, False)):
        short = tmp_path / f"short{missing_ms}.wav"
        short.write_bytes(data[:len(data) - missing_ms * 32])     # 16 samples x 2 bytes a ms
        if ok:
            assert len(load_audio(short)) == 16000 - missing_ms * 16
        else:
            with pytest.raises(InputError, match="declares 1.00 s of audio but holds 0.96 s"):
                load_audio(short)


def test_an_id3_tag_before_a_flac_stream_is_passed_over(tmp_path):
    path = ten_seconds(tmp_path, "flac")
    tagged = tmp_path / "tagged.flac"
    tagged.write_bytes(b"ID3\x04\x00\x00\x00\x00\x00\x0a" + b"\x00" * 10 + path.read_bytes())
    assert declared_seconds(tagged) == 10.0
    assert declared_seconds(cut_short(tagged, 0.1)) == 10.0


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    import librosa

    with tempfile.TemporaryDirectory() as folder:
        loaded = {f"{r}-{c}-{s}": librosa.load(reference_wav(Path(folder), r, c, s), sr=16000)[0] for r, c, s in WAVS}
        np.savez_compressed(LIBROSA_LOAD, **loaded)
    print(f"recorded {LIBROSA_LOAD}")
