"""Audio stage: decoding/resampling to 16 kHz mono, HuBERT features with Ditto's windowing."""

from ditto_fast.audio.decode import frame_count, load_audio
from ditto_fast.audio.hubert import HubertFeatures

__all__ = ["frame_count", "load_audio", "HubertFeatures"]
