"""Live speech -> 25 fps motion as it arrives: HuBERT per chunk as Ditto's online path computes it, each feature row's
conditions, and Ditto's online window loop (motion/sampling.py OnlineMotionSampler). Each motion frame leaves with
its place on the stream (its motion index: stream sample // 640), so frames after a skip stay where they belong."""

from __future__ import annotations

import collections
import time
from fractions import Fraction

import numpy as np
import torch

from ditto_fast.audio.decode import SAMPLES_PER_FRAME
from ditto_fast.audio.stream_features import CHUNK_HOP, StreamFeatures
from ditto_fast.avatar import Avatar
from ditto_fast.core.config import MotionConfig
from ditto_fast.media.rates import MOTION_FPS
from ditto_fast.media.timeline import mirror_positions, source_positions
from ditto_fast.motion.conditions import build_conditions, condition_parts
from ditto_fast.motion.ddim import DDIMSampler
from ditto_fast.motion.keypoints import info_to_motion
from ditto_fast.motion.sampling import OnlineMotionSampler


class LiveMotion:
    """Stream samples in, (motion index, motion [265]) out, in order; `seconds` holds the time spent in HuBERT
    ("audio_features") and in the LMDM windows ("motion"). `denoise`: the engine's DDIM step as it launches it
    (motion/ddim.py Denoiser; None: the network called as it is); `sample_window`: the window sampler to call in place
    of one of its own (the windows an engine's sessions share on a GPU)."""

    def __init__(self, hubert, lmdm: torch.nn.Module, settings: MotionConfig, avatar: Avatar, emotion: np.ndarray,
                 seed: int, steps: int, overlap: int, device: torch.device, denoise=None, sample_window=None):
        self.hubert, self.avatar, self.emotion = hubert, avatar, np.asarray(emotion, np.float32)  # emotion [8]
        self.parts = condition_parts(lmdm.cond_dim, hubert.hidden_size)
        self.seconds = {"audio_features": 0.0, "motion": 0.0}
        sample_window = sample_window or DDIMSampler(lmdm, steps, settings.guidance, denoise)
        self.sampler = OnlineMotionSampler(sample_window, overlap=overlap, window=lmdm.seq_len,
                                           smooth_window=settings.smooth_window, device=device)
        t0 = time.perf_counter()
        silence = hubert.features(np.zeros(overlap * SAMPLES_PER_FRAME, np.float32))        # [overlap, H], as Ditto
        self.seconds["audio_features"] += time.perf_counter() - t0
        gen = torch.Generator(device=device).manual_seed(int(seed))
        self.sampler.start(info_to_motion(avatar.frame_info(0)), self._conditions(silence, np.zeros(overlap, np.int64)),
                           gen)
        self.features = StreamFeatures(hubert)
        self.next_row = 0                       # motion index of the next feature row
        self.rows: collections.deque = collections.deque()     # motion index of each pushed row not yet emitted

    @property
    def d0(self) -> np.ndarray | None:
        """The motion the stitch is relative to (the first window's first frame), once the first window ran."""
        return self.sampler.d0

    def _conditions(self, feats: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """[k, C] conditions of feature rows [k, H] at motion indices `rows` [k] (eye features of the source frame
        at each row's time, as a render takes them)."""
        a = self.avatar
        src = mirror_positions(source_positions(rows, Fraction(MOTION_FPS), a.rate), a.n_frames)
        return build_conditions(feats, self.parts, np.repeat(self.emotion[None], len(rows), 0), a.eye_open,
                                a.eye_ball, a.sc, src_idx=src)

    def _push(self, chunks: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
        out = []
        for feats in chunks:                                     # [5, H] each
            rows = np.arange(self.next_row, self.next_row + len(feats), dtype=np.int64)
            self.next_row += len(feats)
            self.rows.extend(rows.tolist())
            t0 = time.perf_counter()
            frames = self.sampler.push(self._conditions(feats, rows))     # [m, 265]
            self.seconds["motion"] += time.perf_counter() - t0
            out += self._emitted(frames)
        return out

    def _emitted(self, frames: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Pair emitted frames with their rows; frames past the pushed rows (the last window's padding) are dropped."""
        n = min(len(frames), len(self.rows))
        return [(self.rows.popleft(), frames[k]) for k in range(n)]

    def feed(self, samples: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """The motion frames that the stream's next samples [n] complete."""
        t0 = time.perf_counter()
        chunks = self.features.feed(samples)
        self.seconds["audio_features"] += time.perf_counter() - t0
        return self._push(chunks)

    def finish(self) -> list[tuple[int, np.ndarray]]:
        """The rest at the end of the stream: the last chunk (padded as Ditto pads it) and the loop's last window."""
        t0 = time.perf_counter()
        chunks = self.features.flush()
        self.seconds["audio_features"] += time.perf_counter() - t0
        out = self._push(chunks)
        t0 = time.perf_counter()
        rest = self.sampler.finish()
        self.seconds["motion"] += time.perf_counter() - t0
        return out + self._emitted(rest)

    def skip_to(self, sample: int) -> None:
        """Go on from stream sample `sample` (a multiple of a chunk's hop): the audio before it gets no motion (the
        session fell too far behind); the window loop goes on from the rows it has."""
        if sample % CHUNK_HOP:
            raise ValueError(f"a skip lands on a chunk boundary ({CHUNK_HOP} samples), got {sample}")
        self.features = StreamFeatures(self.hubert)
        self.next_row = sample // SAMPLES_PER_FRAME
