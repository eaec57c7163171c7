"""Captions: where each caption goes on air against its cue, and what timing a script costs.

- timing: a captioned render (tiny networks, CLI) as an XDCAM 1080i59.94 MXF, a web H.264 MP4 and a ProRes MOV;
  each caption's display frame read back by independent readers (ffmpeg's cc_dec; MediaInfo's start/end and event
  count; ccextractor's when installed) against its cue's frame. Goal: on the cue's frame.
- alignment: full-size (random) HuBERT on `seconds` of speech: the features alone, the features with the character
  head (--script's one extra head over the same windows), the Viterbi pass over a script of 150 words a minute;
  seconds of each per minute of speech.

    python scripts/benchmark.py captions [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from bench_common import CACHE, REPO, anchor, checkpoints, save, speech

CUES = [(1.0, 2.4, "GOOD EVENING FROM DITTO"), (2.6, 4.0, "The council voted tonight"),
        (4.3, 5.8, "to close the old bridge,\nstarting Monday.")]
RENDERS = {"xdcam-hd422-1080i5994.mxf": ["--delivery", "xdcam-hd422-1080i5994"],
           "web-h264.mp4": ["--delivery", "web-h264"], "prores.mov": ["--codec", "prores", "--fps", "29.97"]}
WORDS = ("the council voted tonight to close the old bridge on main street for repairs starting monday drivers "
         "should use the ferry while crews replace the deck and the city says the work will take six weeks").split()


def _srt(path: Path) -> Path:
    def ts(s: float) -> str:
        ms = round(s * 1000)
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"
    path.write_text("\n".join(f"{i}\n{ts(a)} --> {ts(b)}\n{t}\n" for i, (a, b, t) in enumerate(CUES, 1)))
    return path


def _mediainfo(path: Path) -> dict | None:
    """MediaInfo's Text section of `path` (its own reading of the 608 track), or None without MediaInfo."""
    if shutil.which("mediainfo") is None:
        return None
    text = subprocess.run(["mediainfo", str(path)], capture_output=True, text=True).stdout
    section = next((b for b in text.split("\n\n") if b.startswith("Text")), "")
    return {k.strip(): v.strip() for k, _, v in (ln.partition(" : ") for ln in section.splitlines()[1:])}


def _ccextractor(path: Path, work: Path) -> list[float] | None:
    """The caption start times ccextractor reads (SRT out), or None when it is not installed or reads nothing."""
    if shutil.which("ccextractor") is None:
        return None
    out = work / f"{path.stem}.ccx.srt"
    subprocess.run(["ccextractor", str(path), "-o", str(out)], capture_output=True)
    if not out.is_file():
        return None
    from ditto_fast.delivery.caption_readback import parse_srt

    return [c.start for c in parse_srt(out.read_text(errors="replace"))]


def timing(work: Path, quick: bool) -> dict:
    """Each deliverable rendered with the cues; each caption's display frame by each reader against its cue's."""
    from ditto_fast.captions.eia608 import cue_frame
    from ditto_fast.delivery.caption_readback import read_captions

    ckpt, audio = checkpoints(tiny=True), speech(6.5)
    env = dict(os.environ, DITTO_FAST_HOME=str(work / "home"), DITTO_FAST_CHECKPOINTS=str(ckpt))
    cli = [sys.executable, "-m", "ditto_fast.cli"]
    r = subprocess.run([*cli, "register", str(anchor(50)), "--name", "a", "--quiet", "--force"], env=env,
                       capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise RuntimeError(f"register failed: {r.stderr[-500:]}")
    srt = _srt(work / "cues.srt")
    result = {}
    for name, args in list(RENDERS.items())[:1 if quick else None]:
        out, timings = work / name, work / f"{name}.json"
        r = subprocess.run([*cli, "render", "--avatar", "a", "--audio", str(audio), "-o", str(out), "--captions",
                            str(srt), "--quiet", "--timings", str(timings), *args], env=env, capture_output=True,
                           text=True, cwd=REPO)
        if r.returncode:
            raise RuntimeError(f"render {name} failed: {r.stderr[-500:]}")
        t = json.loads(timings.read_text())
        rate = Fraction(t["delivery"]["delivered_rate"] if "delivery" in t else t["rate"])
        track = read_captions(out)
        decoded = track.captions if track else []
        info = _mediainfo(out)
        ccx = _ccextractor(out, work)
        rows = []
        for i, (start, _, text) in enumerate(CUES):
            got = decoded[i] if i < len(decoded) else None
            rows.append({"cue": i + 1, "cue_frame": cue_frame(start, rate),
                         "cc_dec_frame": cue_frame(got.start, rate) if got else None,
                         "cc_dec_text_ok": bool(got and got.text == " ".join(text.split())),
                         "ccextractor_frame": cue_frame(ccx[i], rate) if ccx and i < len(ccx) else None})
        result[name] = {"rate": str(rate), "carrier": track.carrier if track else None, "cues": rows,
                        "mediainfo": {k: info.get(k) for k in ("Format", "Muxing mode", "Duration", "Start time",
                                                                "End time", "Count of events")} if info else None,
                        "shown_late": t["captions"]["shown_late"]}
    return result


def alignment(quick: bool) -> dict:
    """Seconds per minute of speech: features alone, features + character head, the Viterbi pass."""
    import torch

    from ditto_fast.audio.decode import load_audio
    from ditto_fast.audio.hubert import HubertFeatures
    from ditto_fast.captions.align import align_words

    seconds = 10.0 if quick else 60.0
    hubert_dir = CACHE / "hubert_full_seed0"
    if not (hubert_dir / "vocab.json").is_file():
        from ditto_fast.checkpoints.random_hubert import write_random_hubert

        write_random_hubert(hubert_dir, tiny=False, seed=0)
    samples = load_audio(speech(seconds))
    hf = HubertFeatures(hubert_dir, device="cuda" if torch.cuda.is_available() else "cpu")
    hf.features(samples[:16000])                                 # warm-up
    t0 = time.perf_counter()
    hf.features(samples)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, logp = hf.features(samples, ctc=True)
    with_head = time.perf_counter() - t0
    words = tuple(np.resize(np.array(WORDS), int(150 * seconds / 60)))     # 150 words a minute
    t0 = time.perf_counter()
    timed = align_words(logp, words, hubert_dir)
    viterbi = time.perf_counter() - t0
    per_min = 60.0 / seconds
    return {"seconds_of_speech": seconds, "device": str(hf.device), "words": len(words), "frames_50hz": len(logp),
            "features_s_per_min": plain * per_min, "features_with_head_s_per_min": with_head * per_min,
            "head_s_per_min": (with_head - plain) * per_min, "viterbi_s_per_min": viterbi * per_min,
            "aligned_words": len(timed)}


def run(out_json: str | None, quick: bool = False) -> dict:
    """Caption timing per deliverable and the alignment's cost; prints the tables."""
    with tempfile.TemporaryDirectory() as d:
        result = {"timing": timing(Path(d), quick), "alignment": alignment(quick)}
    print(f"\n{'deliverable':28} {'cue':>3} {'cue frame':>9} {'cc_dec':>7} {'ccextractor':>11}  text ok")
    for name, r in result["timing"].items():
        for row in r["cues"]:
            print(f"{name:28} {row['cue']:3d} {row['cue_frame']:9d} {str(row['cc_dec_frame']):>7} "
                  f"{str(row['ccextractor_frame']):>11}  {row['cc_dec_text_ok']}")
        if r["mediainfo"]:
            print(f"{'':28} MediaInfo: " + ", ".join(f"{k} {v}" for k, v in r["mediainfo"].items() if v))
    a = result["alignment"]
    print(f"\nalignment, {a['seconds_of_speech']:g} s of speech on {a['device']}, full-size HuBERT, seconds per minute:")
    print(f"  features {a['features_s_per_min']:.2f}, with the character head {a['features_with_head_s_per_min']:.2f} "
          f"(head {a['head_s_per_min']:+.2f}), Viterbi over {a['words']} words {a['viterbi_s_per_min']:.3f}")
    return save(out_json, result)


if __name__ == "__main__":
    run(None, quick="--quick" in sys.argv)
