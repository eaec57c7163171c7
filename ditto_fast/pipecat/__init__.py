"""A face for Pipecat voice agents, rendered on this machine or by a running serve (`url=`)
(`pip install 'ditto-fast[pipecat]'`): `DittoFastVideoService` after the TTS; `WavSpeaker` (a stand-in TTS that
speaks a WAV) and `Mp4Recorder` (the pipeline's picture and sound to an .mp4) to try it with no network."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("pipecat") is None:
    raise ImportError("ditto_fast.pipecat needs pipecat-ai: pip install 'ditto-fast[pipecat]' (not beside the "
                      "register extra: mediapipe's protobuf excludes pipecat's)")

from ditto_fast.pipecat.recorder import Mp4Recorder  # noqa: E402
from ditto_fast.pipecat.service import DittoFastVideoService  # noqa: E402
from ditto_fast.pipecat.speaker import WavSpeaker  # noqa: E402

__all__ = ["DittoFastVideoService", "Mp4Recorder", "WavSpeaker"]
