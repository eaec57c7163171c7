"""SPADE decoder: the warped feature [B,256,64,64] -> the rendered face crop [B,3,512,512] in 0..1.

Every residual block is modulated by SPADE norms whose scale and shift come from the decoder's own
input feature (the "segmentation map"), resized to each block's resolution.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ditto_fast.models.blocks import NearestUpConv3x3, SNConv2d, conv2d_holding, count_indexed, fuse_blocks, param_dtype

TINY_WIDTHS = {"in_channels": 8, "out_channels": 8, "num_middle": 1, "spade_hidden": 8}

_IN_EPS = 1e-5
_LRELU = 0.2


def modulate(x: torch.Tensor, gamma1: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """instance_norm(x) * gamma1 + beta, per sample; the norm's statistics accumulate in float32."""
    # x, gamma1, beta [B, C, H, W]; batch_norm over one sample == instance norm (native kernel,
    # float accumulation for bf16/fp16 inputs, keeps channels_last)
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        xn = F.batch_norm(x[i:i + 1], None, None, training=True, eps=_IN_EPS)
        torch.addcmul(beta[i:i + 1], xn, gamma1[i:i + 1], out=out[i:i + 1])
    return out


class SPADE(nn.Module):
    """instance_norm(x) * (1 + gamma(seg)) + beta(seg), gamma/beta from a small conv net on seg
    (nearest-resized to x's resolution)."""

    def __init__(self, channels: int, label_channels: int, hidden: int = 128):
        super().__init__()
        self.channels = channels
        self.mlp_shared = nn.Sequential(nn.Conv2d(label_channels, hidden, 3, padding=1), nn.ReLU())
        self.mlp_gamma = nn.Conv2d(hidden, channels, 3, padding=1)
        self.mlp_beta = nn.Conv2d(hidden, channels, 3, padding=1)
        self.mlp_gamma1_beta: nn.Conv2d | None = None  # set by fuse(): [1 + gamma | beta] in one conv
        self.mlp_shared_up: NearestUpConv3x3 | None = None  # set by fold_upsample(): mlp_shared on seg itself

    def forward(self, x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        # x [B, C, H, W], seg [B, L, h, w] with H, W whole multiples of h, w (s times them once folded)
        if self.mlp_shared_up is not None:
            actv = self.mlp_shared_up(seg)
        else:
            actv = self.mlp_shared(seg if seg.shape[2:] == x.shape[2:]
                                   else F.interpolate(seg, size=x.shape[2:], mode="nearest"))
        if self.mlp_gamma1_beta is not None:
            gamma1, beta = self.mlp_gamma1_beta(actv).split(self.channels, dim=1)
        else:
            gamma1, beta = self.mlp_gamma(actv) + 1.0, self.mlp_beta(actv)
        return modulate(x, gamma1, beta)

    @torch.no_grad()
    def fuse(self) -> None:
        if self.mlp_gamma1_beta is not None:
            return  # already fused
        g, b = self.mlp_gamma, self.mlp_beta
        self.mlp_gamma1_beta = conv2d_holding(torch.cat([g.weight, b.weight]), torch.cat([g.bias + 1.0, b.bias]),
                                              g.padding)
        del self.mlp_gamma, self.mlp_beta

    @torch.no_grad()
    def fold_upsample(self, s: int) -> None:
        """Compute mlp_shared at seg's own resolution for an x s times larger (once; see NearestUpConv3x3)."""
        if self.mlp_shared_up is None:
            self.mlp_shared_up = NearestUpConv3x3(self.mlp_shared[0], s)
            del self.mlp_shared


class SPADEResBlock(nn.Module):
    """Residual block: conv(lrelu(SPADE(x))) twice, plus a (learned, when widths differ) shortcut."""

    def __init__(self, fin: int, fout: int, label_channels: int, hidden: int = 128):
        super().__init__()
        fmid = min(fin, fout)
        self.learned_shortcut = fin != fout
        self.conv_0 = SNConv2d(fin, fmid, 3, padding=1)
        self.conv_1 = SNConv2d(fmid, fout, 3, padding=1)
        self.norm_0 = SPADE(fin, label_channels, hidden)
        self.norm_1 = SPADE(fmid, label_channels, hidden)
        if self.learned_shortcut:
            self.conv_s = SNConv2d(fin, fout, 1, bias=False)
            self.norm_s = SPADE(fin, label_channels, hidden)

    def forward(self, x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        shortcut = self.conv_s(self.norm_s(x, seg)) if self.learned_shortcut else x
        dx = self.conv_0(F.leaky_relu(self.norm_0(x, seg), _LRELU, inplace=True))
        dx = self.conv_1(F.leaky_relu(self.norm_1(dx, seg), _LRELU, inplace=True))
        return dx.add_(shortcut)


class SPADEDecoder(nn.Module):
    """feature [B, in_channels, 64, 64] -> image [B, 3, 64*4*upscale, ...] in 0..1."""

    def __init__(self, in_channels: int = 256, out_channels: int = 64, num_middle: int = 6,
                 spade_hidden: int = 128, upscale: int = 2):
        super().__init__()
        hidden = 2 * in_channels
        self.num_middle = num_middle
        self.fc = nn.Conv2d(in_channels, hidden, 3, padding=1)
        for i in range(num_middle):
            self.add_module(f"G_middle_{i}", SPADEResBlock(hidden, hidden, in_channels, spade_hidden))
        self.up_0 = SPADEResBlock(hidden, in_channels, in_channels, spade_hidden)
        self.up_1 = SPADEResBlock(in_channels, out_channels, in_channels, spade_hidden)
        if upscale > 1:
            self.conv_img = nn.Sequential(nn.Conv2d(out_channels, 3 * upscale * upscale, 3, padding=1),
                                          nn.PixelShuffle(upscale))
        else:
            self.conv_img = nn.Conv2d(out_channels, 3, 3, padding=1)

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        seg = feature.to(param_dtype(self)).contiguous(memory_format=torch.channels_last)  # [B, 256, 64, 64]
        x = self.fc(seg)  # [B, 512, 64, 64]
        for i in range(self.num_middle):
            x = getattr(self, f"G_middle_{i}")(x, seg)
        x = self.up_0(F.interpolate(x, scale_factor=2.0, mode="nearest"), seg)  # [B, 256, 128, 128]
        x = self.up_1(F.interpolate(x, scale_factor=2.0, mode="nearest"), seg)  # [B, 64, 256, 256]
        x = self.conv_img(F.leaky_relu(x, _LRELU, inplace=True))
        return torch.sigmoid(x.float()).to(x.dtype).contiguous()  # [B, 3, 512, 512]

    @torch.no_grad()
    def fuse_for_inference(self) -> None:
        """Replace the spectral-norm convs by plain convs with the normalised weights, and compute the
        upsampling blocks' first SPADE convs at the input's resolution."""
        fuse_blocks(self)
        for block, s in ((self.up_0, 2), (self.up_1, 4)):
            for norm in (block.norm_0, block.norm_1, getattr(block, "norm_s", None)):
                if norm is not None:
                    norm.fold_upsample(s)


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """Every width and count of the decoder from its checkpoint tensors."""
    fc = sd["fc.weight"]
    img = sd["conv_img.0.weight"] if "conv_img.0.weight" in sd else sd["conv_img.weight"]
    upscale = round((img.shape[0] / 3) ** 0.5)
    return {
        "in_channels": fc.shape[1],
        "out_channels": sd["up_1.conv_1.weight_orig"].shape[0],
        "num_middle": count_indexed(sd, "G_middle_", ".conv_0.weight_orig"),
        "spade_hidden": sd["up_0.norm_0.mlp_shared.0.weight"].shape[0],
        "upscale": upscale,
    }
