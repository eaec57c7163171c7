"""Appearance feature extractor: a source image -> its 3D appearance feature volume f_s."""

from __future__ import annotations

import torch
import torch.nn as nn

from ditto_fast.models.blocks import DownBlock2d, ResBlock3d, SameBlock2d, count_indexed, fuse_blocks, param_dtype

TINY_WIDTHS = {"block_expansion": 4, "max_features": 16, "reshape_channel": 4, "num_resblocks": 1}


class AppearanceExtractor(nn.Module):
    """image [B,3,256,256] in 0..1 -> f_s [B, reshape_channel, max_features/reshape_channel, 64, 64]."""

    def __init__(self, image_channel: int = 3, block_expansion: int = 64, num_down_blocks: int = 2,
                 max_features: int = 512, reshape_channel: int = 32, num_resblocks: int = 6):
        super().__init__()
        if max_features % reshape_channel:
            raise ValueError(f"max_features {max_features} is not a multiple of reshape_channel {reshape_channel}")
        self.reshape_channel = reshape_channel
        self.reshape_depth = max_features // reshape_channel
        self.first = SameBlock2d(image_channel, block_expansion)
        widths = [min(max_features, block_expansion * 2 ** i) for i in range(num_down_blocks + 1)]
        self.down_blocks = nn.ModuleList(DownBlock2d(widths[i], widths[i + 1]) for i in range(num_down_blocks))
        self.second = nn.Conv2d(widths[-1], max_features, kernel_size=1)
        self.resblocks_3d = nn.Sequential()
        for i in range(num_resblocks):
            self.resblocks_3d.add_module(f"3dr{i}", ResBlock3d(reshape_channel))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.to(param_dtype(self))  # [B, 3, 256, 256]
        x = self.first(x.contiguous(memory_format=torch.channels_last))
        for block in self.down_blocks:
            x = block(x)
        x = self.second(x).contiguous()  # [B, 512, 64, 64]
        b, _, h, w = x.shape
        f_s = x.view(b, self.reshape_channel, self.reshape_depth, h, w).contiguous(memory_format=torch.channels_last_3d)
        f_s = self.resblocks_3d(f_s)
        return f_s.contiguous()  # [B, 32, 16, 64, 64]

    @torch.no_grad()
    def fuse_for_inference(self) -> None:
        """Fold eval BatchNorms into the convs they follow (ResBlock3d norm1 stays an affine)."""
        fuse_blocks(self)


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """Every width and count of the extractor from its checkpoint tensors."""
    first = sd["first.conv.weight"]
    return {
        "image_channel": first.shape[1],
        "block_expansion": first.shape[0],
        "num_down_blocks": count_indexed(sd, "down_blocks.", ".conv.weight"),
        "max_features": sd["second.weight"].shape[0],
        "reshape_channel": sd["resblocks_3d.3dr0.conv1.weight"].shape[0],
        "num_resblocks": count_indexed(sd, "resblocks_3d.3dr", ".conv1.weight"),
    }
