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

    from ditto_fast.pipecat import DittoFastVideoService, remote
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
        service = DittoFastVideoService("anchor", url="http://127.0.0.1:9")._face     # the remote face
        heard = []

        async def push_frame(f, *_):
            if isinstance(f, OutputAudioRawFrame):
                heard.append(isinstance(f, TTSAudioRawFrame) and any(f.audio))

        async def go():
            service.out.push_frame, service._decode = push_frame, lambda unit: []
            service._ws = ws = Socket([m(service) if callable(m) else m for m in messages])
            await service._show(frame(10))
            await service._interrupt(ws)
            assert ws.sent == [json.dumps({"clear": True})]
            service._ws = None                          # ended here: the messages' end is no loss
            await service._read(ws)

        asyncio.run(go())
        return heard

    cleared = json.dumps({"event": "cleared", "frame": 13})
    assert run([frame(11), cleared, frame(12), frame(13), frame(14)]) == [True, False, False, False, True]

    def later(service):                                 # an older server, which never says: time passes
        return lambda: setattr(service._mute, "deadline", service._mute.deadline - remote.CLEARED_WAIT_S - 0.1)
    assert run([frame(11), frame(12), later, frame(13)]) == [True, False, False, True]


def test_the_face_a_serve_renders_is_a_DittoFastVideoService_that_says_its_state():
    """`url=` makes no other class: the service is the one subclassed, and says its state in a live session's
    words (starting until its session opens; ended once ended here)."""
    import asyncio

    from ditto_fast.live.states import STATES
    from ditto_fast.pipecat import DittoFastVideoService

    class Named(DittoFastVideoService):
        pass

    video = Named("anchor", url="http://127.0.0.1:9", token="t", emotion="neutral")
    assert type(video) is Named and isinstance(video, DittoFastVideoService)
    assert video.state == "starting" and video.state in STATES and video.session is None
    asyncio.run(video._face.end(graceful=False))
    assert video.state == "ended"


# ----------------------------------------------------------------------------- an agent in this process
class Sink:
    """The pipeline's end as a Pipecat processor: each frame that reaches it as (kind, sample rate or size, samples
    or bytes), kinds "image", "speech" (a TTSAudioRawFrame), "silence" (other audio) or the frame's class name."""

    def __new__(cls):
        from pipecat.frames.frames import OutputAudioRawFrame, OutputImageRawFrame, TTSAudioRawFrame
        from pipecat.processors.frame_processor import FrameProcessor

        class _Sink(FrameProcessor):
            def __init__(self):
                super().__init__()
                self.seen: list[tuple] = []

            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                if isinstance(frame, OutputImageRawFrame):
                    self.seen.append(("image", tuple(frame.size), len(frame.image)))
                elif isinstance(frame, OutputAudioRawFrame):
                    pcm = np.frombuffer(frame.audio, np.int16)
                    kind = "speech" if isinstance(frame, TTSAudioRawFrame) else "silence"
                    self.seen.append((kind, frame.sample_rate, pcm))
                else:
                    self.seen.append((type(frame).__name__, None, None))
                await self.push_frame(frame, direction)

            def kinds(self, since: int = 0) -> list[str]:
                return [s[0] for s in self.seen[since:]]

        return _Sink()


def run_agent(video, wav, drive) -> tuple[list, list[str]]:
    """[WavSpeaker(wav), a tap, video, Sink] run by Pipecat's worker in this process until `drive(worker, sink, tap)`
    ends it (`tap.audio`: the TTS audio frames that went into the service); (what reached the sink, the errors)."""
    import asyncio

    from pipecat.frames.frames import TTSAudioRawFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from ditto_fast.pipecat import WavSpeaker

    class Tap(FrameProcessor):
        def __init__(self):
            super().__init__()
            self.audio = 0

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            self.audio += isinstance(frame, TTSAudioRawFrame)
            await self.push_frame(frame, direction)

    sink, tap = Sink(), Tap()
    errors: list[str] = []

    async def main():
        worker = PipelineWorker(Pipeline([WavSpeaker(wav, lead=0.2), tap, video, sink]), enable_rtvi=False)

        @worker.event_handler("on_pipeline_error")
        async def on_error(_worker, frame):
            errors.append(frame.error)

        async def driven():
            try:
                await drive(worker, sink, tap)
            except BaseException:
                await worker.cancel(reason="the test failed")        # the pipeline ends with it
                raise

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await asyncio.wait_for(asyncio.gather(runner.run(), driven()), 400)

    asyncio.run(main())
    return sink.seen, errors


async def until(test, timeout: float = 120.0, what: str = "") -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def answer(seen: list, start: int) -> list:
    """What reached the sink from `start` up to the first TTSStoppedFrame after it (an answer), that frame included."""
    kinds = [s[0] for s in seen]
    return seen[start:kinds.index("TTSStoppedFrame", start) + 1]


def test_an_agent_speaks_on_without_its_face_while_its_server_is_gone_and_gets_it_back(serving, tts_wav):
    """The server killed mid-answer: one error; the rest of that answer, its end and the next answer pass on as the
    TTS gave them; the server back on its port: the answer after that has its face, from a new session."""
    import asyncio
    import copy
    import signal

    from pipecat.frames.frames import EndFrame, TTSSpeakFrame

    from ditto_fast.pipecat import DittoFastVideoService

    server = serving()
    again = copy.copy(server)                          # the same server, started anew on the same port
    tts_samples = sf.info(tts_wav).frames
    video = DittoFastVideoService("anchor", url=f"http://127.0.0.1:{server.port}")
    marks, sessions = {}, []

    async def drive(worker, sink, tap):
        await until(lambda: sink.kinds().count("image") >= 10, what="the idle face")
        sessions.append(video.session)
        marks["a"] = len(sink.seen)
        await worker.queue_frame(TTSSpeakFrame("the first answer"))
        await until(lambda: tap.audio >= 50, what="a second of the first answer")     # 2 s of it still to come
        await asyncio.to_thread(server.stop, signal.SIGKILL)
        await until(lambda: "TTSStoppedFrame" in sink.kinds(marks["a"]), what="the first answer's end")
        marks["b"] = len(sink.seen)
        await worker.queue_frame(TTSSpeakFrame("an answer while the server is gone"))
        await until(lambda: "TTSStoppedFrame" in sink.kinds(marks["b"]), what="the second answer's end")
        await asyncio.to_thread(again.start)
        marks["c"] = len(sink.seen)
        await worker.queue_frame(TTSSpeakFrame("the server is back"))
        await until(lambda: "TTSStoppedFrame" in sink.kinds(marks["c"]), what="the third answer's end")
        sessions.append(video.session)
        await worker.queue_frame(EndFrame())

    try:
        seen, errors = run_agent(video, tts_wav, drive)
    finally:
        if again.proc is not None and again.proc.poll() is None:
            again.stop(signal.SIGKILL)
    assert len(errors) == 1 and "\n" not in errors[0] and "face" in errors[0], errors      # said once
    first = answer(seen, marks["a"])
    raw = [s for s in first if s[0] == "speech" and s[1] == 24000]           # the TTS's own frames, passed on
    assert raw and sum(len(s[2]) for s in raw) < tts_samples, len(raw)
    second = answer(seen, marks["b"])
    assert [s[0] for s in second if s[0] not in ("speech", "image", "silence")] == ["TTSStartedFrame",
                                                                                  "TTSStoppedFrame"]
    speech = [s for s in second if s[0] in ("speech", "silence")]
    assert all(s[0] == "speech" and s[1] == 24000 for s in speech)           # as the TTS gave it, all of it
    assert sum(len(s[2]) for s in speech) == tts_samples and len(speech) == -(-tts_samples // 480)
    third = answer(seen, marks["c"])
    assert sessions[1] is not None and sessions[1] != sessions[0], sessions  # a new session
    images = [s for s in third if s[0] == "image"]
    assert images and all(s[1] == (1920, 1080) for s in images)
    face = [s for s in third if s[0] == "speech"]
    assert all(s[1] == 48000 for s in face) and abs(len(face) - 3.0 * 25) <= 5, len(face)


def test_a_url_that_is_not_a_serve_is_one_line_and_the_agent_speaks(tts_wav):
    """A web server that is no ditto-fast serve (404, HTML): one error line that says so; the speech passes on."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from pipecat.frames.frames import EndFrame, TTSSpeakFrame

    from ditto_fast.pipecat import DittoFastVideoService

    class NotFound(BaseHTTPRequestHandler):
        def _answer(self):
            body = b"<html><body><h1>404 Not Found</h1></body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args):
            pass

    web = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}"

    video, states = DittoFastVideoService("anchor", url=url), []

    async def drive(worker, sink, tap):
        await until(lambda: video.state == "failed", what="the face failed")
        states.append(video.state)
        await worker.queue_frames([TTSSpeakFrame("hello"), EndFrame()])

    try:
        seen, errors = run_agent(video, tts_wav, drive)
    finally:
        web.shutdown()
    assert states == ["failed"] and video.state == "ended"
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert f"{url} is not a ditto-fast serve" in errors[0], errors
    speech = [s for s in seen if s[0] == "speech"]
    assert {s[1] for s in speech} == {24000} and sum(len(s[2]) for s in speech) == sf.info(tts_wav).frames


def test_a_slow_agent_hears_all_of_an_answer_before_its_end(serving, tts_wav):
    """An agent that takes longer to decode a frame than the frame lasts (a busy machine) falls behind the server:
    every sample of the answer still comes out of the service, and before the TTS's end."""
    import time

    import soxr
    from pipecat.frames.frames import EndFrame, TTSSpeakFrame

    from ditto_fast.pipecat import DittoFastVideoService

    server = serving()
    video = DittoFastVideoService("anchor", url=f"http://127.0.0.1:{server.port}")
    decode = video._face._decode

    def slow_decode(unit):
        time.sleep(0.1)                             # 10 frames a second where 25 come
        return decode(unit)
    video._face._decode = slow_decode

    async def drive(worker, sink, tap):
        await until(lambda: sink.kinds().count("image") >= 5, what="the idle face")
        await worker.queue_frames([TTSSpeakFrame("hello"), EndFrame()])

    seen, errors = run_agent(video, tts_wav, drive)
    assert not errors, errors
    kinds = [s[0] for s in seen]
    last = len(kinds) - 1 - kinds[::-1].index("speech")
    assert kinds.index("TTSStoppedFrame") > last                               # its end after all of it
    # every sample of the answer came out (the stream may put silence between its pieces where the TTS was late)
    audio = [k for k in kinds if k in ("speech", "silence")]
    runs = sum(1 for i, k in enumerate(audio) if k == "speech" and (i == 0 or audio[i - 1] != "speech"))
    out = sum(len(s[2]) for s in seen if s[0] == "speech")
    pushed = 2 * sf.info(tts_wav).frames                                       # at the stream's 48 kHz
    assert pushed - 2 * 1920 <= out <= pushed + 2 * runs * 1920, (out / 48000, pushed / 48000, runs)


def test_frames_that_come_as_their_speech_alone_are_heard_and_the_pictures_go_on():
    """A server whose client fell behind sends frames up to the next key frame as their speech alone (no access
    unit): each is one audio frame out, and the pictures decode again from the key frame."""
    import asyncio
    from fractions import Fraction

    import av
    from pipecat.frames.frames import OutputAudioRawFrame, OutputImageRawFrame

    from ditto_fast.live.relay import _h264
    from ditto_fast.pipecat import DittoFastVideoService
    from ditto_fast.serve.live.socket import media_message

    codec, units = _h264((64, 48), Fraction(25), "veryfast"), []
    for i in range(6):
        f = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 30 * i, np.uint8), format="rgb24").reformat(
            format="yuv420p")
        if i in (0, 4):
            f.pict_type = av.video.frame.PictureType.I
        units.append(b"".join(bytes(p) for p in codec.encode(f)))
    pcm = np.full(1920, 800, "<i2").tobytes()
    service, out = DittoFastVideoService("anchor", url="http://127.0.0.1:9")._face, []

    async def push_frame(f, *_):
        if isinstance(f, OutputImageRawFrame):
            out.append(("image", (tuple(f.size), int(np.frombuffer(f.image, np.uint8).mean()))))
        elif isinstance(f, OutputAudioRawFrame):
            out.append(("audio", len(f.audio)))

    async def go():
        service.out.push_frame = push_frame
        for i, unit in enumerate(units):
            skipped = i in (1, 2, 3)
            await service._show(media_message((i, b"" if skipped else unit, i in (0, 4), pcm), 25))

    asyncio.run(go())
    assert [k for k, _ in out] == ["image", "audio"] * 6                   # skipped: the last picture stays
    assert sum(n for k, n in out if k == "audio") == 6 * len(pcm)
    images = [v for k, v in out if k == "image"]
    assert {size for size, _ in images} == {(64, 48)}
    shade = [level for _, level in images]                  # the pictures decode again from the key frame on
    assert shade[1:4] == [shade[0]] * 3 and abs(shade[4] - 120) <= 4 and abs(shade[5] - 150) <= 4, shade


def test_the_example_records_an_agent_whose_face_a_running_serve_renders(serving, tts_wav, tmp_path):
    """examples/pipecat_agent.py --url: the .mp4 has the face at the avatar's size and the answer's speech; the line
    it prints says when the face first spoke after the TTS's first audio."""
    import imageio_ffmpeg
    from test_pipecat_video import assert_face_spoke_after_the_speech

    server = serving()
    out = tmp_path / "agent.mp4"
    res = subprocess.run([sys.executable, str(REPO / "examples" / "pipecat_agent.py"), "--avatar", "anchor", "--audio",
                          str(tts_wav), "-o", str(out), "--url", f"http://127.0.0.1:{server.port}", "--idle", "0.5"],
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_face_spoke_after_the_speech(res.stdout)
    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(out), "-f", "null", "-"],
                           capture_output=True, text=True)
    streams = [ln for ln in probe.stderr.splitlines() if "Stream #0" in ln and "->" not in ln]
    assert any("Video: h264" in ln and "1920x1080" in ln for ln in streams), streams
    frames = int(probe.stderr.replace("\r", "\n").split("frame=")[-1].split()[0])
    assert frames >= 3.0 * 25, frames                           # the whole answer, and the idle before it
