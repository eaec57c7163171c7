"""Fused rendering: warp network and SPADE decoder back to back on one device; only the uint8 crop comes back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import models


class FusedRenderer:
    """(f_s [B,C,D,64,64] float16, x_s [B,21,3], x_d [B,21,3]) -> uint8 crops [B,512,512,3].

    "Fused" means the warp and the decode run back to back on the device in one call: the 3D
    feature volume f_3d and the warped features never leave it, and the only transfer back is the
    uint8 crop. (The two networks stay separate modules; no kernels are fused.) On CUDA the source
    features travel in through a pinned staging buffer with a non-blocking copy.
    """

    def __init__(self, warp_path: str | Path, decoder_path: str | Path, device: torch.device,
                 dtype: torch.dtype = torch.float32):
        self.device, self.dtype = torch.device(device), dtype
        self.warp = models.load("warp_network", warp_path, self.device, dtype)
        self.decoder = models.load("decoder", decoder_path, self.device, dtype)
        self.random_weights = any(getattr(m, "ditto_meta", {}).get("random_weights")
                                  for m in (self.warp, self.decoder))
        self._pinned: torch.Tensor | None = None

    def _to_device(self, f_s: np.ndarray) -> torch.Tensor:
        host = torch.from_numpy(np.array(f_s, copy=True))          # memmap rows -> one host copy
        if self.device.type != "cuda":
            return host.to(self.dtype)
        if self._pinned is None or self._pinned.shape != host.shape:
            self._pinned = torch.empty(host.shape, dtype=host.dtype).pin_memory()
        self._pinned.copy_(host)
        return self._pinned.to(self.device, non_blocking=True).to(self.dtype)

    @torch.inference_mode()
    def __call__(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        f_3d = self._to_device(f_s)                                          # [B,C,D,64,64]
        kp_s = torch.from_numpy(np.asarray(x_s, np.float32)).to(self.device)  # [B,21,3]
        kp_d = torch.from_numpy(np.asarray(x_d, np.float32)).to(self.device)
        feature = self.warp(f_3d, kp_s, kp_d)                                # [B,256,64,64]
        image = self.decoder(feature)                                        # [B,3,512,512] in 0..1
        crop = (image.float() * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return crop.contiguous().cpu().numpy()                               # [B,512,512,3]
