"""Delivery profiles: the shipped ones read and check, a user's file of the same shape is refused key by key with
one line naming the file, and configs/ is where the package finds (and a wheel installs) them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from ditto_fast.core.config import CONFIG_DIR, DEFAULT_YAML
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.delivery.profiles import check_timecode, load_profile, shipped_profiles

SHIPPED = ("xdcam-hd422-1080i50", "xdcam-hd422-1080i5994", "dnxhd-1080i50", "prores-hq-1080p", "web-h264")


def test_configs_live_at_the_top_level_only():
    assert CONFIG_DIR == REPO / "configs" and DEFAULT_YAML == REPO / "configs" / "default.yaml"
    link = REPO / "ditto_fast" / "configs"          # what packaging reaches them by: a link, no second copy
    assert link.is_symlink() and link.resolve() == REPO / "configs"
    assert set(SHIPPED) <= set(shipped_profiles())


def test_shipped_profiles_say_what_stations_take():
    x = load_profile("xdcam-hd422-1080i50")
    assert (x.container, x.video.codec, x.video.profile, x.video.level, x.video.bitrate) == \
        ("mxf", "mpeg2video", "422", "high", 50_000_000)
    assert x.video.interlaced and x.video.field_order == "tff" and x.video.rate == 25 and x.video.gop == 12
    assert (x.audio.tracks, x.audio.channels, x.audio.codec, x.audio.speech) == (8, 1, "pcm_s24le", (1, 2))
    assert x.loudness == (-23.0, -1.0) and x.timecode == "10:00:00:00" and x.extension == ".mxf"
    n = load_profile("xdcam-hd422-1080i5994")
    assert n.video.rate == Fraction(30000, 1001) and n.drop_frame and n.loudness == (-24.0, -2.0)
    w = load_profile("web-h264")
    assert (w.container, w.audio.codec, w.audio.channels, w.loudness[0], w.video.interlaced) == \
        ("mp4", "aac", 2, -16.0, False)
    assert load_profile("prores-hq-1080p").loudness is None


def _user(tmp_path: Path, change, base: str = "xdcam-hd422-1080i50") -> Path:
    data = yaml.safe_load((CONFIG_DIR / "delivery" / f"{base}.yaml").read_text())
    change(data)
    path = tmp_path / "house.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("change, key", [
    (lambda d: d["video"].update(sharpness=3), "video.sharpness"),
    (lambda d: d.update(container="mp4"), "video.codec"),                 # MPEG-2 in MP4: not made here
    (lambda d: d["audio"].update(codec="aac"), "audio.codec"),            # AAC in MXF
    (lambda d: d["loudness"].update(target=-3), "loudness.target"),
    (lambda d: d["loudness"].update(target=-41), "loudness.target"),
    (lambda d: d["video"].update(pix_fmt="yuv444p"), "video.pix_fmt"),
    (lambda d: d["audio"].update(speech=[9]), "audio.speech"),
    (lambda d: d["audio"].update(channels=2), "audio.channels"),
    (lambda d: d["timecode"].update(start="10:00:00;00"), "timecode.start"),   # drop-frame at 25
    (lambda d: d["video"].update(scan="interlaced", field_order=None), "video.field_order"),
])
def test_a_bad_user_profile_is_refused_naming_file_and_key(tmp_path, change, key):
    path = _user(tmp_path, change)
    with pytest.raises(UsageError) as e:
        load_profile(path)
    assert str(e.value).startswith(f"{path}: {key} ") and "\n" not in str(e.value)


@pytest.mark.parametrize("base, change, key, words", [
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(bitrate="1k"), "video.bitrate", "10M..300M"),
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(bitrate="400M"), "video.bitrate", "at 422@high"),
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(profile="main", level="main"), "video.bitrate", "15M"),
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(size="3840x2160"), "video.size", "at most 1920x1088"),
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(size="32x32"), "video.size", "64..8192"),
    ("xdcam-hd422-1080i50", lambda d: d["video"].update(gop=0), "video.gop", "1..300 frames"),
    ("xdcam-hd422-1080i50", lambda d: d["audio"].update(tracks=17), "audio.tracks", "1..16 tracks"),
    ("xdcam-hd422-1080i50", lambda d: d["audio"].update(rate=44100), "audio.rate", "48000..48000 Hz"),
    ("xdcam-hd422-1080i50", lambda d: d["loudness"].update(true_peak=1), "loudness.true_peak", "-10..0 dBTP"),
    ("dnxhd-1080i50", lambda d: d["video"].update(bitrate="100M"), "video.bitrate",
     "one of 120M, 145M, 185M, 220M for DNxHD"),
    ("dnxhd-1080i50", lambda d: d["video"].update(size=None), "video.size", "DNxHD is made at"),
    ("dnxhd-1080i50", lambda d: d["video"].update(size="1280x720"), "video.size", "no interlaced yuv422p"),
    ("prores-hq-1080p", lambda d: d["video"].update(bitrate="200M"), "video.bitrate", "no bitrate to choose"),
    ("web-h264", lambda d: d["audio"].update(bitrate="16k"), "audio.bitrate", "32000..512000 bits/s"),
    ("web-h264", lambda d: d["video"].update(crf=60), "video.crf", "0..51"),
    ("web-h264", lambda d: d["video"].update(preset="warp9"), "video.preset", "one of ultrafast"),
])
def test_every_profile_number_is_checked_against_its_range(tmp_path, base, change, key, words):
    """`bitrate: 1k` used to pass, the whole render ran and QC failed it after: every number is in its declared
    range (the codec's and MPEG-2 level's bitrate and size, DNxHD's own pictures and bitrates) when read."""
    path = _user(tmp_path, change, base)
    with pytest.raises(UsageError) as e:
        load_profile(path)
    assert str(e.value).startswith(f"{path}: {key} ") and words in str(e.value) and "\n" not in str(e.value), e.value


@pytest.mark.parametrize("base, section, key", [
    ("xdcam-hd422-1080i50", "video", "gop"), ("xdcam-hd422-1080i50", "video", "b_frames"),
    ("xdcam-hd422-1080i50", "video", "rate"), ("xdcam-hd422-1080i50", "video", "bitrate"),
    ("xdcam-hd422-1080i50", "video", "size"), ("xdcam-hd422-1080i50", "audio", "tracks"),
    ("xdcam-hd422-1080i50", "audio", "channels"), ("xdcam-hd422-1080i50", "audio", "rate"),
    ("xdcam-hd422-1080i50", "loudness", "target"), ("xdcam-hd422-1080i50", "loudness", "true_peak"),
    ("web-h264", "video", "crf"),
])
def test_a_boolean_is_no_number_in_a_profile(tmp_path, base, section, key):
    """`gop: true` is YAML's True, an int in Python: refused as every setting refuses it."""
    path = _user(tmp_path, lambda d: d[section].update({key: True}), base)
    with pytest.raises(UsageError, match=f"^{path}: {section}.{key} must be .*, got True$"):
        load_profile(path)


def test_a_profile_number_is_refused_in_the_settings_own_words(tmp_path, run_cli):
    """One check for values: a profile's crf out of range reads as `--crf` and render.crf do."""
    path = _user(tmp_path, lambda d: d["video"].update(crf=60), "web-h264")
    with pytest.raises(UsageError) as e:
        load_profile(path)
    r = run_cli(["render", "--avatar", "a", "--audio", "a.wav", "--crf", "60"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert str(e.value) == f"{path}: video.crf must be in 0..51, got 60" and r.stderr.strip().endswith(
        "--crf: must be in 0..51, got 60; see `ditto-fast render --help`"), r.stderr


def test_a_good_user_profile_reads(tmp_path):
    path = _user(tmp_path, lambda d: d["loudness"].update(target=-24, true_peak=-2))
    assert load_profile(path).loudness == (-24.0, -2.0)


def test_unknown_names_and_missing_files_are_refused(tmp_path):
    with pytest.raises(UsageError, match="unknown delivery profile 'xdcam'"):
        load_profile("xdcam")
    with pytest.raises(InputError, match="not found"):                # a named input missing: exit 3
        load_profile(tmp_path / "none.yaml")


def test_timecodes():
    assert check_timecode("01:00:00;00", Fraction(30000, 1001)) == "01:00:00;00"
    for bad, rate in (("10:00:00;00", Fraction(25)), ("10:00:00:25", Fraction(25)), ("1:00:00:00", None),
                      ("00:01:00;00", Fraction(30000, 1001))):
        with pytest.raises(ValueError):
            check_timecode(bad, rate)


def test_cli_refuses_a_bad_profile_before_anything_loads(run_cli, tmp_path):
    path = _user(tmp_path, lambda d: d["loudness"].update(target=0))
    r = run_cli(["render", "--avatar", "nobody", "--audio", tmp_path / "none.wav", "--delivery", path])
    assert r.returncode == 2 and f"{path}: loudness.target" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    path = _user(tmp_path, lambda d: d["video"].update(bitrate="1k"))
    r = run_cli(["render", "--avatar", "nobody", "--audio", tmp_path / "none.wav", "--delivery", path])
    assert r.returncode == 2 and f"{path}: video.bitrate must be 10M..300M" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_wheel_installs_configs(tmp_path):
    """`pip wheel .` (what a plain `pip install .` installs) carries configs/ as ditto_fast/configs/."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True)
    names = zipfile.ZipFile(next(tmp_path.glob("ditto_fast-*.whl"))).namelist()
    assert "ditto_fast/configs/default.yaml" in names
    assert {f"ditto_fast/configs/delivery/{n}.yaml" for n in SHIPPED} <= set(names)
