"""Fused rendering: warp network and SPADE decoder back to back on one device; only the uint8 crop comes back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ditto_fast import models
from ditto_fast.core.graphs import launcher


@dataclass
class Pending:
    """A launched batch: its crops on the host (complete once `done` has fired; None = already complete)."""

    crops: torch.Tensor                  # uint8 [B,512,512,3]
    done: torch.cuda.Event | None


class FusedRenderer:
    """(f_s [B,C,D,64,64] float16, x_s [B,21,3], x_d [B,21,3]) -> uint8 crops [B,512,512,3].

    "Fused" means the warp and the decode run back to back on the device in one call: the 3D
    feature volume f_3d and the warped features never leave it, and the only transfer back is the
    uint8 crop. (The two networks stay separate modules; no kernels are fused.) On CUDA the source
    features travel in, and the crops back, through pinned buffers with non-blocking copies, so
    `launch` returns while the device works and `collect` waits only when the crops are needed.
    `launch_mode` (the engine option `launch`, core/graphs.py): eager, graphs (on CUDA each batch size met twice is
    captured once and replayed: the same crops) or compile.
    """

    def __init__(self, warp_path: str | Path, decoder_path: str | Path, device: torch.device,
                 dtype: torch.dtype = torch.float32, launch: str = "eager"):
        self.device, self.dtype = torch.device(device), dtype
        self.warp = models.load("warp_network", warp_path, self.device, dtype)
        self.decoder = models.load("decoder", decoder_path, self.device, dtype)
        self._own_buffers(launch)

    def _own_buffers(self, launch: str, max_graphs: int = 2) -> None:
        self.launch_mode = launch
        self._launched = launcher(self._warp_decode, launch, self.device, max_graphs=max_graphs)   # None: eager
        self._pinned: dict[tuple, torch.Tensor] = {}
        self._slot = 0

    def twin(self, launch: str | None = None, max_graphs: int = 2) -> FusedRenderer:
        """The same networks with host buffers (and up to `max_graphs` graphs) of its own, for another thread (a live
        session beside a render), launched as this one is or as `launch` says."""
        other = object.__new__(FusedRenderer)
        other.device, other.dtype, other.warp, other.decoder = self.device, self.dtype, self.warp, self.decoder
        other._own_buffers(self.launch_mode if launch is None else launch, max_graphs)
        return other

    @property
    def launches(self) -> dict:
        """What each call did (eager, capture, replay, compile, compiled); empty when launched eagerly."""
        return dict(self._launched.counts) if self._launched is not None else {}

    def _to_device(self, array: np.ndarray, slot: int, name: str, dtype: torch.dtype) -> torch.Tensor:
        """`array` on the device as `dtype`; on CUDA through this slot's pinned buffer with a non-blocking copy
        (a copy from pageable memory would wait for everything queued before it)."""
        host = torch.from_numpy(np.array(array, copy=True))        # memmap rows -> one host copy
        if self.device.type != "cuda":
            return host.to(dtype)
        staging = self._staging((name, slot), host.shape, host.dtype)
        staging.copy_(host)
        return staging.to(self.device, non_blocking=True).to(dtype)

    def _staging(self, key: tuple, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A pinned host buffer per (tensor, slot), reallocated when the batch's shape or dtype changes."""
        buf = self._pinned.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._pinned[key] = torch.empty(shape, dtype=dtype).pin_memory()
        return buf

    @torch.inference_mode()
    def launch(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> Pending:
        """Start warp + decode of one batch; on CUDA this returns at once (kernels and the copy back queued).

        Pending batches use two alternating pinned buffers, so collect a batch before launching the
        second one after it (the render loop keeps at most two in flight).
        """
        slot, self._slot = self._slot, self._slot ^ 1
        f_3d = self._to_device(f_s, slot, "f_s", self.dtype)                 # [B,C,D,64,64]
        kp_s = self._to_device(np.asarray(x_s, np.float32), slot, "x_s", torch.float32)   # [B,21,3]
        kp_d = self._to_device(np.asarray(x_d, np.float32), slot, "x_d", torch.float32)
        if self._launched is None:
            return self._to_host(self._warp_decode(f_3d, kp_s, kp_d), slot)
        return self._launched(f_3d, kp_s, kp_d, take=lambda crop: self._to_host(crop, slot))

    def _warp_decode(self, f_3d: torch.Tensor, kp_s: torch.Tensor, kp_d: torch.Tensor) -> torch.Tensor:
        """The networks on the device: (f_3d [B,C,D,64,64], kp_s, kp_d [B,21,3]) -> uint8 crops [B,512,512,3] (a view
        of [B,3,512,512])."""
        feature = self.warp(f_3d, kp_s, kp_d)                                # [B,256,64,64]
        image = self.decoder(feature)                                        # [B,3,512,512] in 0..1
        return (image.float() * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)

    def _to_host(self, crop: torch.Tensor, slot: int) -> Pending:
        """The crops on their way to this slot's pinned host buffer (on a CPU a contiguous copy of their own: a graph's
        output is written again by its next replay)."""
        if self.device.type != "cuda":
            return Pending(crop.clone(memory_format=torch.contiguous_format), None)
        host = self._staging(("out", slot), crop.shape, torch.uint8)
        host.copy_(crop, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))     # the stream the copy went on, on any cuda:N
        return Pending(host, done)

    @staticmethod
    def collect(pending: Pending, keep: bool = False) -> np.ndarray:
        """The uint8 crops [B,512,512,3] of a launched batch, waiting for the device if it is still busy; `keep`: an
        array of the caller's own (on CUDA a copy: the pinned buffer is reused two launches later)."""
        if pending.done is not None:
            pending.done.synchronize()
        crops = pending.crops.numpy()
        return crops.copy() if keep and pending.done is not None else crops

    def __call__(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        """Warp + decode one batch and wait for it: uint8 crops [B,512,512,3] of the caller's own (on CUDA
        a copy: the pinned buffer is reused two launches later)."""
        return self.collect(self.launch(f_s, x_s, x_d), keep=True)
