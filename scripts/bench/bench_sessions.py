"""Live sessions sharing one engine: a `serve` with --max-live 3 and the tiny networks at 720p; the engine process's
memory (RSS and PSS, from /proc) and CPU with 0, 1, 2 and 3 sessions streaming (each to a .ts, speech going in over
its WebSocket), so the cost of a session beside the networks it shares shows; and what one WebRTC viewer adds to
the engine (the encode for the relay) and to the server (aiortc)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench_common import checkpoints, save, speech
from bench_live import _register
from bench_serve import _call, _free_port

SETTLE_S = 6.0          # after a session opens, before its memory is read
SAMPLE_S = 8.0          # the CPU measured over this long


def _memory(pid: int) -> dict:
    """RSS and PSS (MiB) of process `pid`."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        out["rss_mib"] = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            out["pss_mib"] = next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
    except OSError:
        out["pss_mib"] = None
    return {k: round(v, 1) if v is not None else None for k, v in out.items()}


def _cpu(pid: int, seconds: float) -> float:
    """CPU cores process `pid` (and its threads) used over `seconds`."""
    def ticks() -> int:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    a, t0 = ticks(), time.monotonic()
    time.sleep(seconds)
    return round((ticks() - a) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0), 2)


def _talk(port: int, sid: str, pcm: np.ndarray, stop: threading.Event) -> None:
    """Speech into session `sid` at the pace it is spoken, looped, until `stop`."""
    import websockets

    async def go() -> None:
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/live/{sid}/audio") as ws:
            t0, k = time.monotonic(), 0
            while not stop.is_set():
                for i in range(0, len(pcm), 320):
                    if stop.is_set():
                        break
                    await ws.send(pcm[i:i + 320].tobytes())
                    k += 1
                    await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
    asyncio.run(go())


def run(out_json: str | None = None, quick: bool = False) -> dict:
    import soundfile as sf

    work = Path(tempfile.mkdtemp(prefix="bench_sessions_"))
    env = {**os.environ, "DITTO_FAST_HOME": str(work / "home"), "DITTO_FAST_CHECKPOINTS": str(checkpoints(tiny=True))}
    _register(env, "720p", (1280, 720))
    x, _ = sf.read(speech(6.0), dtype="float32")
    pcm = np.round(x * 32767).astype("<i2")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "serve", "--port", str(port), "--root", str(work),
                             "--max-live", "3"], env=env, stderr=open(work / "serve.log", "ab"),
                            stdout=subprocess.DEVNULL, start_new_session=True)
    stop, talkers, rows = threading.Event(), [], []
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                health = _call(port, "GET", "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("serve did not start: " + (work / "serve.log").read_text()[-800:])
                time.sleep(0.3)
        engine = int(health["engines"][0]["where"].split()[1])
        for n in range(0, 2 if quick else 4):
            if n:
                sid = _call(port, "POST", "/v1/live", {"avatar": "720p", "out": str(work / f"s{n}.ts")})["id"]
                while _call(port, "GET", f"/v1/live/{sid}")["state"] == "starting":
                    time.sleep(0.2)
                t = threading.Thread(target=_talk, args=(port, sid, pcm, stop), daemon=True)
                t.start()
                talkers.append(t)
                time.sleep(SETTLE_S)
            row = {"sessions": n, "engine": _memory(engine), "server": _memory(proc.pid),
                   "engine_cores": _cpu(engine, SAMPLE_S)}
            rows.append(row)
            print(f"{n} session(s): engine RSS {row['engine']['rss_mib']:.0f} MiB PSS {row['engine']['pss_mib']} MiB, "
                  f"{row['engine_cores']:.2f} cores; server RSS {row['server']['rss_mib']:.0f} MiB", flush=True)
        live = _call(port, "GET", "/v1/live")["live"]
    finally:
        stop.set()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(120)
    first = rows[1]["engine"]["rss_mib"] - rows[0]["engine"]["rss_mib"] if len(rows) > 1 else None
    second = rows[2]["engine"]["rss_mib"] - rows[1]["engine"]["rss_mib"] if len(rows) > 2 else None
    result = {"rows": rows, "first_session_adds_mib": first, "second_session_adds_mib": second,
              "engine_with_one_session_mib": rows[1]["engine"]["rss_mib"] if len(rows) > 1 else None,
              "frames": [s["frames"] for s in live]}
    if second is not None:
        print(f"a session adds {first:.0f} MiB, the second {second:.0f} MiB, to an engine of "
              f"{rows[0]['engine']['rss_mib']:.0f} MiB (one process, the networks loaded once)")
    return save(out_json, result)
