"""Decode any audio file to 16 kHz mono float32, the way Ditto's librosa.load(path, sr=16000) does.

One path for every format: the imageio-ffmpeg binary decodes the file at its own sample rate
and channel count to 32-bit float PCM on a pipe; here the channels are averaged (librosa's
to_mono) and the signal is resampled to 16 kHz with soxr at "HQ" quality (librosa's default
``res_type="soxr_hq"``). Resampling streams chunk by chunk (bit-identical to soxr's one-shot
call), so memory stays at the 16 kHz output plus one chunk, even for hours of audio. The file's
channel count and layout (the speaker mask ffmpeg writes on the pipe) are kept for the output's
soundtrack (encoding/soundtrack.py). A caller may bound the length it takes (`max_seconds`): a file whose
header declares more is refused before anything is decoded, and one that declares nothing as soon as
that much has decoded, so a tiny file of hours of silence cannot fill the caller's memory; such a bounded decoding
writes into one buffer of that length, mapped at once but resident only as it is written, and given back whole to
the system when dropped (a refused file leaves nothing behind in the heap).
"""

from __future__ import annotations

import os
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import soxr

from ditto_fast.audio.declared import declared_seconds
from ditto_fast.core.errors import InputError
from ditto_fast.media.inputs import check_input_file, file_sha256
from ditto_fast.media.rates import MOTION_FPS, SPEECH_SAMPLE_RATE

AUDIO_FILE = "an audio file (wav, mp3, flac, m4a, ...)"    # what the fix of an audio error asks for
SAMPLES_PER_FRAME = SPEECH_SAMPLE_RATE // MOTION_FPS    # 640 speech samples a motion frame
RATE_RANGE = (4000, 1_000_000)   # source sample rates taken as audio (a header saying 1 Hz would mean hours)
MISSING_TOLERANCE_S = 0.040      # one video frame: a header may declare this much more than decodes
_READ_BYTES = 1 << 20


def frame_count(num_samples_16k: int) -> int:
    """Number of 25 fps video frames covering num_samples_16k samples: ceil(n / 640)."""
    if num_samples_16k < 0:
        raise ValueError(f"negative sample count {num_samples_16k}")
    return -(-int(num_samples_16k) // SAMPLES_PER_FRAME)


def _check_path(path: Path) -> None:
    check_input_file(path, AUDIO_FILE)


def _ffmpeg_failure(path: Path, stderr: str) -> InputError:
    text = stderr.strip()
    low = text.lower()
    if "matches no streams" in low or "does not contain any stream" in low:
        return InputError(f"{path}: has no audio stream (not an audio file?); give a file that contains audio")
    if "invalid data" in low or "could not find codec" in low or "unknown" in low or "decoder" in low:
        return InputError(f"{path}: cannot be decoded as audio (corrupt file or unsupported codec); "
                          "convert it to WAV or MP3")
    last = text.splitlines()[-1] if text else "ffmpeg failed"
    return InputError(f"{path}: cannot be decoded as audio ({last}); convert it to WAV or MP3")


def _read_exact(stream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def _read_wav_header(stream) -> tuple[int, int, int]:
    """Parse the RIFF/WAVE header ffmpeg writes on the pipe up to the data chunk -> (rate, channels, channel
    mask): the mask is WAVE_FORMAT_EXTENSIBLE's speaker bits of the layout ffmpeg reads in the file (0: none)."""
    head = _read_exact(stream, 12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise ValueError("no WAV header")
    rate = channels = mask = 0
    while True:
        chunk = _read_exact(stream, 8)
        if len(chunk) < 8:
            raise ValueError("WAV header ended before the data chunk")
        cid, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if cid == b"data":
            break
        body = _read_exact(stream, size + (size & 1))
        if cid == b"fmt ":
            channels, rate = struct.unpack("<HI", body[2:8])
            bits = struct.unpack("<H", body[14:16])[0]
            if bits != 32:
                raise ValueError(f"unexpected {bits}-bit PCM from ffmpeg")
            if struct.unpack("<H", body[:2])[0] == 0xFFFE and len(body) >= 24:
                mask = struct.unpack("<I", body[20:24])[0]
    if rate <= 0 or channels <= 0:
        raise ValueError("WAV header without a format chunk")
    return rate, channels, mask


def _check_complete(path: Path, held: float) -> None:
    """InputError when the file's header declares more audio than decoded (a copy cut short)."""
    declared = declared_seconds(path)
    if declared is not None and declared - held > MISSING_TOLERANCE_S:
        raise InputError(f"{path}: declares {declared:.2f} s of audio but holds {held:.2f} s (cut short in "
                         "transfer?); re-export or copy it again")


@dataclass(frozen=True)
class DecodedAudio:
    """A file's audio decoded once: 16 kHz mono float32 samples, the sha256 of the file's bytes, the file's
    channel count and layout (WAVE_FORMAT_EXTENSIBLE speaker mask; 0 for a layout it cannot name), and the largest
    sample magnitude of its own channels at its own rate (above 1.0: float audio over full scale)."""

    samples: np.ndarray                 # [n] float32 at 16 kHz
    sha256: str
    channels: int = 1
    channel_mask: int = 0
    peak: float = 0.0

    @property
    def seconds(self) -> float:
        return len(self.samples) / SPEECH_SAMPLE_RATE


def decode_audio(path: str | os.PathLike, max_seconds: float | None = None) -> DecodedAudio:
    """Decode an audio file (see load_audio) and fingerprint its bytes, for a render that reads it once; with
    `max_seconds`, InputError for a file that lasts longer, before more than that is decoded."""
    path = Path(path)
    samples, channels, mask, peak = _decode(path, max_seconds)
    return DecodedAudio(samples, file_sha256(path), channels, mask, peak)


def _too_long(path: Path, seconds: float | None, max_seconds: float) -> InputError:
    lasts = f"lasts {_minutes(seconds)}" if seconds is not None else f"lasts more than {_minutes(max_seconds)}"
    return InputError(f"{path}: {lasts} of audio, over the {_minutes(max_seconds)} one clip may last here; split "
                      "it into shorter clips")


def _minutes(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def load_audio(path: str | os.PathLike) -> np.ndarray:
    """Decode an audio file (any format ffmpeg reads, any rate/channels) to 16 kHz mono float32 [n]."""
    return _decode(Path(path))[0]


def audio_layout(path: str | os.PathLike) -> tuple[int, int]:
    """(channels, channel mask) of the file's first audio stream as ffmpeg decodes it, from the header alone."""
    path = Path(path)
    _check_path(path)
    proc = subprocess.Popen(_decode_command(path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        _rate, channels, mask = _read_wav_header(proc.stdout)
    except ValueError:
        proc.kill()
        raise _ffmpeg_failure(path, proc.communicate()[1].decode("utf-8", "replace")) from None
    proc.kill()
    proc.communicate()
    return channels, mask


def _decode_command(path: Path) -> list[str]:
    """ffmpeg decoding the file's first audio stream to 32-bit float WAV on stdout."""
    return [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-hide_banner", "-v", "error",
            "-i", f"file:{path.resolve()}", "-map", "0:a:0", "-vn", "-sn", "-dn",
            "-c:a", "pcm_f32le", "-f", "wav", "-"]


class _Output:
    """The 16 kHz samples as they come: with a bound (`capacity` samples), written into one buffer of that size
    (one mapping: its pages resident only once written, all of it given back when dropped, and the samples never
    copied again); without one, kept as chunks joined at the end."""

    def __init__(self, capacity: int | None):
        self.buffer = None if capacity is None else np.empty(capacity, np.float32)
        self.parts: list[np.ndarray] = []
        self.size = 0

    def add(self, chunk: np.ndarray) -> None:
        if self.buffer is not None and self.size + chunk.size <= self.buffer.size:
            self.buffer[self.size:self.size + chunk.size] = chunk
        else:
            if self.buffer is not None:             # past the bound after all: go on in chunks
                self.parts, self.buffer = [self.buffer[:self.size].copy()], None
            self.parts.append(chunk)
        self.size += chunk.size

    def samples(self, n: int | None = None) -> np.ndarray:
        """The first `n` samples (default: all of them), zeros after the last one written."""
        n = self.size if n is None else n
        if self.buffer is not None:
            if n <= self.buffer.size:
                self.buffer[self.size:n] = 0.0
                return self.buffer[:n]
            self.parts, self.buffer = [self.buffer[:self.size]], None
        audio = np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)
        return audio[:n] if audio.size >= n else np.pad(audio, (0, n - audio.size))


def _capacity(max_seconds: float | None) -> int | None:
    """The samples a decoding bounded to `max_seconds` may hold (one second over, for the resampler's tail)."""
    if max_seconds is None or not np.isfinite(max_seconds):
        return None
    return int(np.ceil(max_seconds * SPEECH_SAMPLE_RATE)) + SPEECH_SAMPLE_RATE


def _decode(path: Path, max_seconds: float | None = None) -> tuple[np.ndarray, int, int, float]:
    """The file's audio as 16 kHz mono float32 [n], its channel count, its channel mask and its sample peak (the
    largest magnitude in any channel, as decoded); InputError past `max_seconds` (its header's length looked at
    first, the decoded length counted as it comes). A refusal carries no frame of the decoding: whoever keeps the
    error (a server's worker, a log) does not keep the samples decoded until then with it."""
    try:
        return _decode_samples(path, max_seconds)
    except InputError as e:
        raise e.with_traceback(None) from e.__cause__


def _decode_samples(path: Path, max_seconds: float | None) -> tuple[np.ndarray, int, int, float]:
    _check_path(path)
    if max_seconds is not None:
        declared = declared_seconds(path)
        if declared is not None and declared > max_seconds:
            raise _too_long(path, declared, max_seconds)
    cmd = _decode_command(path)
    errlog = tempfile.TemporaryFile()  # a file, not a pipe: a chatty ffmpeg cannot block on stderr
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errlog)
    output = _Output(_capacity(max_seconds))
    peak = 0.0
    try:
        try:
            rate, channels, mask = _read_wav_header(proc.stdout)
        except ValueError:
            rate = channels = mask = 0
        if rate and not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
            raise InputError(f"{path}: states a sample rate of {rate} Hz, not one of a speech recording "
                             f"({RATE_RANGE[0]}..{RATE_RANGE[1]} Hz); re-export the audio as WAV or MP3")
        if rate:
            resampler = soxr.ResampleStream(rate, SPEECH_SAMPLE_RATE, 1, dtype="float32", quality="HQ")
            frame_bytes = 4 * channels
            rest = b""
            n_in = 0
            while True:
                data = proc.stdout.read(_READ_BYTES)
                last = not data
                data = rest + data
                usable = len(data) - len(data) % frame_bytes
                rest = data[usable:]
                block = np.frombuffer(data[:usable], dtype="<f4").reshape(-1, channels)  # [t, C]
                if block.size:
                    peak = max(peak, float(np.abs(block).max()))
                mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
                n_in += mono.shape[0]
                if max_seconds is not None and n_in > max_seconds * rate:
                    proc.kill()
                    raise _too_long(path, None, max_seconds)
                out = resampler.resample_chunk(np.ascontiguousarray(mono), last=last)
                if out.size:
                    output.add(out)
                if last:
                    break
    finally:
        proc.stdout.close()
        rc = proc.wait()
        errlog.seek(0)
        stderr = errlog.read()[-20000:].decode("utf-8", "replace")
        errlog.close()
    if rc != 0 or not rate:
        raise _ffmpeg_failure(path, stderr)
    _check_complete(path, n_in / rate)
    # librosa.resample fixes the length to ceil(n_in * 16000 / rate): the tail trimmed or zero-padded
    n_out = -(-n_in * SPEECH_SAMPLE_RATE // rate) if rate != SPEECH_SAMPLE_RATE else None
    audio = output.samples(n_out)          # [n] float32 at 16 kHz
    if audio.size == 0:
        raise InputError(f"{path}: contains no audio samples; give a file with sound in it")
    if not np.isfinite(audio).all():
        raise InputError(f"{path}: contains NaN or infinite samples; re-export the audio as normal PCM")
    if audio.size < SAMPLES_PER_FRAME:
        ms = 1000.0 * audio.size / SPEECH_SAMPLE_RATE
        raise InputError(f"{path}: audio is too short ({ms:.1f} ms); give at least 40 ms (one video frame)")
    return audio, channels, mask, peak


__all__ = ["SAMPLES_PER_FRAME", "DecodedAudio", "audio_layout", "decode_audio",
           "file_sha256", "frame_count", "load_audio"]
