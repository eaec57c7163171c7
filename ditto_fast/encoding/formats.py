"""Output formats: what the writer asks of a format (`OutputFormat`, which a plain output and a delivery profile's
DeliveryFormat both are), and a plain output's: the container its extension names and the codec asked for.

Every output is tagged BT.709, TV range, with its audio at 48 kHz. H.264 and HEVC are encoded by x264/x265
on the CPU, or by the GPU's NVENC (`nvenc`), with the same constant-quality number (crf / cq). AAC carries at
most 8 channels (ffmpeg's encoder), at 160 kb/s for mono and stereo and 64 kb/s a channel above that; PCM in
QuickTime or Matroska carries up to 24 (22.2; written and read back with ffmpeg 9).
  .mp4  MPEG-4          h264 (default) or hevc, AAC audio
  .mov  QuickTime       h264 (default), hevc, or prores (ProRes 422 HQ, 10-bit 4:2:2, PCM audio)
  .mkv  Matroska        h264 (default) or hevc, AAC audio
"""

from __future__ import annotations

import functools
import re
import subprocess
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ditto_fast.core.config import CODECS
from ditto_fast.core.errors import UsageError

CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska"}
AUDIO_RATE = 48000
AAC_MAX_CHANNELS = 8
PCM_MAX_CHANNELS = 24
ENCODER_KEYINT = 250        # the key-frame interval x264, x265 and NVENC keep when not told one (render tells none)
COLOUR_TAGS = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv"]
# the frames' own tags as the writer hands them over: BT.709, limited range
FRAME_TAGS = "setparams=colorspace=bt709:color_primaries=bt709:color_trc=bt709:range=tv"
TO_BT709 = "scale=out_color_matrix=bt709:out_range=tv"     # RGB frames into limited-range BT.709


class OutputFormat(Protocol):
    """What the writer asks of a format: a plain output's (Format) and a delivery profile's (DeliveryFormat)."""

    container: str
    codec: str
    encoder: str
    audio_codec: str
    max_audio_channels: int
    nvenc_capable: bool             # whether the GPU's encoder may write it

    def with_nvenc(self, works: bool) -> "OutputFormat":
        """This format encoded on the GPU's NVENC when `works` and the format can be (a delivery never is)."""

    def video_filters(self, size: tuple[int, int], planes: bool) -> str:
        """The -vf chain for frames of `size`, given as YUV planes (`planes`) or RGB."""

    def video_args(self, crf: int, preset: str) -> list[str]:
        """The video encoder and its options."""

    def audio_args(self, audio_input: int, seconds: float, mixed: list[str], channels: int) -> list[str]:
        """Maps, filters and encoder of the audio from input `audio_input`, cut or padded to `seconds`; `mixed`: the
        soundtrack's filters that come first, `channels` what they give."""

    def muxer_args(self) -> list[str]:
        """The container's options and name."""


@dataclass(frozen=True)
class Format:
    """What goes into one output file: container (ffmpeg muxer name), video codec, pixel format."""

    container: str
    codec: str
    nvenc: bool = False             # H.264/HEVC on the GPU's encoder

    @property
    def nvenc_capable(self) -> bool:
        return self.codec in ("h264", "hevc")

    def with_nvenc(self, works: bool) -> "Format":
        return dataclasses.replace(self, nvenc=works and self.nvenc_capable)

    @property
    def encoder(self) -> str:
        """The ffmpeg encoder that writes the video."""
        if self.codec == "prores":
            # not prores_ks: writing a 1080p frame took 181 ms of CPU with it, 60 with this one, at a PSNR 1.5 dB
            # higher and 8-12 % more bytes (scripts/bench/bench_delivery.py; docs/delivery.md)
            return "prores_aw"
        if self.nvenc:
            return f"{self.codec}_nvenc"
        return "libx265" if self.codec == "hevc" else "libx264"

    @property
    def pix_fmt(self) -> str:
        return "yuv422p10le" if self.codec == "prores" else "yuv420p"

    def video_filters(self, size: tuple[int, int], planes: bool) -> str:
        """Planes are limited-range BT.709 already: passed on as they are where the codec's format is the frames' own
        (a 10-bit 4:2:2 plate into ProRes), else chroma and depth resampled; RGB is converted."""
        return f"{FRAME_TAGS},format={self.pix_fmt}" if planes else f"{TO_BT709},format={self.pix_fmt},{FRAME_TAGS}"

    def video_args(self, crf: int, preset: str) -> list[str]:
        """ffmpeg's video encoder options; crf and preset apply to the H.264/HEVC encoders (ProRes: HQ profile)."""
        if self.codec == "prores":
            args = ["-c:v", self.encoder, "-profile:v", "3", "-vendor", "apl0"]
        elif self.nvenc:
            # constant quality as with crf; p5 + hq is NVENC's balanced high-quality setting. crf 0 is x264's
            # lossless, and NVENC's -cq 0 would mean "automatic", so 0 takes NVENC's lossless tune instead
            quality = ["-tune", "lossless"] if crf == 0 else ["-tune", "hq", "-rc", "vbr", "-cq", str(crf), "-b:v", "0"]
            args = ["-c:v", self.encoder, "-preset", "p5", *quality]
            if self.codec == "hevc" and self.container in ("mp4", "mov"):
                args += ["-tag:v", "hvc1"]
        elif self.codec == "hevc":
            args = ["-c:v", self.encoder, "-preset", preset, "-crf", str(crf), "-x265-params", "log-level=error"]
            if self.container in ("mp4", "mov"):
                args += ["-tag:v", "hvc1"]          # the tag Apple players and most playout servers expect
        else:
            args = ["-c:v", self.encoder, "-preset", preset, "-crf", str(crf)]
        return [*args, "-pix_fmt", self.pix_fmt, *COLOUR_TAGS]

    @property
    def audio_codec(self) -> str:
        """The audio it carries: 24-bit PCM beside ProRes, AAC otherwise."""
        return "pcm_s24le" if self.codec == "prores" else "aac"

    @property
    def max_audio_channels(self) -> int:
        """The most audio channels its audio codec carries in its container."""
        return PCM_MAX_CHANNELS if self.audio_codec.startswith("pcm") else AAC_MAX_CHANNELS

    def audio_args(self, audio_input: int, seconds: float, mixed: list[str], channels: int) -> list[str]:
        """The file's first audio stream at 48 kHz, AAC at aac_bitrate(channels) or PCM, padded or cut to `seconds`."""
        codec = ["-c:a", self.audio_codec, "-ar", str(AUDIO_RATE)] if self.audio_codec != "aac" else \
            ["-c:a", "aac", "-b:a", aac_bitrate(channels), "-ar", str(AUDIO_RATE)]
        return ["-map", f"{audio_input}:a:0", *codec, "-af",
                ",".join([*mixed, f"apad=whole_dur={seconds:.6f}", f"atrim=end={seconds:.6f}"])]

    def muxer_args(self) -> list[str]:
        fast = ["-movflags", "+faststart"] if self.container in ("mp4", "mov") else []
        return [*fast, "-f", self.container]


def aac_bitrate(channels: int) -> str:
    """AAC's bitrate for `channels`: 160 kb/s for mono and stereo, 64 kb/s a channel above (5.1: 384 kb/s)."""
    return f"{max(160, 64 * int(channels))}k"


def output_format(path: str | Path, codec: str | None = None) -> Format:
    """The format for an output path and an optional codec; UsageError for a name or pairing that can't be made."""
    path = Path(path)
    container = CONTAINERS.get(path.suffix.lower())
    if container is None:
        raise UsageError(f"{path}: unsupported output type {path.suffix or '(no extension)'!r}; "
                         f"name the file .mp4, .mov or .mkv")
    codec = (codec or "h264").lower()
    if codec not in CODECS:
        raise UsageError(f"unknown codec {codec!r}; use one of {', '.join(CODECS)}")
    if codec == "prores" and container != "mov":
        raise UsageError(f"{path}: ProRes goes in a QuickTime file; name the output .mov")
    return Format(container, codec)


def default_suffix(codec: str | None) -> str:
    """The extension an output gets when none is given: .mov for ProRes (QuickTime only), else .mp4."""
    return ".mov" if (codec or "").lower() == "prores" else ".mp4"


@functools.lru_cache(maxsize=None)
def nvenc_works(codec: str = "h264") -> tuple[bool, str]:
    """Whether ffmpeg's NVENC encoder for `codec` encodes here with the options a render gives it (probed once
    per process), and why not."""
    import imageio_ffmpeg

    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-f", "lavfi",
           "-i", "color=black:s=256x256:r=25", "-frames:v", "2",
           *Format("mp4", codec, nvenc=True).video_args(18, "veryfast"), "-f", "null", "-"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    # the encoder's own first complaint ("[h264_nvenc @ 0x...] Cannot load libcuda.so.1"), without its prefix
    lines = [re.sub(r"^(\[[^\]]*\]\s*)+", "", ln.strip()) for ln in res.stderr.splitlines()
             if ln.strip().startswith(f"[{codec}_nvenc")]
    return res.returncode == 0, (lines[0] if lines else f"ffmpeg exit {res.returncode}")[:160]
