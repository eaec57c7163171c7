"""The pieces a live session uses in process (the Pipecat service's): speech pushed in (PushedSource), frames handed
out as RGB (FrameOutput, yuv.planes_to_rgb as ffmpeg converts), and PCM at a TTS's rate resampled as it streams."""

from __future__ import annotations

import subprocess
import threading
import time

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.audio.resample import BandResampler, Resampler
from ditto_fast.live.frame_output import FrameOutput
from ditto_fast.live.pushed import PushedSource
from ditto_fast.media.yuv import Layout, planes_to_rgb
from support import silent_holes


def _random_planes(layout: Layout, w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    frame = np.empty(layout.shape(w, h), layout.dtype)
    frame[:h] = rng.integers(16 * layout.scale, 236 * layout.scale, (h, w))
    frame[h:] = rng.integers(16 * layout.scale, 241 * layout.scale, frame[h:].shape)
    return frame


def _ffmpeg_rgb(frame: np.ndarray, pix_fmt: str, w: int, h: int) -> np.ndarray:
    out = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "rawvideo", "-pix_fmt", pix_fmt,
                          "-s", f"{w}x{h}", "-colorspace", "bt709", "-i", "-", "-f", "rawvideo", "-pix_fmt", "rgb24",
                          "-"], input=frame.tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8).reshape(h, w, 3)


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv422p"])
def test_plate_planes_become_rgb_as_ffmpeg_converts_them(pix_fmt):
    layout, (w, h) = Layout(pix_fmt), (64, 48)
    frame = _random_planes(layout, w, h)
    got, ref = planes_to_rgb(frame, layout), _ffmpeg_rgb(frame, pix_fmt, w, h)
    assert got.shape == (h, w, 3) and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - ref.astype(int))
    assert diff.max() <= 4 and diff.mean() < 1.5, (diff.max(), diff.mean())


@pytest.mark.parametrize("pix_fmt", ["yuv420p10le", "yuv422p10le"])
def test_ten_bit_planes_give_the_rgb_of_their_eight_bit_levels(pix_fmt):
    deep, (w, h) = Layout(pix_fmt), (64, 48)
    shallow = Layout(pix_fmt.removesuffix("10le"))
    frame = _random_planes(shallow, w, h)
    got = planes_to_rgb(frame.astype(np.uint16) * 4, deep)
    assert np.abs(got.astype(int) - planes_to_rgb(frame, shallow).astype(int)).max() <= 1


def test_pushed_speech_is_taken_in_order_and_an_interruption_drops_the_rest():
    src = PushedSource().start()
    before = time.monotonic()
    src.push(np.arange(100, dtype=np.float32) / 1000)
    src.push(np.arange(100, 250, dtype=np.float32) / 1000)
    assert src.available() == 250 and src.received == 250
    assert np.allclose(src.take(120), np.arange(120) / 1000) and src.taken == 120
    assert before <= src.arrivals.arrival_time(110) <= time.monotonic()
    assert src.taken_at(119) is not None and src.taken_at(120) is None
    assert src.clear() == 130 and src.available() == 0 and src.taken == 250 and src.dropped == 130
    assert len(src.take(50)) == 0                       # nothing left: the stream fills silence
    assert not src.ended and src.error is None
    src.push(np.ones(10, np.float32))
    src.end()
    assert src.ended and len(src.take(100)) == 10       # what was given before the end is still taken
    src.push(np.ones(10, np.float32))                    # after the end: ignored
    assert src.available() == 0
    src.close()


def test_frame_output_hands_on_rgb_and_the_slot_audio_in_order():
    got, ended = [], []
    layout = Layout("yuv420p")
    out = FrameOutput((64, 48), "yuv420p", lambda i, rgb, pcm: got.append((i, rgb.shape, len(pcm))), ended.append)
    frame = _random_planes(layout, 64, 48)
    for _ in range(10):
        out.write(frame, np.zeros(640, np.int16))
    with pytest.raises(ValueError, match="yuv420p frame of 64x48"):
        out.write(frame[:-1], np.zeros(640, np.int16))
    assert out.alive()
    out.close()                                         # what was queued is delivered first
    out.abort()
    assert got == [(i, (48, 64, 3), 640) for i in range(10)] and ended == [True] and not out.alive()
    assert not any(t.name == "live-frames-rgb" for t in threading.enumerate())
    with pytest.raises(ValueError, match="closed"):
        out.write(frame, np.zeros(640, np.int16))


def test_a_consumer_that_fails_fails_the_stream():
    def deliver(i, rgb, pcm):
        raise RuntimeError("the pipeline is gone")

    out = FrameOutput((64, 48), "yuv420p", deliver)
    frame = _random_planes(Layout("yuv420p"), 64, 48)
    out.write(frame, np.zeros(640, np.int16))
    with pytest.raises(RuntimeError, match="the pipeline is gone"):
        for _ in range(50):
            out.write(frame, np.zeros(640, np.int16))
            time.sleep(0.01)
    out.abort()


def test_a_tts_rate_stream_resamples_to_16k_in_any_chunking():
    t = np.arange(24000) / 24000
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 220 * t)], 1)
    pcm = (stereo * 16000).astype("<i2").tobytes()
    r = Resampler(24000, channels=2)
    parts = [r(pcm[i:i + 1001]) for i in range(0, len(pcm), 1001)]   # odd byte counts, partial frames
    out = np.concatenate([*parts, r.flush()])
    assert abs(len(out) - 16000) <= 1
    ref = np.sin(2 * np.pi * 220 * np.arange(len(out)) / 16000) * 16000 / 32768
    assert np.abs(out[200:-200] - ref[200:-200]).max() < 0.01
    assert len(Resampler(16000)(pcm[:3201])) == 1600    # at 16 kHz: as it is (the odd byte waits)


def test_the_speech_band_comes_out_whole_and_in_step_whatever_lumps_the_resamplers_give():
    """A 24 kHz TTS's speech pushed as the model hears it and as it came (48 kHz): the stream carries every band
    sample, three for each 16 kHz one, however the two resamplers lump their output."""
    import soxr

    from ditto_fast.live.stream_audio import StreamAudio

    t = np.arange(48000) / 24000
    pcm = np.round(0.5 * np.sin(2 * np.pi * 9000 * t) * 32767).astype("<i2")        # 9 kHz: above 16 kHz's band
    source = PushedSource()
    speech = BandResampler(24000)
    for i in range(0, len(pcm), 480):                                                # 20 ms a push
        source.push(*speech(pcm[i:i + 480].tobytes()))
    source.push(*speech.flush())
    audio = StreamAudio(source, 0.0, jitter=0.0)
    audio.advance(2.0)
    out = audio.pcm(0, 32000).astype(np.float32) / 32768
    assert len(out) == 96000 and source.received == 32000
    assert abs(np.sqrt(np.mean(out[4800:-4800] ** 2)) - 0.5 / np.sqrt(2)) < 0.01      # all of it, at its level
    spectrum = np.abs(np.fft.rfft(out[4800:-4800]))
    assert abs(np.argmax(spectrum) * 48000 / len(out[4800:-4800]) - 9000) < 20
    ref = soxr.resample(pcm.astype(np.float32) / 32768, 24000, 48000)
    lag = np.argmax(np.correlate(out[:4800], ref[:2400], mode="valid"))
    assert lag < 96                                                                  # in step: under 2 ms off


def test_speech_taken_the_moment_it_comes_has_no_holes_in_its_band():
    """Speech at its pace with nothing to spare (the stream takes each piece as it comes): every take has its band
    whole. The two resamplers give their output in other lumps (up to 25 ms apart); a band that ran short of the
    speech went out with a hole of silence, then late by it (seen: a 2 ms hole in a tone sent at its pace)."""
    from ditto_fast.live.stream_audio import StreamAudio

    t = np.arange(24000 * 2) / 24000
    pcm = np.round(0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    source, speech = PushedSource(), BandResampler(24000)
    audio = StreamAudio(source, 0.0, jitter=0.0)
    for i in range(0, len(pcm), 480):                                                # 20 ms a push
        x, band = speech(pcm[i:i + 480].tobytes())
        assert len(band) == 3 * len(x)
        source.push(x, band)
        audio.advance(source.received / 16000 + 1e-9)                                # all of it, at once
        assert source.available() == 0
    source.push(*speech.flush())
    audio.advance(source.received / 16000 + 1e-9)
    out = audio.pcm(0, audio.length).astype(np.float32) / 32768
    span, holes = silent_holes(out, loud=0.1)                                       # a 440 Hz cycle: 109 samples
    assert not holes, holes[-5:]
    assert abs(np.sqrt(np.mean(span[:-1] ** 2)) - 0.5 / np.sqrt(2)) < 0.01


def test_a_motion_thread_held_up_costs_the_stream_none_of_its_speech(engine, monkeypatch):
    """A busy host: the motion thread (HuBERT and the window loop) is held up for 1.5 s just as a second of speech
    comes, while the output keeps the clock. Every slot still leaves with its speech: the output decides the stream's
    audio itself when motion is late, instead of sending the silence of audio nobody had decided yet."""
    from ditto_fast.live.motion import LiveMotion
    from ditto_fast.live.options import LiveRequest
    from ditto_fast.live.start import plate_pix_fmt, stream_live

    feed, held = LiveMotion.feed, []

    def late_feed(self, x):
        if np.any(x) and not held:
            held.append(time.monotonic())
            time.sleep(1.5)                     # longer than the stream's delay (at most --max-latency, 1 s)
        return feed(self, x)

    monkeypatch.setattr(LiveMotion, "feed", late_feed)
    t = np.arange(16000) / 16000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    source, sent = PushedSource(), []

    def speak() -> None:
        time.sleep(1.2)                             # the avatar idles first: the output's clock is running
        source.push(tone)
        source.end()

    def output(avatar, settings):
        return FrameOutput(avatar.size, plate_pix_fmt(avatar), lambda i, rgb, pcm: sent.append(pcm.copy()))

    threading.Thread(target=speak, daemon=True).start()
    stats = stream_live(engine, LiveRequest(avatar="anchor", max_latency=1.0), source, True, lambda line: None,
                        output=output)
    out = np.concatenate(sent).astype(np.float32) / 32768
    assert held and stats["ended_by"] == "end of source", stats
    loud = np.abs(out) > 0.05                        # the tone's samples (48 kHz): a second of them, in one run
    first, last = int(np.argmax(loud)), len(loud) - int(np.argmax(loud[::-1]))
    assert abs((last - first) - 48000) <= 96, (first, last)
    assert abs(np.sqrt(np.mean(out[first:last] ** 2)) - 0.5 / np.sqrt(2)) < 0.01, "holes of silence in the speech"
