"""Audio-length motion from the LMDM, chained window by window exactly as Ditto's offline loop does it.

Windows of `window` frames start every `window - overlap` frames while frames remain (so a clip of
N frames takes ceil(N / (window - overlap)) windows). Each new window is conditioned on the frame
just before the previous window's overlap tail, its first `overlap` frames are cross-faded into that
tail with weights 0, 1/overlap, ..., (overlap-1)/overlap for the new window, and the pose dims are
smoothed where the seam was made; the whole sequence is smoothed once more at the end.

OnlineMotionSampler chains windows item by item as Ditto's live worker does (Audio2Motion online_mode). A
prefill of `overlap` rows (the conditions of silence) comes first; new rows are held until `window - overlap`
have come, then windows run while a whole window is available. The first window only sets `d0` (its smoothed
frame 0) and emits nothing. Each later window cross-fades its frames [overlap - fuse, overlap) into the last
fuse = min(overlap, window - overlap) frames made, appends its last `window - overlap` and smooths the seam; the
frames that become final are emitted. Emitted frame i stands for pushed row i + max(0, window - 2 * overlap)
(Ditto never emits the first rows when overlap < window / 2). At the end the rest runs as one window padded with
its last row; for overlap > window / 2 Ditto emits up to 2 * overlap - window frames past the last pushed row.
Motion and conditions older than 2 * window rows are dropped.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ditto_fast.core.smoothing import smooth_range
from ditto_fast.motion.keypoints import SMOOTHED_DIMS

# sample_window(cond_frame [1,D], cond [1,W,C], generator) -> motion [1,W,D]
WindowSampler = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def sample_padded(sample_window: WindowSampler, cond_frame: np.ndarray, chunk: np.ndarray, window: int,
                  generator: torch.Generator, device: torch.device, dtype: torch.dtype) -> np.ndarray:
    """One window as numpy: cond_frame [D], chunk [<=window, C] padded with its last row -> motion [window, D]."""
    if len(chunk) < window:
        chunk = np.concatenate([chunk, np.repeat(chunk[-1:], window - len(chunk), 0)], 0)
    pred = sample_window(
        torch.from_numpy(np.ascontiguousarray(cond_frame[None], np.float32)).to(device, dtype),  # [1, D]
        torch.from_numpy(np.ascontiguousarray(chunk[None], np.float32)).to(device, dtype),       # [1, W, C]
        generator,
    )
    return pred[0].float().cpu().numpy()  # [W, D]


def window_starts(n: int, window: int = 80, overlap: int = 10) -> list[int]:
    """Start frame of every window the loop samples for n frames (one more while frames remain)."""
    return list(range(0, n, window - overlap))


class MotionSampler:
    """Turns per-frame conditions [N,C] into per-frame motion [N,D] with a window sampler."""

    def __init__(self, sample_window: WindowSampler, window: int = 80, overlap: int = 10,
                 smooth_window: int = 3, smooth_dims: int = SMOOTHED_DIMS,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        if not 0 < overlap < window:
            raise ValueError(f"overlap must be in 1..{window - 1}, got {overlap}")
        self.sample_window = sample_window
        self.window, self.overlap = window, overlap
        self.smooth_window, self.smooth_dims = smooth_window, smooth_dims
        self.device, self.dtype = torch.device(device), dtype

    def _sample(self, cond_frame: np.ndarray, chunk: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """One window: cond_frame [D], chunk [<=W, C] padded with its last row -> motion [W, D]."""
        return sample_padded(self.sample_window, cond_frame, chunk, self.window, generator, self.device, self.dtype)

    def __call__(self, cond: np.ndarray, source_motion: np.ndarray, generator: torch.Generator,
                 progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Motion [N, D] for conditions [N, C] from the source's motion [D]; `progress(frames made, N)` is called
        before the first window and after each."""
        n = cond.shape[0]  # cond [N, C], source_motion [D]
        if n < 1:
            raise ValueError("no condition frames to sample motion for")
        w, ov, k = self.window, self.overlap, self.smooth_window
        step = w - ov                                                     # new frames per window
        fade = (np.arange(ov, dtype=np.float32) / ov)[:, None]            # weight of the new window
        starts = window_starts(n, w, ov)
        out = np.empty((w + step * (len(starts) - 1), source_motion.size), np.float32)
        cond_frame = source_motion.astype(np.float32)
        length = 0                                                        # frames of `out` made so far
        if progress is not None:
            progress(0, n)
        for start in starts:
            pred = self._sample(cond_frame, cond[start:start + w], generator)
            if length == 0:
                out[:w] = pred
                length = w
                smooth_range(out[:length], 0, length, k, self.smooth_dims)
            else:
                tail = out[length - ov:length]
                tail[:] = tail * (1 - fade) + pred[:ov] * fade
                out[length:length + step] = pred[ov:]
                length += step
                # the seam and the first frame after it
                smooth_range(out[:length], length - step - ov, length - step + 1, k, self.smooth_dims)
            cond_frame = out[length - ov - 1].copy()                      # conditions the next window
            if progress is not None:
                progress(min(length, n), n)
        out = out[:n]
        smooth_range(out, 0, n, k, self.smooth_dims)
        return out  # [N, D]


class OnlineMotionSampler:
    """Motion for a stream of condition rows, item by item, exactly as Ditto's live audio-to-motion worker makes it
    (see the module docstring); `real_frames` counts the emitted frames that stand for pushed rows."""

    def __init__(self, sample_window: WindowSampler, overlap: int, window: int = 80, smooth_window: int = 3,
                 smooth_dims: int = SMOOTHED_DIMS, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32):
        if not 0 < overlap < window:
            raise ValueError(f"overlap must be in 1..{window - 1}, got {overlap}")
        self.sample_window = sample_window
        self.window, self.overlap = window, overlap
        self.step = window - overlap                       # new frames per window (Ditto's valid_clip_len)
        self.fuse = min(overlap, self.step)                # frames cross-faded at each seam
        self.fade = (np.arange(self.fuse, dtype=np.float32) / self.fuse)[:, None]  # weight of the new window
        self.smooth_window, self.smooth_dims = smooth_window, smooth_dims
        self.device, self.dtype = torch.device(device), dtype
        self.d0: np.ndarray | None = None
        self._started = False

    def start(self, source_motion: np.ndarray, prefill: np.ndarray, generator: torch.Generator) -> None:
        """Begin a stream from the source's motion [D] and `overlap` prefill condition rows [overlap, C]."""
        prefill = np.asarray(prefill, np.float32)
        if prefill.ndim != 2 or prefill.shape[0] != self.overlap:
            raise ValueError(f"prefill must be [{self.overlap}, C], got {prefill.shape}")
        self._generator = generator
        self._cond_frame = np.asarray(source_motion, np.float32).reshape(-1)   # [D]
        self._dim = self._cond_frame.size
        self._feats = prefill.copy()                       # [<= 2 * window, C] between pushes: conditions held
        self._pending = prefill[:0].copy()                 # [< step + item, C] rows not yet released
        self._res: np.ndarray | None = None                # [<= 2 * window, D] motion made, fused and smoothed
        self._next = 0                                     # row of _feats where the next window starts
        self._emit_at: int | None = None                   # frame of _res emitted next (None before window 1)
        self.d0 = None
        self.rows_in = 0                                   # condition rows pushed
        self.frames_out = 0                                # motion frames emitted
        self._started, self._ended = True, False

    def push(self, features: np.ndarray) -> np.ndarray:
        """Condition rows [k, C] of the stream -> the motion frames [m, D] they complete (m may be 0)."""
        self._check_open()
        features = np.asarray(features, np.float32)
        if features.ndim != 2 or features.shape[1] != self._feats.shape[1]:
            raise ValueError(f"features must be [k, {self._feats.shape[1]}], got {features.shape}")
        self.rows_in += len(features)
        self._pending = np.concatenate([self._pending, features], 0)
        if len(self._pending) < self.step:
            return np.zeros((0, self._dim), np.float32)
        return self._release(end=False)

    def finish(self) -> np.ndarray:
        """End of the stream: the rest of the motion [m, D], the last window padded with its last row."""
        self._check_open()
        self._ended = True
        return self._release(end=True)

    @property
    def real_frames(self) -> int:
        """How many of the frames emitted so far stand for pushed rows (the rest come from the final padding)."""
        return max(0, min(self.frames_out, self.rows_in - max(0, self.step - self.overlap)))

    def _check_open(self) -> None:
        if not self._started:
            raise RuntimeError("call start() before push() or finish()")
        if self._ended:
            raise RuntimeError("the stream has finished; call start() for a new one")

    def _release(self, end: bool) -> np.ndarray:
        """Move the pending rows into the window buffer and run every window now possible -> frames [m, D]."""
        self._feats = np.concatenate([self._feats, self._pending], 0)
        self._pending = self._pending[:0]
        out = []
        while True:
            chunk = self._feats[self._next:self._next + self.window]      # [<= W, C]
            if len(chunk) == 0 or (len(chunk) < self.window and not end):
                break
            real = self.step if len(chunk) == self.window else len(chunk)
            self._run_window(chunk)
            self._next += real
            if self._emit_at is None:                      # first window: d0 only, then straight to the next
                self._emit_at = len(self._res) - self.fuse
                self.d0 = self._res[0].copy()
                continue
            out.append(self._res[self._emit_at:self._emit_at + real])
            self._emit_at += real
            cut = max(0, len(self._res) - 2 * self.window)
            self._res, self._emit_at = self._res[cut:], self._emit_at - cut
            if self._next >= len(self._feats):
                break
        cut = max(0, len(self._feats) - 2 * self.window)
        self._feats, self._next = self._feats[cut:], self._next - cut
        frames = np.concatenate(out, 0) if out else np.zeros((0, self._dim), np.float32)
        self.frames_out += len(frames)
        return frames  # [m, D]

    def _run_window(self, chunk: np.ndarray) -> None:
        """Sample one window from chunk [<= W, C], fuse it into the motion made, smooth, pick the next cond frame."""
        pred = sample_padded(self.sample_window, self._cond_frame, chunk, self.window, self._generator,
                             self.device, self.dtype)          # [W, D]
        k, dims = self.smooth_window, self.smooth_dims
        if self._res is None:
            res = pred
            smooth_range(res, 0, len(res), k, dims)
        else:
            res = np.concatenate([self._res, pred[self.overlap:]], 0)      # [L + step, D]
            seam = slice(len(self._res) - self.fuse, len(self._res))
            res[seam] = self._res[seam] * (1 - self.fade) + pred[self.overlap - self.fuse:self.overlap] * self.fade
            n = len(res)
            smooth_range(res, n - self.step - self.fuse, n - self.step + 1, k, dims)
        self._res = res
        self._cond_frame = res[len(res) - self.overlap - 1].copy()         # conditions the next window
