#!/usr/bin/env python
"""A Pipecat voice agent's face, with no network: a stand-in TTS speaks a WAV, `DittoFastVideoService` renders the
avatar saying it, and a recorder writes what an output transport would show to an .mp4.

    python examples/pipecat_agent.py --avatar ruby --audio answer.wav -o agent.mp4 [--checkpoints ckpt]
    python examples/pipecat_agent.py --avatar ruby --audio answer.wav -o agent.mp4 --url http://HOST:8750

With --url a running `ditto-fast serve` renders the face (this process loads no network). It prints what it wrote
and how long the face took to speak: from the TTS's first audio frame to the first picture carrying that speech at
the pipeline's end (where a transport would show it). In a real agent the stand-in TTS is a TTS service (after an
STT and an LLM) and the recorder a WebRTC transport's output (Daily, SmallWebRTC): see docs/live.md's "Voice agents"
section. Needs `pip install 'ditto-fast[pipecat]'`.
Exit codes as the ditto-fast commands': 2 bad usage, 3 a bad input file, 5 an avatar problem, 6 checkpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", required=True, help="a registered avatar's name")
    ap.add_argument("--audio", required=True, type=Path, help="the answer to speak: a 16-bit PCM WAV, any rate")
    ap.add_argument("-o", "--output", required=True, type=Path, help="the .mp4 to write")
    ap.add_argument("--checkpoints", help="checkpoint directory (default $DITTO_FAST_CHECKPOINTS or ./checkpoints)")
    ap.add_argument("--home", help="the avatar store (default $DITTO_FAST_HOME or ~/.cache/ditto-fast)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    ap.add_argument("--idle", type=float, default=1.0, help="seconds the avatar idles before it speaks")
    ap.add_argument("--url", help="a running `ditto-fast serve` (http://HOST:8750) renders the face instead")
    ap.add_argument("--token", help="its bearer token (with --url)")
    args = ap.parse_args(argv)
    if args.home:
        os.environ["DITTO_FAST_HOME"] = args.home
    from loguru import logger                       # Pipecat's log: its frame-by-frame DEBUG lines left out

    logger.remove()
    logger.add(sys.stderr, level="INFO")

    from ditto_fast.core.errors import DittoError

    try:
        return asyncio.run(run(args))
    except DittoError as e:
        print(f"pipecat_agent: {e}", file=sys.stderr)
        return e.exit_code


async def run(args: argparse.Namespace) -> int:
    from pipecat.frames.frames import EndFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    from ditto_fast.pipecat import DittoFastVideoService, Mp4Recorder, WavSpeaker

    tts = WavSpeaker(args.audio)                                      # stands in for a TTS service
    recorder = Mp4Recorder(args.output, rate=lambda: video.rate)      # stands in for a transport's output
    if args.url:                                                      # rendered by a running serve
        video = DittoFastVideoService(args.avatar, url=args.url, token=args.token)
    else:
        from ditto_fast.engine.renderer import Renderer

        renderer = Renderer(args.checkpoints, device=args.device)     # loaded before the pipeline's setup timeout
        renderer.avatar(args.avatar)                                  # an unknown avatar: one line, exit 5
        video = DittoFastVideoService(args.avatar, renderer=renderer)
    worker = PipelineWorker(Pipeline([tts, video, recorder]), enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def speak() -> None:
        await asyncio.sleep(args.idle)                                # the avatar idles: breathes, blinks
        await worker.queue_frames([TTSSpeakFrame("(the answer)"), EndFrame()])   # EndFrame: once it has been said

    await asyncio.gather(runner.run(), speak())
    if recorder.first_speech_at is None or tts.first_audio_at is None:
        face = "no picture carried the speech (the agent spoke without its face: see the error above)"
    else:
        face = (f"the face spoke {1000 * (recorder.first_speech_at - tts.first_audio_at):.0f} ms after the TTS's "
                "first audio")
    print(f"{args.output}: {recorder.images} frames at {video.rate} fps, {recorder.audio_seconds:.2f} s of audio; "
          f"{face}")
    return 0 if args.output.exists() and recorder.first_speech_at is not None else 1


if __name__ == "__main__":
    sys.exit(main())
