"""A voice agent's path into `serve`: POST /v1/live to a .ts under the root, a WebSocket client (the `websockets`
library) sending a TTS's PCM (24 kHz, 20 ms messages at the pace it is spoken), DELETE; the session's own figures:
first-frame latency (the first speech sample in to the first frame carrying its motion out; the WebSocket-to-process
hop is a pipe write), steady latency, each stage's real-time factor, frames repeated or skipped.

Tiny networks at 720p on this machine; Ditto's online figures (its authors, TensorRT on a GPU) beside them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_common import anchor, checkpoints, ms, save, speech
from bench_live import DITTO_ONLINE, _register
from bench_serve import _call, _free_port

RATE_IN = 24000
CHUNK_S = 0.02


async def _send(url: str, pcm: np.ndarray) -> None:
    import websockets

    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"rate": RATE_IN}))
        step, t0 = int(RATE_IN * CHUNK_S), time.monotonic()
        for k, i in enumerate(range(0, len(pcm), step)):
            await ws.send(pcm[i:i + step].tobytes())
            await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_S - time.monotonic()))
        await asyncio.sleep(3.0)            # the last words' frames go out


def session(env: dict, work: Path, seconds: float) -> dict:
    """A server, one live session fed `seconds` of speech over its WebSocket; the session's view at its end."""
    import soundfile as sf
    import soxr

    port = _free_port()
    log = open(work / "serve.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "serve", "--port", str(port), "--root", str(work)],
                            env=env, stderr=log, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                _call(port, "GET", "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("serve did not start: " + (work / "serve.log").read_text()[-800:])
                time.sleep(0.3)
        sid = _call(port, "POST", "/v1/live", {"avatar": "720p", "out": str(work / "voice.ts")})["id"]
        while _call(port, "GET", f"/v1/live/{sid}")["state"] == "starting":
            time.sleep(0.2)
        x, sr = sf.read(speech(seconds), dtype="float32")
        pcm = np.round(np.clip(soxr.resample(x, sr, RATE_IN), -1, 1) * 32767).astype("<i2")
        asyncio.run(_send(f"ws://127.0.0.1:{port}/v1/live/{sid}/audio", pcm))
        return _call(port, "DELETE", f"/v1/live/{sid}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def run(out_json: str | None = None, quick: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench_voice_"))
    seconds = 6.0 if quick else 12.0
    env = {**os.environ, "DITTO_FAST_HOME": str(work / "home"), "DITTO_FAST_CHECKPOINTS": str(checkpoints(tiny=True))}
    _register(env, "720p", (1280, 720))
    view = session(env, work, seconds)
    s = view["stats"]
    f, lat = s["frames"], s["latency_s"] or {}
    print(f"WebSocket -> serve -> .ts, tiny 720p: first frame {ms(s['first_frame_latency_s'])}, "
          f"latency median {ms(lat.get('median'))} p95 {ms(lat.get('p95'))}; frames "
          f"{f['sent']} sent, {f['on_time']} on time, {f['repeated']} repeated, {f['skipped']} skipped")
    print("        RTF per stage: " + ", ".join(f"{k} {v:.3f}" for k, v in s["rtf"].items() if v is not None))
    print(f"Ditto online (its authors): first frame {DITTO_ONLINE['first_frame_latency_s']} s, RTF "
          f"{DITTO_ONLINE['rtf']}")
    return save(out_json, {"speech_seconds": seconds, "websocket_serve_ts": s, "ditto_online": DITTO_ONLINE})
