"""Motion extractor: a ConvNeXt-V2 that reads head pose bins, translation, expression, scale and canonical keypoints off a face crop."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

TINY_WIDTHS = {"dims": (8, 16, 32, 64), "depths": (1, 1, 1, 1)}


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over the channel axis of [B, C, H, W], statistics in float32."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.float().permute(0, 2, 3, 1), self.weight.shape, self.weight.float(),
                         self.bias.float(), self.eps)
        return y.permute(0, 3, 1, 2).to(x.dtype)


class ChannelsLastLayerNorm(nn.LayerNorm):
    """LayerNorm over the last axis with float32 statistics."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(),
                            self.eps).to(x.dtype)


class GRN(nn.Module):
    """Global response normalisation over the spatial axes of [B, H, W, C] (ConvNeXt-V2)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, channels))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        g = torch.linalg.vector_norm(xf, ord=2, dim=(1, 2), keepdim=True)  # [B, 1, 1, C]
        n = g / (g.mean(dim=-1, keepdim=True) + self.eps)
        return (self.gamma.float() * (xf * n) + self.beta.float() + xf).to(x.dtype)


class Block(nn.Module):
    """ConvNeXt-V2 block: depthwise 7x7 -> LN -> 1x1 up (4x) -> GELU -> GRN -> 1x1 down, plus residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = ChannelsLastLayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, C, H, W]
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.grn(F.gelu(self.pwconv1(self.norm(y)))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtV2(nn.Module):
    """Backbone plus the seven linear heads, under the checkpoint's `detector.*` names."""

    def __init__(self, dims: tuple[int, ...], depths: tuple[int, ...], num_kp: int, num_bins: int):
        super().__init__()
        self.downsample_layers = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, dims[0], kernel_size=4, stride=4), ChannelsFirstLayerNorm(dims[0]))])
        for i in range(len(dims) - 1):
            self.downsample_layers.append(nn.Sequential(
                ChannelsFirstLayerNorm(dims[i]), nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2)))
        self.stages = nn.ModuleList([nn.Sequential(*[Block(d) for _ in range(n)]) for d, n in zip(dims, depths)])
        self.norm = ChannelsLastLayerNorm(dims[-1], eps=1e-6)
        width = dims[-1]
        self.fc_kp = nn.Linear(width, 3 * num_kp)
        self.fc_scale = nn.Linear(width, 1)
        self.fc_pitch = nn.Linear(width, num_bins)
        self.fc_yaw = nn.Linear(width, num_bins)
        self.fc_roll = nn.Linear(width, num_bins)
        self.fc_t = nn.Linear(width, 3)
        self.fc_exp = nn.Linear(width, 3 * num_kp)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled, normalised features [B, dims[-1]] of an image batch [B, 3, H, W]."""
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.norm(x.float().mean(dim=(-2, -1)).to(x.dtype))


class MotionExtractor(nn.Module):
    """image [B,3,256,256] RGB 0..1 -> dict of raw head outputs (float32): pitch/yaw/roll [B,66], t [B,3], exp [B,63], scale [B,1], kp [B,63]."""

    def __init__(self, dims: tuple[int, ...] = (96, 192, 384, 768), depths: tuple[int, ...] = (3, 3, 9, 3),
                 num_kp: int = 21, num_bins: int = 66):
        super().__init__()
        if len(dims) != len(depths):
            raise ValueError(f"dims {dims} and depths {depths} must have the same length")
        self.detector = ConvNeXtV2(tuple(dims), tuple(depths), num_kp, num_bins)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every head's output, named as its `fc_*` layer (the keys of x_s_info)."""
        det = self.detector
        feat = det.features(image.to(det.fc_kp.weight.dtype))  # [B, C]
        return {name.removeprefix("fc_"): head(feat).float() for name, head in det.named_children()
                if name.startswith("fc_")}


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """Stage widths and depths, keypoint count and pose-bin count from checkpoint tensors."""
    n_stages = len({k.split(".")[2] for k in sd if k.startswith("detector.downsample_layers.")})
    if n_stages == 0:
        raise KeyError("detector.downsample_layers.0.0.weight")
    dims = [int(sd["detector.downsample_layers.0.0.weight"].shape[0])]
    dims += [int(sd[f"detector.downsample_layers.{i}.1.weight"].shape[0]) for i in range(1, n_stages)]
    depths = [len({k.split(".")[3] for k in sd if k.startswith(f"detector.stages.{i}.")}) for i in range(n_stages)]
    return {"dims": tuple(dims), "depths": tuple(depths),
            "num_kp": int(sd["detector.fc_kp.weight"].shape[0]) // 3,
            "num_bins": int(sd["detector.fc_pitch.weight"].shape[0])}
