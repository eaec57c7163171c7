"""A Pipecat agent whose face a running `serve` renders (`DittoFastVideoService(avatar, url=...)`), on the second
stack: a real server with the tiny networks, a real Pipecat pipeline in a process of its own that loads no network
and imports no torch; the frames come back at the avatar's size in step with the speech sent, an interruption cuts
the speech, and the TTS's end follows its speech."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO
from support import speech_clip

pytest.importorskip("pipecat")
pytest.importorskip("aiortc")

AGENT = r"""
import asyncio, json, sys, time
import numpy as np
from pipecat.frames.frames import (EndFrame, InterruptionFrame, OutputAudioRawFrame, OutputImageRawFrame,
                                   TTSAudioRawFrame, TTSSpeakFrame)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.workers.runner import WorkerRunner
from ditto_fast.pipecat import DittoFastVideoService, WavSpeaker

url, wav, interrupt = sys.argv[1], sys.argv[2], sys.argv[3] == "1"


class Sink(FrameProcessor):
    def __init__(self):
        super().__init__()
        self.seen = []

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputImageRawFrame):
            self.seen.append(["image", list(frame.size), len(frame.image)])
        elif isinstance(frame, OutputAudioRawFrame):
            pcm = np.frombuffer(frame.audio, np.int16)
            self.seen.append(["speech" if isinstance(frame, TTSAudioRawFrame) else "silence", frame.sample_rate,
                              int(np.abs(pcm).max()) if len(pcm) else 0, len(pcm)])
        else:
            self.seen.append([type(frame).__name__])
        await self.push_frame(frame, direction)


async def main():
    video = DittoFastVideoService("anchor", url=url)
    sink = Sink()
    worker = PipelineWorker(Pipeline([WavSpeaker(wav, lead=0.2), video, sink]), enable_rtvi=False)
    errors = []

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker, frame):
        errors.append(frame.error)

    async def drive():
        while sum(1 for s in sink.seen if s[0] == "image") < 10:
            await asyncio.sleep(0.05)
        await worker.queue_frame(TTSSpeakFrame("hello"))
        if interrupt:
            while sum(1 for s in sink.seen if s[0] == "speech") < 25:
                await asyncio.sleep(0.02)
            await worker.queue_frame(InterruptionFrame())
            await asyncio.sleep(2.0)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 180)
    print(json.dumps({"seen": sink.seen, "errors": errors, "torch": "torch" in sys.modules,
                      "session": video.session}))

asyncio.run(main())
"""


def _agent(server, wav, interrupt: bool = False) -> dict:
    res = subprocess.run([sys.executable, "-c", AGENT, f"http://127.0.0.1:{server.port}", str(wav), str(int(interrupt))],
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture
def tts_wav(tmp_path):
    import soxr

    x, sr = sf.read(speech_clip(tmp_path, "s16.wav", 3.0), dtype="float32")
    path = tmp_path / "tts.wav"
    sf.write(path, soxr.resample(x, sr, 24000), 24000, subtype="PCM_16")
    return path


def test_an_agent_without_a_gpu_gets_its_face_from_a_running_serve(serving, tts_wav):
    server = serving()
    got = _agent(server, tts_wav)
    assert not got["errors"] and got["torch"] is False, got["errors"]
    seen = got["seen"]
    images = [s for s in seen if s[0] == "image"]
    assert images and all(s[1] == [1920, 1080] and s[2] == 1920 * 1080 * 3 for s in images)
    audio = [s for s in seen if s[0] in ("speech", "silence")]
    assert len(audio) == len(images) and all(s[1] == 48000 and s[3] == 1920 for s in audio)
    speech = sum(1 for s in audio if s[0] == "speech")
    assert abs(speech - 3.0 * 25) <= 5, speech                        # the answer's frames carry its speech
    kinds = [s[0] for s in seen]
    last_speech = len(kinds) - 1 - kinds[::-1].index("speech")
    assert kinds.index("TTSStoppedFrame") > last_speech               # held until its speech was played
    view = server.call("GET", f"/v1/live/{got['session']}")[1]
    assert view["state"] == "ended", view


def test_an_interruption_reaches_the_server_and_cuts_the_speech(serving, tts_wav):
    server = serving()
    got = _agent(server, tts_wav, interrupt=True)
    assert not got["errors"], got["errors"]
    kinds = [s[0] for s in got["seen"]]
    cut = kinds.index("InterruptionFrame")
    assert kinds[cut:].count("speech") <= 1, kinds[cut:]     # on its way: muted (one queued before the cut may pass)
    assert kinds[cut:].count("image") >= 25                            # the face goes on, idle
    assert sum(1 for k in kinds if k == "speech") < 3.0 * 25 - 10



def test_frames_on_their_way_at_an_interruption_are_muted_up_to_the_frame_the_server_names():
    """After a clear the frames that still come carry the cut speech: silent until the server's `cleared` event, then
    up to its frame; speech after it is heard. A server that never says: muted for CLEARED_WAIT_S, then heard."""
    import asyncio

    from pipecat.frames.frames import OutputAudioRawFrame, TTSAudioRawFrame

    from ditto_fast.pipecat import remote
    from ditto_fast.serve.live.socket import media_message

    loud = np.full(1920, 8000, "<i2").tobytes()

    def frame(index: int) -> bytes:
        """A loud frame as the server sends it (no picture: the service's decoder is left out)."""
        return media_message((index, b"", False, loud), 25)

    class Socket:
        """The session's WebSocket: what the client sends, and what comes (a callable: time passing)."""
        def __init__(self, messages):
            self.sent, self.messages = [], messages

        async def send(self, message):
            self.sent.append(message)

        async def __aiter__(self):
            for m in self.messages:
                if callable(m):
                    m()
                else:
                    yield m

    def run(messages) -> list[bool]:
        service = remote.RemoteVideoService("anchor", url="http://127.0.0.1:9")
        heard = []

        async def push_frame(f, *_):
            if isinstance(f, OutputAudioRawFrame):
                heard.append(isinstance(f, TTSAudioRawFrame) and any(f.audio))

        async def go():
            service.push_frame, service._decode = push_frame, lambda unit: []
            service._ws = ws = Socket([m(service) if callable(m) else m for m in messages])
            await service._show(frame(10))
            await service._interrupt(ws)
            assert ws.sent == [json.dumps({"clear": True})]
            await service._read()

        asyncio.run(go())
        return heard

    cleared = json.dumps({"event": "cleared", "frame": 13})
    assert run([frame(11), cleared, frame(12), frame(13), frame(14)]) == [True, False, False, False, True]

    def later(service):                                 # an older server, which never says: time passes
        return lambda: setattr(service, "_muted_since", service._muted_since - remote.CLEARED_WAIT_S - 0.1)
    assert run([frame(11), frame(12), later, frame(13)]) == [True, False, False, True]
