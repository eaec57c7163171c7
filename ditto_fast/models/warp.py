"""Warping network: moves the source feature volume from source to driving keypoints.

A dense-motion network turns the keypoint pairs into a per-voxel deformation (a softmax mix of
per-keypoint translations) and an occlusion map; the feature volume is resampled with that
deformation, flattened over depth and projected to the decoder's input feature.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ditto_fast.models.blocks import (DownBlock3d, SameBlock2d, UpBlock3d, conv2d_point_taps, conv3d_depth_taps, count_indexed, fold_batchnorm,
                     fuse_blocks, keypoint_gaussians, make_coordinate_grid, param_dtype)

KP_VARIANCE = 0.01

TINY_WIDTHS = {"feature_channel": 4, "feature_depth": 4, "out_channels": 8, "compress": 1,
               "hg_block_expansion": 4, "hg_max_features": 16, "hg_num_blocks": 2,
               "hg_kernel": 1, "mask_kernel": 1, "occlusion_kernel": 3}


class HourglassEncoder(nn.Module):
    """Down blocks; returns the input and every block's output (the skips)."""

    def __init__(self, cin: int, block_expansion: int, max_features: int, num_blocks: int, kernel: int):
        super().__init__()
        outs = [min(max_features, block_expansion * 2 ** (i + 1)) for i in range(num_blocks)]
        ins = [cin] + outs[:-1]
        self.down_blocks = nn.ModuleList(DownBlock3d(i, o, kernel) for i, o in zip(ins, outs))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [x]
        for block in self.down_blocks:
            outs.append(block(outs[-1]))
        return outs


class HourglassDecoder(nn.Module):
    """Up blocks, each followed by concatenation with the matching skip; then conv-BN-ReLU."""

    def __init__(self, cin: int, block_expansion: int, max_features: int, num_blocks: int, kernel: int):
        super().__init__()
        blocks = []
        for i in reversed(range(num_blocks)):
            width_in = (1 if i == num_blocks - 1 else 2) * min(max_features, block_expansion * 2 ** (i + 1))
            blocks.append(UpBlock3d(width_in, min(max_features, block_expansion * 2 ** i), kernel))
        self.up_blocks = nn.ModuleList(blocks)
        self.out_filters = block_expansion + cin
        self.conv = nn.Conv3d(self.out_filters, self.out_filters, kernel, padding=kernel // 2)
        self.norm = nn.BatchNorm3d(self.out_filters, affine=True)

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        out = skips[-1]
        for block, skip in zip(self.up_blocks, reversed(skips[:-1])):
            out = torch.cat([block(out), skip], dim=1)
        return F.relu(self.norm(self.conv(out)))

    def fuse(self) -> None:
        fold_batchnorm(self.conv, self.norm)
        self.norm = nn.Identity()


class Hourglass(nn.Module):
    """3D U-Net: [B, cin, D, H, W] -> [B, block_expansion + cin, D, H, W]."""

    def __init__(self, cin: int, block_expansion: int, max_features: int, num_blocks: int, kernel: int):
        super().__init__()
        self.encoder = HourglassEncoder(cin, block_expansion, max_features, num_blocks, kernel)
        self.decoder = HourglassDecoder(cin, block_expansion, max_features, num_blocks, kernel)
        self.out_filters = self.decoder.out_filters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


class DenseMotionNetwork(nn.Module):
    """(feature volume, keypoints) -> deformation grid [B,D,H,W,3] and occlusion map [B,1,H,W] (float32)."""

    def __init__(self, num_kp: int, feature_channel: int, feature_depth: int, compress: int,
                 block_expansion: int, max_features: int, num_blocks: int, kernel: int,
                 mask_kernel: int, occlusion_kernel: int):
        super().__init__()
        self.num_kp = num_kp
        self.hourglass = Hourglass((num_kp + 1) * (compress + 1), block_expansion, max_features, num_blocks, kernel)
        self.mask = nn.Conv3d(self.hourglass.out_filters, num_kp + 1, mask_kernel, padding=mask_kernel // 2)
        self.compress = nn.Conv3d(feature_channel, compress, kernel_size=1)
        self.norm = nn.BatchNorm3d(compress, affine=True)
        self.occlusion = nn.Conv2d(self.hourglass.out_filters * feature_depth, 1, occlusion_kernel,
                                   padding=occlusion_kernel // 2)

    def forward(self, feature: torch.Tensor, kp_source: torch.Tensor,
                kp_driving: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # feature [B, C, D, H, W] in the compute dtype; keypoints [B, K, 3]
        dtype = feature.dtype
        f = F.relu(self.norm(self.compress(feature)))  # [B, c, D, H, W]
        b, c, d, h, w = f.shape
        k1 = self.num_kp + 1
        grid = make_coordinate_grid(d, h, w, device=f.device)  # [D, H, W, 3] float32
        # per-keypoint translation driving -> source; the background (index 0) does not move
        shift = torch.cat([kp_source.new_zeros(b, 1, 3, dtype=torch.float32),
                           (kp_source.float() - kp_driving.float())], dim=1)  # [B, K+1, 3]
        sparse = grid[None, None] + shift[:, :, None, None, None, :]  # [B, K+1, D, H, W, 3]
        # sample the compressed feature once per keypoint: stack the K+1 grids along depth
        deformed = F.grid_sample(f.float(), sparse.reshape(b, k1 * d, h, w, 3), align_corners=False)
        deformed = deformed.view(b, c, k1, d, h, w).transpose(1, 2)  # [B, K+1, c, D, H, W]
        heat = (keypoint_gaussians(kp_driving, d, h, w, KP_VARIANCE)
                - keypoint_gaussians(kp_source, d, h, w, KP_VARIANCE))  # [B, K, D, H, W]
        heat = torch.cat([heat.new_zeros(b, 1, d, h, w), heat], dim=1)
        x = torch.cat([heat[:, :, None], deformed], dim=2).reshape(b, k1 * (c + 1), d, h, w)
        x = x.to(dtype).contiguous(memory_format=torch.channels_last_3d)
        prediction = self.hourglass(x)  # [B, out_filters, D, H, W]
        mask_logits = conv3d_depth_taps(prediction, self.mask.weight, self.mask.bias)  # [B, D, H, W, K+1]
        mask = torch.softmax(mask_logits, dim=-1)  # float32
        deformation = grid + torch.einsum("bdhwk,bkc->bdhwc", mask, shift)  # [B, D, H, W, 3]
        # occlusion conv over prediction flattened to channels (c, d): lay it out as [B, H, W, D, C]
        # once, and put the weight's input channels in the same (d, c) order
        cp = prediction.shape[1]
        flat = prediction.permute(0, 3, 4, 2, 1).contiguous().view(b, h, w, d * cp).permute(0, 3, 1, 2)
        occ_w = self.occlusion.weight
        occ_w = occ_w.reshape(occ_w.shape[0], cp, d, *occ_w.shape[2:]).transpose(1, 2).reshape(occ_w.shape)
        occlusion = torch.sigmoid(conv2d_point_taps(flat, occ_w, self.occlusion.bias))  # [B, 1, H, W] float32
        return deformation, occlusion

    def fuse(self) -> None:
        fold_batchnorm(self.compress, self.norm)
        self.norm = nn.Identity()


class WarpNetwork(nn.Module):
    """(f_s [B,C,D,64,64], kp_source [B,K,3], kp_driving [B,K,3]) -> warped feature [B,out_channels,64,64]."""

    def __init__(self, num_kp: int = 21, feature_channel: int = 32, feature_depth: int = 16,
                 out_channels: int = 256, compress: int = 4, hg_block_expansion: int = 32,
                 hg_max_features: int = 1024, hg_num_blocks: int = 5, hg_kernel: int = 3,
                 mask_kernel: int = 7, occlusion_kernel: int = 7):
        super().__init__()
        self.dense_motion_network = DenseMotionNetwork(
            num_kp, feature_channel, feature_depth, compress, hg_block_expansion, hg_max_features,
            hg_num_blocks, hg_kernel, mask_kernel, occlusion_kernel)
        self.third = SameBlock2d(feature_channel * feature_depth, out_channels, lrelu=True)
        self.fourth = nn.Conv2d(out_channels, out_channels, kernel_size=1)

    def forward(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        # feature_3d [B, C, D, H, W], kp_source / kp_driving [B, K, 3]
        dtype = param_dtype(self)
        deformation, occlusion = self.dense_motion_network(feature_3d.to(dtype), kp_source, kp_driving)
        warped = F.grid_sample(feature_3d.float(), deformation, align_corners=False)  # [B, C, D, H, W]
        b, c, d, h, w = warped.shape
        out = self.fourth(self.third(warped.view(b, c * d, h, w).to(dtype)))
        return out * occlusion.to(dtype)  # [B, out_channels, H, W]

    @torch.no_grad()
    def fuse_for_inference(self) -> None:
        """Fold every eval BatchNorm into the conv it follows."""
        fuse_blocks(self)


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """Every width, count and kernel size of the warping network from its checkpoint tensors."""
    dm = "dense_motion_network."
    enc = dm + "hourglass.encoder.down_blocks."
    n_blocks = count_indexed(sd, enc, ".conv.weight")
    if n_blocks == 0:
        raise KeyError(enc + "0.conv.weight")
    compress_w = sd[dm + "compress.weight"]
    third_w = sd["third.conv.weight"]
    return {
        "num_kp": sd[dm + "mask.weight"].shape[0] - 1,
        "feature_channel": compress_w.shape[1],
        "feature_depth": third_w.shape[1] // compress_w.shape[1],
        "out_channels": third_w.shape[0],
        "compress": compress_w.shape[0],
        "hg_block_expansion": sd[f"{dm}hourglass.decoder.up_blocks.{n_blocks - 1}.conv.weight"].shape[0],
        "hg_max_features": max(sd[f"{enc}{i}.conv.weight"].shape[0] for i in range(n_blocks)),
        "hg_num_blocks": n_blocks,
        "hg_kernel": sd[enc + "0.conv.weight"].shape[-1],
        "mask_kernel": sd[dm + "mask.weight"].shape[-1],
        "occlusion_kernel": sd[dm + "occlusion.weight"].shape[-1],
    }
