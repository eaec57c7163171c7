"""A delivery profile as ffmpeg options: the encoder and its parameters, interlacing, scaling to the profile's
size, the audio track layout (speech on its tracks, silence on the others), loudness gain and start timecode.

Interlaced profiles are written as PsF by default (`fields: psf`): both fields of a frame come from one progressive
render frame (rendered at the frame rate, 25 for 1080i50). With `fields: field-rate` frames are rendered at the
field rate (50 for 1080i50: the motion interpolated to each field's time) and each pair woven into one frame, the
earlier one's lines in the first field (ffmpeg's `interlace`, with its vertical low-pass against twitter). Either
way each picture is encoded interlaced (interlaced DCT and motion estimation) with the field order flagged in the
codec (the picture's top_field_first) and in the container (frame layout and field dominance in MXF, `fiel` in
QuickTime).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ditto_fast.delivery.profiles import DeliveryProfile
from ditto_fast.encoding.formats import FRAME_TAGS, TO_BT709

MPEG2_PROFILES = {"422": "0", "main": "4"}
MPEG2_LEVELS = {("422", "high"): "2", ("422", "main"): "5", ("main", "high"): "4", ("main", "main"): "8"}
XDCAM_VBV = 17825792                    # the XDCAM HD422 VBV buffer, bits
# the programme's DC blocker: a 2nd-order Butterworth high-pass at 10 Hz. Its step response has no net area, so a
# DC offset leaves no mean behind even in a 0.4 s clip (a 1st-order one at 10 Hz leaves 4 % of it there), and at
# speech's lowest fundamentals (80 Hz) it takes under 0.001 dB
DC_BLOCKER = "highpass=f=10:poles=2"


@dataclass(frozen=True)
class DeliveryFormat:
    """What goes into one delivered file: the profile, the output size and rate, the audio gain and timecode."""

    profile: DeliveryProfile
    size: tuple[int, int]               # the output's (the profile's, or the avatar's own)
    rate: Fraction                      # frames/s delivered (the render's rate is twice that for field-rate motion)
    gain: str = ""                      # ffmpeg filters leveling the speech (volume, true-peak limiter), or ""
    timecode: str | None = None
    nvenc_capable = False           # a delivery is encoded in software, as its profile says

    def with_nvenc(self, works: bool) -> "DeliveryFormat":
        """Itself (never on NVENC)."""
        return self

    @property
    def container(self) -> str:
        return self.profile.container

    @property
    def codec(self) -> str:
        return self.profile.video.codec

    @property
    def encoder(self) -> str:
        return {"prores": "prores_aw", "h264": "libx264"}.get(self.codec, self.codec)

    @property
    def pix_fmt(self) -> str:
        return self.profile.video.pix_fmt

    def video_filters(self, size: tuple[int, int], planes: bool) -> str:
        """The frames' own tags (RGB converted first), then scaling to the profile's size, the pixel format, the
        field order."""
        v = self.profile.video
        parts = [*([] if planes else [TO_BT709]), FRAME_TAGS]
        parts += [] if tuple(size) == tuple(self.size) else [f"scale={self.size[0]}:{self.size[1]}:flags=lanczos"]
        if v.field_rate:                # two rendered frames -> one interlaced frame, the earlier in the first field
            parts.append(f"interlace=scan={v.field_order}:lowpass=linear")
        parts.append(f"format={v.pix_fmt}")
        if v.interlaced:
            parts.append(f"setfield={v.field_order}")
        return ",".join(parts)

    def video_args(self, crf: int, preset: str) -> list[str]:
        """The encoder and its parameters as the profile names them (crf and preset: the engine's, when the profile
        leaves them open)."""
        v = self.profile.video
        tags = ["-colorspace", v.colour["matrix"], "-color_primaries", v.colour["primaries"],
                "-color_trc", v.colour["transfer"], "-color_range", v.colour["range"]]
        if v.codec == "mpeg2video":
            profile = v.profile or ("422" if v.pix_fmt == "yuv422p" else "main")
            rate = str(v.bitrate)
            args = ["-c:v", "mpeg2video", "-profile:v", MPEG2_PROFILES[profile],
                    "-level:v", MPEG2_LEVELS[(profile, v.level or "high")],
                    "-b:v", rate, "-minrate", rate, "-maxrate", rate, "-bufsize", str(XDCAM_VBV),
                    "-rc_init_occupancy", str(XDCAM_VBV), "-g", str(v.gop), "-bf", str(v.b_frames),
                    "-sc_threshold", "1000000000", "-dc", "10", "-intra_vlc", "1", "-non_linear_quant", "1",
                    "-qmin", "1", "-qmax", "12"]
        elif v.codec == "dnxhd":
            args = ["-c:v", "dnxhd", "-b:v", str(v.bitrate)]
        elif v.codec == "prores":
            args = ["-c:v", "prores_aw", "-profile:v", "3", "-vendor", "apl0"]     # as formats.Format's ProRes
        else:
            quality = ["-crf", str(v.crf if v.crf is not None else crf)] if v.bitrate is None else \
                ["-b:v", str(v.bitrate), "-maxrate", str(v.bitrate), "-bufsize", str(2 * v.bitrate)]
            args = ["-c:v", "libx264", "-preset", v.preset or preset, *quality, "-g", str(v.gop),
                    "-keyint_min", str(v.gop), "-sc_threshold", "0", "-bf", str(v.b_frames)]
            args += ["-profile:v", v.profile] if v.profile else []
        if v.interlaced:
            args += ["-flags", "+ildct+ilme" if v.codec == "mpeg2video" else "+ildct",
                     "-field_order", "tt" if v.field_order == "tff" else "bb"]
        return [*args, "-pix_fmt", v.pix_fmt, *tags]

    @property
    def audio_codec(self) -> str:
        return self.profile.audio.codec

    @property
    def max_audio_channels(self) -> int:
        """The programme is mono or stereo: a file of more channels is mixed to stereo first (soundtrack.py)."""
        return 2

    def audio_args(self, audio_input: int, seconds: float, mixed: list[str], channels: int = 2) -> list[str]:
        """The audio graph and its streams: the speech (resampled, leveled, cut or padded to exactly `seconds`) on
        the profile's speech tracks, silence of the same length on the others, each track encoded as named;
        `mixed`: the soundtrack's filters that come first (a 5.1 file mixed to stereo; the programme is mono or
        stereo whatever `channels` they give)."""
        a = self.profile.audio
        layout = "stereo" if a.channels == 2 else "mono"
        chain = [*(mixed or []), programme_chain(self.profile), *([self.gain] if self.gain else []),
                 f"apad=whole_dur={seconds:.6f}", f"atrim=end={seconds:.6f}", f"asplit={a.tracks}"]
        graph = [f"[{audio_input}:a:0]{','.join(chain)}" + "".join(f"[s{t}]" for t in range(1, a.tracks + 1))]
        maps = []
        for t in range(1, a.tracks + 1):
            if t in a.speech:
                graph.append(f"[s{t}]anull[t{t}]")
            else:
                zero = "|".join(f"c{c}=0*c0" for c in range(a.channels))
                graph.append(f"[s{t}]pan={layout}|{zero}[t{t}]")
            maps += ["-map", f"[t{t}]"]
        codec = ["-c:a", a.codec, *(["-b:a", a.bitrate] if a.bitrate else []), "-ar", str(a.rate)]
        return ["-filter_complex", ";".join(graph), *maps, *codec]

    def muxer_args(self) -> list[str]:
        tc = self.timecode or self.profile.timecode
        fast = ["-movflags", "+faststart"] if self.container in ("mp4", "mov") else []
        return [*(["-timecode", tc] if tc else []), *fast, "-f", self.container]


def programme_chain(profile: DeliveryProfile) -> str:
    """ffmpeg filters taking any speech file to the programme's own signal at 48 kHz: mono for speech on mono
    tracks (the same signal on each), stereo for a stereo speech track; DC blocked (DC_BLOCKER)."""
    layout = "stereo" if profile.audio.channels == 2 else "mono"
    return f"aresample={profile.audio.rate},aformat=sample_fmts=fltp:channel_layouts={layout},{DC_BLOCKER}"


def measured_as(profile: DeliveryProfile) -> str:
    """The filter turning the programme's signal into what is measured: speech on two mono tracks is measured as
    that stereo pair, a mono programme as mono, a stereo track as it is."""
    a = profile.audio
    return "pan=stereo|c0=c0|c1=c0" if a.channels == 1 and len(a.speech) == 2 else "anull"
