"""A Pipecat voice agent's face in process: a real Pipecat pipeline (a stand-in TTS speaking 24 kHz PCM in 20 ms
frames at the pace it is spoken, `DittoFastVideoService`, a sink at the pipeline's end), run by Pipecat's worker and
runner. Figures: first-frame latency (the TTS's first audio frame in to the first image frame carrying its motion at
the pipeline's end: the image just before the first TTSAudioRawFrame), the same at the session's output (before the
hop into the event loop), steady latency (each block of speech in to its frame out, the session's), each stage's
real-time factor, frames repeated or skipped. Where rendering falls behind the clock, the first image of the speech
may be the last frame shown again (not yet its motion): the session's figure counts only frames made for their slot,
so it can then be the later of the two.

Tiny networks at 720p on this machine; Ditto's online figures (its authors, TensorRT on a GPU) beside them. Needs
pipecat-ai (the second stack, `pip install 'ditto-fast[pipecat]'`); the avatar is registered by a Python that has
mediapipe ($DITTO_FAST_REGISTER_PYTHON, else this one if it has it, else the checkout's .venv).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, anchor, checkpoints, ms, save, speech
from bench_live import DITTO_ONLINE

RATE_IN = 24000


def _register(home: Path, ckpt: Path, name: str, size: tuple[int, int]) -> None:
    """Register the synthetic anchor at `size` as `name` in `home`, with a Python that has mediapipe."""
    python = os.environ.get("DITTO_FAST_REGISTER_PYTHON") or (
        sys.executable if importlib.util.find_spec("mediapipe") else str(REPO / ".venv" / "bin" / "python"))
    if not Path(python).exists():
        raise RuntimeError("registering the benchmark's avatar needs mediapipe: run the first stack's setup "
                           "(scripts/setup/setup_env.sh makes .venv), or name a Python that has it in "
                           "DITTO_FAST_REGISTER_PYTHON")
    env = {**os.environ, "DITTO_FAST_HOME": str(home), "DITTO_FAST_CHECKPOINTS": str(ckpt), "PYTHONPATH": str(REPO)}
    subprocess.run([python, "-m", "ditto_fast.cli", "register", str(anchor(25, size)), "--name", name, "--quiet"],
                   env=env, check=True, capture_output=True)


def _tts_wav(seconds: float, work: Path) -> Path:
    """The benchmark's speech as a TTS engine gives it: 24 kHz mono 16-bit."""
    import soundfile as sf
    import soxr

    x, sr = sf.read(speech(seconds), dtype="float32")
    path = work / f"tts_{seconds:g}s.wav"
    sf.write(path, soxr.resample(x, sr, RATE_IN), RATE_IN, subtype="PCM_16")
    return path


def session(renderer, avatar: str, wav: Path) -> dict:
    """One pipeline run: idle a second, speak the WAV, end once it has been shown; the figures."""
    from pipecat.frames.frames import EndFrame, OutputImageRawFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from ditto_fast.pipecat import DittoFastVideoService, WavSpeaker

    class Probe(FrameProcessor):
        """The pipeline's end: when images arrive, and the first that carries speech."""

        def __init__(self) -> None:
            super().__init__()
            self.images, self.last_image, self.first_speech_image = 0, None, None

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, OutputImageRawFrame):
                self.images += 1
                self.last_image = time.monotonic()
            elif isinstance(frame, TTSAudioRawFrame) and self.first_speech_image is None:
                self.first_speech_image = self.last_image
            await self.push_frame(frame, direction)

    tts, probe = WavSpeaker(wav), Probe()
    video = DittoFastVideoService(avatar, renderer=renderer)

    async def main() -> None:
        worker = PipelineWorker(Pipeline([tts, video, probe]), enable_rtvi=False)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)

        async def speak() -> None:
            await asyncio.sleep(1.0)
            await worker.queue_frames([TTSSpeakFrame("(the answer)"), EndFrame()])

        await asyncio.gather(runner.run(), speak())

    asyncio.run(main())
    stats = video.stats
    first = probe.first_speech_image - tts.first_audio_at if probe.first_speech_image and tts.first_audio_at else None
    return {"first_frame_latency_s": None if first is None else round(first, 4), "images": probe.images,
            "session": stats}


def run(out_json: str | None = None, quick: bool = False) -> dict:
    if importlib.util.find_spec("pipecat") is None:
        raise RuntimeError("the pipecat suite needs pipecat-ai: run it on the second stack (.venv-current) or "
                           "pip install 'ditto-fast[pipecat]'")
    work = Path(tempfile.mkdtemp(prefix="bench_pipecat_"))
    seconds = 6.0 if quick else 12.0
    ckpt = checkpoints(tiny=True)
    home = work / "home"
    _register(home, ckpt, "720p", (1280, 720))
    os.environ["DITTO_FAST_HOME"] = str(home)
    from ditto_fast.engine.renderer import Renderer

    renderer = Renderer(ckpt)
    row = session(renderer, "720p", _tts_wav(seconds, work))
    s, first = row["session"], row["first_frame_latency_s"]
    f, lat = s["frames"], s["latency_s"] or {}
    print(f"Pipecat in process, tiny 720p: first frame {ms(first)} at the pipeline's end "
          f"({ms(s['first_frame_latency_s'])} at the session's output), latency median "
          f"{ms(lat.get('median'))} p95 {ms(lat.get('p95'))}; frames {f['sent']} sent, "
          f"{f['on_time']} on time, {f['repeated']} repeated, {f['skipped']} skipped")
    print("        RTF per stage: " + ", ".join(f"{k} {v:.3f}" for k, v in s["rtf"].items() if v is not None))
    print(f"Ditto online (its authors): first frame {DITTO_ONLINE['first_frame_latency_s']} s, RTF "
          f"{DITTO_ONLINE['rtf']}")
    return save(out_json, {"speech_seconds": seconds, "pipecat_in_process": row, "ditto_online": DITTO_ONLINE})
