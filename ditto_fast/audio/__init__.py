"""Audio stage: decoding/resampling to 16 kHz mono, HuBERT features with Ditto's windowing."""

from .decode import frame_count, load_audio
from .hubert import HubertFeatures

__all__ = ["frame_count", "load_audio", "HubertFeatures"]
