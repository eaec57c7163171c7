"""`DittoFastVideoService` in a real Pipecat pipeline (pipecat-ai, on the second stack): a stand-in TTS speaking a
WAV at 24 kHz in real time, the service with the tiny networks and the suite's avatar, and a sink that keeps what
reaches the end of the pipeline; run by Pipecat's own worker and runner.

What is counted: every frame the service sends is one `OutputImageRawFrame` then one audio frame of its slot (40 ms
at 25 fps, 48 kHz: the TTS's speech as it came); a frame "carries speech" when its audio is a `TTSAudioRawFrame` (the rest, before and after the
speech and after an interruption, is silence as a plain `OutputAudioRawFrame`). Motion is made from the same stream
audio the frames carry (the session's online loop), so silent frames are the avatar idling.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO
from support import speech_clip

pytest.importorskip("pipecat")

from pipecat.frames.frames import (  # noqa: E402
    CancelFrame,
    EndFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameProcessor  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from ditto_fast.pipecat import DittoFastVideoService, WavSpeaker  # noqa: E402

TTS_RATE = 24000
FPS = 25
SLOT = 48000 // FPS


class Collector(FrameProcessor):
    """The pipeline's end: keeps the kind of each frame that reaches it (images by size only)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, object]] = []

    async def process_frame(self, frame, direction) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputImageRawFrame):
            self.seen.append(("image", (tuple(frame.size), len(frame.image), frame.format)))
        elif isinstance(frame, OutputAudioRawFrame):
            kind = "speech" if isinstance(frame, TTSAudioRawFrame) else "silence"
            self.seen.append((kind, (frame.sample_rate, frame.num_channels, np.frombuffer(frame.audio, np.int16))))
        else:
            self.seen.append((type(frame).__name__, None))
        await self.push_frame(frame, direction)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.seen]

    def speech_frames(self) -> int:
        return self.kinds().count("speech")


@pytest.fixture(scope="module")
def tts_wav(tmp_path_factory):
    """Speech as a TTS engine gives it: 24 kHz mono 16-bit, 2 s and 4 s long."""
    import soxr

    d = tmp_path_factory.mktemp("tts")
    out = {}
    for seconds in (2.0, 4.0):
        x, sr = sf.read(speech_clip(d, f"s{seconds:g}_16k.wav", seconds), dtype="float32")
        out[seconds] = d / f"s{seconds:g}.wav"
        sf.write(out[seconds], soxr.resample(x, sr, TTS_RATE), TTS_RATE, subtype="PCM_16")
    return out


def run_pipeline(engine, wav: Path, drive, avatar: str = "anchor", lead: float = 0.2, **service) -> tuple:
    """Run [WavSpeaker(wav, lead), DittoFastVideoService, Collector] to its end, `drive(worker, sink)` queueing
    frames; (sink, service, errors, threads before, threads after, seconds). `engine` None: the service loads its
    own (`service` names the checkpoints)."""
    tts = WavSpeaker(wav, lead=lead)
    video = DittoFastVideoService(avatar, renderer=engine, **service)
    sink = Collector()
    errors: list[str] = []

    async def main() -> float:
        worker = PipelineWorker(Pipeline([tts, video, sink]), enable_rtvi=False)

        @worker.event_handler("on_pipeline_error")
        async def on_error(_worker, frame):
            errors.append(frame.error)

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        t0 = time.monotonic()
        await asyncio.wait_for(asyncio.gather(runner.run(), drive(worker, sink)), 120)
        return time.monotonic() - t0

    before = threading.active_count()
    seconds = asyncio.run(main())
    return sink, video, errors, before, threading.active_count(), seconds


async def wait_until(test, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_speech_becomes_frames_of_the_avatar_in_step_with_its_audio(engine, tts_wav):
    async def drive(worker, sink):
        await wait_until(lambda: sink.kinds().count("image") >= 10)            # idling before the speech
        await worker.queue_frames([TTSSpeakFrame("hello"), EndFrame()])

    sink, video, errors, before, after, _ = run_pipeline(engine, tts_wav[2.0], drive)
    assert not errors, errors
    assert after == before, [t.name for t in threading.enumerate()]
    kinds = sink.kinds()
    media = [(k, v) for k, v in sink.seen if k in ("image", "speech", "silence")]
    w, h = engine.avatar("anchor").size
    assert all(v == ((w, h), w * h * 3, "RGB") for k, v in media[0::2]), media[0]
    assert [k for k, _ in media[0::2]] == ["image"] * (len(media) // 2)           # image, its audio, image, ...
    assert all(k in ("speech", "silence") and v[:2] == (48000, 1) and len(v[2]) == SLOT for k, v in media[1::2])
    assert abs(sink.speech_frames() - 2.0 * FPS) <= 2, (sink.speech_frames(), video.stats)
    first = kinds.index("speech")
    assert kinds[:first].count("image") >= 10                                    # the avatar idled first
    # the speech comes out as it went in (at the stream's 48 kHz, its band kept), and the TTS's end after its last frame
    out = np.concatenate([v[2] for k, v in media[1::2] if k == "speech"]).astype(np.float32) / 32768
    import soxr

    x, _ = sf.read(tts_wav[2.0], dtype="float32")
    ref = soxr.resample(x, TTS_RATE, 48000)
    assert abs(len(out) - len(ref)) <= 2 * SLOT, (len(out), len(ref))
    n = len(out) + len(ref)                                 # their cross-correlation, normalised: 1 at the best lag
    xc = np.fft.irfft(np.fft.rfft(out, n) * np.conj(np.fft.rfft(ref, n)), n)
    lag = int(np.argmax(xc))
    assert min(lag, n - lag) <= SLOT, lag                   # within a frame's audio of where it was
    assert xc[lag] / np.sqrt((out ** 2).sum() * (ref ** 2).sum()) > 0.99
    assert kinds.index("TTSStoppedFrame") > len(kinds) - 1 - kinds[::-1].index("speech")
    stats = video.stats
    assert stats["frames"]["sent"] == kinds.count("image"), stats
    assert stats["speech_dropped_s"] == 0
    if stats["frames"]["skipped"] == 0:             # every frame rendered (a host not too busy): the speech's shown
        assert stats["first_frame_latency_s"] is not None, stats
    assert video.state == "ended"                   # in live/states.py's words


def test_an_interruption_drops_the_rest_of_the_speech_and_the_avatar_idles(engine, tts_wav):
    async def drive(worker, sink):
        await worker.queue_frame(TTSSpeakFrame("a long answer"))
        await wait_until(lambda: sink.speech_frames() >= FPS)                   # a second of it has been shown
        await worker.queue_frame(InterruptionFrame())
        await wait_until(lambda: "InterruptionFrame" in sink.kinds())
        at = len(sink.kinds())
        await wait_until(lambda: sink.kinds()[at:].count("image") >= 2 * FPS)   # two seconds on
        await worker.queue_frame(EndFrame())

    # the TTS streams 2 s ahead of the speech (as engines do with a sentence): it waits in the session's buffer
    sink, video, errors, before, after, _ = run_pipeline(engine, tts_wav[4.0], drive, lead=2.0)
    assert not errors, errors
    assert after == before, [t.name for t in threading.enumerate()]
    kinds = sink.kinds()
    cut = kinds.index("InterruptionFrame")
    assert kinds[cut:].count("speech") <= 2, kinds[cut:]        # at most what was on its way to the sink
    assert kinds[cut:].count("silence") >= 2 * FPS - 2          # the avatar goes on, idle and silent
    assert sink.speech_frames() < 3 * FPS, sink.speech_frames()
    assert "TTSStoppedFrame" not in kinds[cut:]                  # the TTS was cut off too
    assert video.stats["speech_dropped_s"] > 0.5, video.stats


def test_a_service_that_loads_its_engine_and_is_cancelled_leaks_no_threads(engine, tiny_checkpoints, tts_wav):
    async def drive(worker, sink):
        await worker.queue_frame(TTSSpeakFrame("a long answer"))
        await wait_until(lambda: sink.speech_frames() >= 5)
        await worker.queue_frame(CancelFrame())

    sink, video, errors, before, after, seconds = run_pipeline(None, tts_wav[4.0], drive,
                                                               checkpoints=tiny_checkpoints, device="cpu")
    assert not errors, errors
    assert after == before, [t.name for t in threading.enumerate()]
    assert sink.speech_frames() < 3 * FPS


def test_an_unknown_avatar_is_one_error_and_the_agent_still_speaks(engine, tts_wav):
    async def drive(worker, sink):
        await worker.queue_frames([TTSSpeakFrame("hello"), EndFrame()])

    sink, video, errors, before, after, _ = run_pipeline(engine, tts_wav[2.0], drive, avatar="nobody")
    assert len(errors) == 1 and "nobody" in errors[0] and "\n" not in errors[0], errors
    assert "image" not in sink.kinds() and video.state == "failed"
    speech = [v for k, v in sink.seen if k == "speech"]         # the TTS's own frames, passed on as they came
    assert {v[0] for v in speech} == {TTS_RATE} and sum(len(v[2]) for v in speech) == 2 * TTS_RATE
    assert after == before


def test_bad_settings_are_refused_before_anything_runs(engine):
    from ditto_fast.core.errors import UsageError

    with pytest.raises(UsageError, match="emotion"):
        DittoFastVideoService("anchor", renderer=engine, emotion="schedule.json")


def assert_face_spoke_after_the_speech(stdout: str) -> None:
    """The example's line says when the face first spoke, after the TTS's first audio: a picture that carries
    speech cannot reach the pipeline's end before the speech came in (a figure of 0 ms is not one)."""
    import re

    said = re.search(r"the face spoke (\d+) ms after the TTS's first audio", stdout)
    assert said and int(said.group(1)) > 0, stdout


def test_the_example_writes_the_agent_to_an_mp4(engine, session_home, tiny_checkpoints, tts_wav, tmp_path):
    out = tmp_path / "agent.mp4"
    env = {**os.environ, "DITTO_FAST_CPU_PRECISION": "fp32", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, str(REPO / "examples" / "pipecat_agent.py"), "--avatar", "anchor",
                          "--audio", str(tts_wav[2.0]), "-o", str(out), "--home", str(session_home),
                          "--checkpoints", str(tiny_checkpoints), "--device", "cpu", "--idle", "0.5"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_face_spoke_after_the_speech(res.stdout)
    import imageio_ffmpeg

    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(out), "-f", "null", "-"],
                           capture_output=True, text=True)
    streams = [ln for ln in probe.stderr.splitlines() if "Stream #0" in ln and "->" not in ln]
    w, h = engine.avatar("anchor").size
    assert any("Video: h264" in ln and f"{w}x{h}" in ln for ln in streams), streams
    assert any("Audio: aac" in ln for ln in streams), streams
    frames = int(probe.stderr.replace("\r", "\n").split("frame=")[-1].split()[0])
    assert frames >= 2.0 * FPS, frames                          # the whole answer, and the idle before it
    bad = subprocess.run([sys.executable, str(REPO / "examples" / "pipecat_agent.py"), "--avatar", "nobody",
                          "--audio", str(tts_wav[2.0]), "-o", str(tmp_path / "x.mp4"), "--home", str(session_home),
                          "--checkpoints", str(tiny_checkpoints), "--device", "cpu"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 5 and "nobody" in bad.stderr, (bad.returncode, bad.stderr[-800:])
    missing = subprocess.run([sys.executable, str(REPO / "examples" / "pipecat_agent.py"), "--avatar", "anchor",
                              "--audio", str(tmp_path / "none.wav"), "-o", str(tmp_path / "y.mp4")],
                             env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 3 and "none.wav" in missing.stderr.splitlines()[-1], missing.stderr[-800:]
