"""What a stream of speech bytes holds, told from its first bytes: raw s16le PCM, a WAV (its header read here and its
PCM taken as it comes, header after header where a TTS writes one file per answer), another container ffmpeg decodes
(MP3, AAC, FLAC, Ogg, MPEG-TS, MP4, Matroska, ...), or bytes that are none of these (random data, another sample
format), which would play as full-scale noise. Light to import (the command's help names the containers): numpy and
ffmpeg are imported where they are used."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

SNIFF_BYTES = 4096          # the first bytes looked at (an eighth of a second of 16 kHz s16le)
SNIFF_WAIT_S = 0.25         # or what came this long after the first byte, if less
WAV_HEADER_MAX = 1 << 16    # a WAV header longer than this (a huge LIST chunk) is left to ffmpeg
CONTAINERS = ("WAV", "MP3", "AAC (ADTS)", "FLAC", "Ogg", "MPEG-TS", "MP4/M4A", "Matroska/WebM", "AIFF", "CAF", "AU",
              "AMR", "FLV")
# a prefix at a given offset -> the container it starts
MAGIC = ((0, b"ID3", "MP3"), (0, b"fLaC", "FLAC"), (0, b"OggS", "Ogg"), (4, b"ftyp", "MP4/M4A"),
         (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM"), (0, b"caff", "CAF"), (0, b".snd", "AU"), (0, b"#!AMR", "AMR"),
         (0, b"FLV\x01", "FLV"))
_HEADER = re.compile(rb"(?:RIFF|RF64)....WAVE", re.S)      # a WAV's first 12 bytes
NOISE_RMS = 0.2             # raw PCM this loud (of full scale) ...
NOISE_CORRELATION = 0.5     # ... whose neighbouring samples are this little alike is noise, not speech
READ_BYTES = 1 << 16
# ffmpeg's output: s16le 16 kHz mono, each packet flushed at once (ffmpeg's automatic rule does so for a pipe today)
DECODE = ["-vn", "-sn", "-dn", "-ac", "1", "-ar", str(SPEECH_SAMPLE_RATE), "-f", "s16le", "-flush_packets", "1",
          "pipe:1"]
# a live input: a short probe (64 KiB / 0.3 s finds an audio stream's parameters) so that speech starts at once; not
# -fflags nobuffer, which drops the packets read while probing (the first words)
LIVE_PROBE = ["-probesize", "65536", "-analyzeduration", "300000"]


@dataclass(frozen=True)
class Sniffed:
    """What the first bytes say: `kind` "raw" (s16le 16 kHz mono as it is), "wav" (a WAV read here), "container"
    (another container, or a WAV that is not 16-bit PCM: ffmpeg decodes it) or "noise" (none of these); `name` the
    container's name, for messages."""

    kind: str
    name: str = ""


def sniff(head: bytes, raw: bool = True) -> Sniffed:
    """What `head` (the first bytes of a stream, up to SNIFF_BYTES) starts; `raw`: whether raw PCM may come (stdin, a
    named pipe), else whatever is not a WAV is ffmpeg's to read (a URL's bytes)."""
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return Sniffed("wav", "WAV")
    if not raw:
        return Sniffed("container", "")
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return Sniffed("container", "AIFF")
    for offset, magic, name in MAGIC:
        if head[offset:offset + len(magic)] == magic:
            return Sniffed("container", name)
    if len(head) >= 377 and head[0] == head[188] == head[376] == 0x47:
        return Sniffed("container", "MPEG-TS")
    for name, length in (("MP3", _mpeg_audio_frame), ("AAC (ADTS)", _adts_frame)):
        first = length(head, 0)
        if first and length(head, first):
            return Sniffed("container", name)
    return Sniffed("noise") if is_noise(head) else Sniffed("raw")


def s16le(data: bytes):
    """The whole s16le samples of `data` as float32 in [-1, 1) (numpy), and the odd byte left over (the first half of
    the next read's first sample)."""
    import numpy as np

    cut = len(data) & ~1
    return np.frombuffer(data[:cut], "<i2").astype(np.float32) / 32768.0, data[cut:]


def is_noise(pcm: bytes) -> bool:
    """Whether s16le bytes sound like noise rather than speech: loud, and each sample unlike the one before (random
    bytes, big-endian or float samples, a compressed stream read as PCM)."""
    import numpy as np

    x = np.frombuffer(pcm[:len(pcm) // 2 * 2], "<i2").astype(np.float64) / 32768.0
    if len(x) < 256:
        return False
    d = x - x.mean()
    power = float((d * d).sum())
    if np.sqrt(np.mean(x * x)) < NOISE_RMS or power == 0:
        return False
    return float((d[:-1] * d[1:]).sum()) / power < NOISE_CORRELATION


# MPEG audio (MP1/2/3): kbit/s by (MPEG-1?, layer) and index 1..14; sample rates by version
_BITRATES = {(True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
             (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
             (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
             (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mpeg_audio_frame(data: bytes, at: int) -> int:
    """The length of the MPEG audio frame whose header is at `at` (0: no valid header there)."""
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return 0
    version, layer = (data[at + 1] >> 3) & 3, 4 - ((data[at + 1] >> 1) & 3)
    index, rate_index, pad = data[at + 2] >> 4, (data[at + 2] >> 2) & 3, (data[at + 2] >> 1) & 1
    if version == 1 or layer == 4 or index in (0, 15) or rate_index == 3:
        return 0
    mpeg1 = version == 3
    kbps = _BITRATES[mpeg1, min(layer, 2) if not mpeg1 else layer][index - 1]
    rate = _RATES[version][rate_index]
    if layer == 1:
        return (12 * kbps * 1000 // rate + pad) * 4
    return (144 if mpeg1 or layer == 2 else 72) * kbps * 1000 // rate + pad


def _adts_frame(data: bytes, at: int) -> int:
    """The length of the ADTS (AAC) frame whose header is at `at` (0: no valid header there)."""
    if at + 7 > len(data) or data[at] != 0xFF or data[at + 1] & 0xF6 != 0xF0 or (data[at + 2] >> 2) & 15 > 12:
        return 0
    length = ((data[at + 3] & 3) << 11) | (data[at + 4] << 3) | (data[at + 5] >> 5)
    return length if length >= 7 else 0


@dataclass(frozen=True)
class WavFormat:
    """A WAV's 'fmt ' chunk: its format tag (1 PCM, 0xFFFE extensible: the sub-format's), channels, sample rate and
    bits per sample."""

    tag: int
    channels: int
    rate: int
    bits: int

    @property
    def pcm16(self) -> bool:
        """16-bit integer PCM: taken here, as it comes (else ffmpeg decodes the stream)."""
        return self.tag == 1 and self.bits == 16 and self.channels >= 1 and self.rate > 0

    def __str__(self) -> str:
        return f"format tag {self.tag:#x}, {self.bits}-bit, {self.channels} channel(s) at {self.rate} Hz"


class WavStream:
    """A WAV read as its bytes come: `feed(data)` returns the events they complete, in order: ("format", WavFormat) at
    each header, ("pcm", bytes) for the samples, ("end", None) where a file's data ends (a 'data' size of 0 or
    0xFFFFFFFF, as a writer that streams gives, runs to the end of the stream). Chunks after the data are skipped,
    and a new RIFF header starts the next file (a TTS writing one WAV per answer)."""

    def __init__(self) -> None:
        self._buf = b""
        self._need = "riff"         # riff: 12 bytes; chunk: an 8-byte chunk header; skip / data: `_left` bytes
        self._left: int | None = 0  # bytes left of the chunk skipped or the data (None: to the end of the stream)
        self._format: WavFormat | None = None
        self._header = 0            # bytes of the first file's header read (more than WAV_HEADER_MAX: refused)
        self._started = False       # the first file's data has begun

    def finish(self) -> bytes:
        """The end of the stream: the samples held back in case they began a header."""
        rest, self._buf = (self._buf, b"") if self._need == "data" else (b"", self._buf)
        return rest

    def _drop(self, n: int) -> None:
        self._buf = self._buf[n:]
        if not self._started:
            self._header += n
            if self._header > WAV_HEADER_MAX:
                raise ValueError(f"the WAV header is longer than {WAV_HEADER_MAX} bytes")

    def feed(self, data: bytes) -> list[tuple[str, object]]:
        events: list[tuple[str, object]] = []
        self._buf += data
        while True:
            if self._need == "data" and self._left is None:     # to the end of the stream or the next file
                found = _HEADER.search(self._buf)
                if found is None:               # all but what may be the start of a header cut by the read
                    tail = self._buf.find(b"R", max(0, len(self._buf) - 11))
                    upto = len(self._buf) if tail < 0 else tail
                    if upto:
                        events.append(("pcm", self._buf[:upto]))
                    self._drop(upto)
                    return events
                if found.start():
                    events.append(("pcm", self._buf[:found.start()]))
                self._drop(found.start())
                events.append(("end", None))
                self._need = "riff"
                continue
            if self._need in ("data", "skip"):
                take = len(self._buf) if self._left is None else min(self._left, len(self._buf))
                if self._need == "data" and take:
                    events.append(("pcm", self._buf[:take]))
                self._drop(take)
                if self._left is None:
                    return events
                self._left -= take
                if self._left:
                    return events
                if self._need == "data":
                    events.append(("end", None))
                self._need = "chunk"
            elif self._need == "riff":
                if len(self._buf) < 12:
                    return events
                if self._buf[:4] not in (b"RIFF", b"RF64") or self._buf[8:12] != b"WAVE":
                    raise ValueError("a WAV header was expected")
                self._drop(12)
                self._need = "chunk"
            else:
                if self._buf[:4] in (b"RIFF", b"RF64"):         # the next file
                    self._need = "riff"
                    continue
                if len(self._buf) < 8:
                    return events
                name, size = self._buf[:4], struct.unpack("<I", self._buf[4:8])[0]
                if name == b"fmt ":
                    if len(self._buf) < 8 + size:
                        if self._header + 8 + size > WAV_HEADER_MAX:
                            raise ValueError(f"the WAV header is longer than {WAV_HEADER_MAX} bytes")
                        return events
                    self._format = _wav_format(self._buf[8:8 + size])
                    events.append(("format", self._format))
                    self._need, self._left = "skip", size + (size & 1)
                elif name == b"data":
                    if self._format is None:
                        raise ValueError("the WAV has no 'fmt ' chunk before its data")
                    self._need, self._left = "data", None if size in (0, 0xFFFFFFFF) else size
                else:
                    self._need, self._left = "skip", size + (size & 1)
                self._drop(8)
                if self._need == "data":
                    self._started = True


def _wav_format(chunk: bytes) -> WavFormat:
    """The 'fmt ' chunk's fields (an extensible format's sub-format as its tag)."""
    if len(chunk) < 16:
        raise ValueError("the WAV's 'fmt ' chunk is cut short")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", chunk[:16])
    if tag == 0xFFFE and len(chunk) >= 26:
        tag = struct.unpack("<H", chunk[24:26])[0]
    return WavFormat(tag, channels, rate, bits)


class SpeechBytes:
    """Bytes of speech in (`feed`), 16 kHz mono float32 samples out (`deliver`), by what their first bytes say: raw
    s16le PCM as it is (where `raw` allows it), a 16-bit PCM WAV resampled here as it comes, anything else decoded by
    an ffmpeg reading them on a pipe; noise is refused (`error`). With `decode` False, a container is not decoded
    here: `handover` then holds the bytes read so far, for the caller to read the stream another way. `end()` ends
    one stream of bytes (a writer's, on a named pipe); the next `feed` is sniffed anew."""

    def __init__(self, name: str, deliver: Callable[[Any], None], *, raw: bool = True, decode: bool = True):
        self.name, self._deliver, self._raw, self._decode = name, deliver, raw, decode
        self.error: str | None = None
        self.handover: bytes | None = None
        self._mode = "sniff"                # sniff, pcm, wav, decoder, done
        self._head = bytearray()
        self._head_at = 0.0
        self._half = b""                    # an odd byte of raw PCM: the first half of the next sample
        self._wav: WavStream | None = None
        self._held: bytearray | None = None     # a WAV's bytes until its format is known (ffmpeg's, if not 16-bit)
        self._resampler = None
        self._decoder: subprocess.Popen | None = None
        self._decoder_err = None
        self._decoded: threading.Thread | None = None

    @property
    def done(self) -> bool:
        """Nothing more is taken (refused, failed or handed over)."""
        return self._mode == "done"

    def feed(self, data: bytes, now: float) -> None:
        if self._mode == "sniff":
            if not self._head:
                self._head_at = now
            self._head += data
            if len(self._head) >= SNIFF_BYTES:
                self._decide()
        elif self._mode == "pcm":
            self._pcm(data)
        elif self._mode == "wav":
            self._wav_bytes(data)
        elif self._mode == "decoder":
            self._to_decoder(data)

    def tick(self, now: float) -> None:
        """No bytes came lately: decide on the first bytes if they have waited SNIFF_WAIT_S."""
        if self._mode == "sniff" and self._head and now - self._head_at >= SNIFF_WAIT_S:
            self._decide()

    def end(self) -> None:
        """The end of one stream of bytes: decide on what came, give the resampler's or the decoder's last samples."""
        if self._mode == "sniff" and self._head:
            self._decide()
        if self._mode == "wav" and self._resampler is not None:
            self._deliver(self._resampler(self._wav.finish()))
            self._deliver(self._resampler.flush())
        if self._decoder is not None:
            self._close_decoder(wait=True)
        if self._mode != "done":
            self._mode, self._half, self._wav, self._held, self._resampler = "sniff", b"", None, None, None

    def close(self) -> None:
        """Stop a decoder at once (idempotent)."""
        if self._decoder is not None:
            self._close_decoder(wait=False)

    # -- what the first bytes say
    def _decide(self) -> None:
        head, self._head = bytes(self._head), bytearray()
        found = sniff(head, raw=self._raw)
        if found.kind == "noise":
            self.error = (f"{self.name}: the first bytes are neither s16le 16 kHz mono speech (they would play as "
                          f"full-scale noise) nor a container ffmpeg decodes ({', '.join(CONTAINERS)}); send one "
                          "of those")
            self._mode = "done"
        elif found.kind == "raw":
            self._mode = "pcm"
            self._pcm(head)
        elif found.kind == "wav":
            self._mode, self._wav, self._held = "wav", WavStream(), bytearray()
            self._wav_bytes(head)
        else:
            self._container(head)

    def _container(self, head: bytes) -> None:
        import imageio_ffmpeg

        from ditto_fast.media.ffpipe import own_session

        if not self._decode:
            self.handover, self._mode = head, "done"
            return
        self._decoder_err = tempfile.TemporaryFile()
        cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *LIVE_PROBE,
               "-i", "pipe:0", *DECODE]
        self._decoder = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._decoder_err, start_new_session=own_session(), bufsize=0)
        self._decoded = threading.Thread(target=self._read_decoded, name=f"decoded {self.name}", daemon=True)
        self._decoded.start()
        self._mode = "decoder"
        self._to_decoder(head)

    # -- the three ways
    def _pcm(self, data: bytes) -> None:
        samples, self._half = s16le(self._half + data)
        self._deliver(samples)

    def _wav_bytes(self, data: bytes) -> None:
        from ditto_fast.audio.resample import Resampler

        if self._held is not None:
            self._held += data
        try:
            events = self._wav.feed(data)
        except ValueError as e:
            if self._held is not None:                  # a header not read here: ffmpeg's to read
                held, self._held = bytes(self._held), None
                self._container(held)
            else:
                self.error, self._mode = f"{self.name}: {e}", "done"
            return
        for kind, value in events:
            if kind == "format":
                if not value.pcm16:
                    if self._held is not None:          # the first file: ffmpeg decodes the whole stream
                        held, self._held = bytes(self._held), None
                        self._container(held)
                    else:
                        self.error, self._mode = (f"{self.name}: a later WAV is {value}, the first was 16-bit PCM; "
                                                  "send one format"), "done"
                    return
                self._held = None
                if self._resampler is not None:
                    self._deliver(self._resampler.flush())
                self._resampler = Resampler(value.rate, value.channels)
            elif kind == "pcm":
                self._deliver(self._resampler(value))
            else:
                self._deliver(self._resampler.flush())

    def _to_decoder(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._decoder.stdin.fileno(), view):]
        except OSError:                                 # the decoder is gone: its complaint is read at the end
            self._mode = "done"
            self._close_decoder(wait=True)

    def _read_decoded(self) -> None:
        fd, half = self._decoder.stdout.fileno(), b""
        while True:
            try:
                data = os.read(fd, READ_BYTES)
            except OSError:
                return
            if not data:
                return
            samples, half = s16le(half + data)
            self._deliver(samples)

    def _close_decoder(self, wait: bool) -> None:
        from ditto_fast.media.ffpipe import first_stderr_line

        decoder, self._decoder = self._decoder, None
        if decoder is None:
            return
        try:
            decoder.stdin.close()
        except OSError:
            pass
        if not wait and decoder.poll() is None:
            decoder.kill()
        code = decoder.wait()
        self._decoded.join()
        decoder.stdout.close()
        if code != 0 and wait and self.error is None:
            self.error = f"{self.name}: {first_stderr_line(self._decoder_err) or f'ffmpeg exited with status {code}'}"
        self._decoder_err.close()
