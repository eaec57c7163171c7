"""Stitching network: an MLP that nudges driving keypoints so the pasted face lines up with the source."""

from __future__ import annotations

import torch
import torch.nn as nn

TINY_WIDTHS = {"hidden": (16, 16, 8)}


class StitchNetwork(nn.Module):
    """(kp_source [B,K,3], kp_driving [B,K,3]) -> stitched kp_driving [B,K,3]."""

    def __init__(self, num_kp: int = 21, hidden: tuple[int, ...] = (128, 128, 64)):
        super().__init__()
        self.num_kp = num_kp
        dims = [2 * 3 * num_kp, *hidden]
        layers: list[nn.Module] = []
        for i in range(len(hidden)):
            layers += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(dims[-1], 3 * num_kp + 2))   # expression deltas + (tx, ty)
        self.mlp = nn.Sequential(*layers)

    def forward(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        b, k = kp_source.shape[:2]
        feat = torch.cat([kp_source.reshape(b, -1), kp_driving.reshape(b, -1)], dim=1)
        delta = self.mlp(feat.to(self.mlp[0].weight.dtype)).to(kp_driving.dtype)
        delta_exp = delta[:, : 3 * k].reshape(b, k, 3)
        delta_txy = delta[:, 3 * k: 3 * k + 2].reshape(b, 1, 2)
        out = kp_driving + delta_exp
        out = torch.cat([out[..., :2] + delta_txy, out[..., 2:]], dim=-1)
        return out  # [B, K, 3]


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """num_kp and hidden widths from the MLP's weight shapes."""
    linear_keys = sorted((k for k in sd if k.startswith("mlp.") and k.endswith(".weight")),
                         key=lambda k: int(k.split(".")[1]))
    if not linear_keys:
        raise KeyError("mlp.0.weight")
    out_dim = sd[linear_keys[-1]].shape[0]
    num_kp = (out_dim - 2) // 3
    return {"num_kp": num_kp, "hidden": tuple(sd[k].shape[0] for k in linear_keys[:-1])}
