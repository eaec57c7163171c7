"""`ditto-fast qc` on files it did not make: a truncated file is called truncated (the container's declared
duration against what the essence holds, packets cut short), each colour tag is checked against the profile,
and its messages say what they mean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import imageio_ffmpeg
import pytest

from ditto_fast.render.profiles import load_profile
from ditto_fast.render.qc import check_file

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
