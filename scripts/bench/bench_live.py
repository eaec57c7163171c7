"""`ditto-fast live` as a TTS engine drives it: speech piped into `--audio-in -` at the pace it is spoken (a 200 ms
block every 200 ms), the stream into a .ts file, `--stop-at-end`; the session's own --stats: first-frame latency
(the first speech sample in to the first frame carrying its motion out), steady latency, each stage's real-time
factor (its seconds per second of stream, as if it had made every frame) and the frames repeated or skipped.

Cases: tiny networks at 720p and 1080p, and (without --quick) the full-size networks at 720p. Ditto's own online
figures (its authors, ditto-talkinghead #14, TensorRT on a GPU): first frame under 400 ms, RTF 0.155-0.31.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

from bench_common import anchor, checkpoints, ms, save, speech

DITTO_ONLINE = {"first_frame_latency_s": "< 0.4", "rtf": "0.155-0.31 (TensorRT, GPU)"}


def _feed(proc: subprocess.Popen, wav: Path, block_s: float = 0.2) -> None:
    """Write the WAV's 16 kHz mono PCM to the process's stdin a block at a time, at the pace it is spoken."""
    with wave.open(str(wav), "rb") as w:
        pcm = w.readframes(w.getnframes())
    step = int(16000 * block_s) * 2
    t0 = time.monotonic()
    for k, at in enumerate(range(0, len(pcm), step)):
        time.sleep(max(0.0, t0 + k * block_s - time.monotonic()))
        proc.stdin.write(pcm[at:at + step])
        proc.stdin.flush()
    proc.stdin.close()


def session(env: dict, avatar: str, seconds: float, work: Path, extra: tuple[str, ...] = ()) -> dict:
    """One live session fed `seconds` of speech on stdin; its --stats."""
    stats, out = work / f"{avatar}.json", work / f"{avatar}.ts"
    proc = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "live", "--avatar", avatar, "--audio-in", "-",
                             "--out", str(out), "--stop-at-end", "--stats", str(stats), *extra],
                            env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=False)
    first = proc.stderr.readline()               # the engine is loaded once the session says where it streams
    feeder = threading.Thread(target=_feed, args=(proc, speech(seconds)))
    feeder.start()
    err = proc.stderr.read()
    feeder.join()
    if proc.wait() != 0:
        raise RuntimeError(f"live failed: {(first + err).decode(errors='replace')[-600:]}")
    return json.loads(stats.read_text())


def _register(env: dict, name: str, size: tuple[int, int]) -> None:
    subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", str(anchor(25, size)), "--name", name,
                    "--quiet"], env=env, check=True, capture_output=True)


def run(out_json: str | None = None, quick: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench_live_"))
    seconds = 6.0 if quick else 12.0
    cases = [("tiny", "720p", (1280, 720)), ("tiny", "1080p", (1920, 1080))]
    if not quick:
        cases.append(("full", "720p", (1280, 720)))
    rows = {}
    for kind, label, size in cases:
        env = {**os.environ, "DITTO_FAST_HOME": str(work / kind), "DITTO_FAST_CHECKPOINTS":
               str(checkpoints(tiny=kind == "tiny"))}
        _register(env, label, size)
        s = session(env, label, seconds if kind == "tiny" else 6.0, work)
        rows[f"{kind} {label}"] = s
        f, lat = s["frames"], s["latency_s"] or {}
        print(f"{kind:>5} {label:>6}: first frame {ms(s['first_frame_latency_s'], 9)}, latency median "
              f"{ms(lat.get('median'), 9)} p95 {ms(lat.get('p95'), 9)}; frames {f['sent']} sent, "
              f"{f['on_time']} on time, {f['repeated']} repeated, {f['skipped']} skipped")
        print("        RTF per stage: " + ", ".join(f"{k} {v:.3f}" for k, v in s["rtf"].items() if v is not None))
        print("        ms per frame: " + ", ".join(f"{k} {v:.1f}" for k, v in s["ms_per_frame"].items()))
    print(f"Ditto online (its authors): first frame {DITTO_ONLINE['first_frame_latency_s']} s, RTF "
          f"{DITTO_ONLINE['rtf']}")
    return save(out_json, {"speech_seconds": seconds, "cases": rows, "ditto_online": DITTO_ONLINE})
