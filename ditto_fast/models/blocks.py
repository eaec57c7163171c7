"""Building blocks shared by the LivePortrait-style networks: conv+norm blocks, spectral-norm conv,
coordinate grids, keypoint gaussians, and the folding helpers used by ``fuse_for_inference``."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- helpers


def param_dtype(module: nn.Module) -> torch.dtype:
    """The floating dtype of a module's first parameter (its compute dtype)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def count_indexed(sd: dict[str, torch.Tensor], prefix: str, suffix: str) -> int:
    """How many consecutive `prefix{i}suffix` keys exist in `sd`, counting from i = 0."""
    n = 0
    while f"{prefix}{n}{suffix}" in sd:
        n += 1
    return n


def make_coordinate_grid(d: int, h: int, w: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Identity sampling grid in [-1, 1], last axis ordered (x, y, z) as grid_sample expects."""
    # [D, H, W, 3], float32
    def axis(n: int) -> torch.Tensor:
        return 2.0 * (torch.arange(n, dtype=torch.float32, device=device) / (n - 1)) - 1.0

    z, y, x = torch.meshgrid(axis(d), axis(h), axis(w), indexing="ij")
    return torch.stack([x, y, z], dim=-1)


def keypoint_gaussians(kp: torch.Tensor, d: int, h: int, w: int, variance: float) -> torch.Tensor:
    """exp(-|grid - kp|^2 / (2 variance)) over the identity grid for every keypoint, float32."""
    # kp [B, K, 3] (x, y, z) -> [B, K, D, H, W]; separable: a product of three 1-D gaussians
    kp = kp.float()

    def along(n: int, coord: torch.Tensor) -> torch.Tensor:
        axis = 2.0 * (torch.arange(n, dtype=torch.float32, device=kp.device) / (n - 1)) - 1.0
        return torch.exp(-0.5 * (axis - coord[..., None]).square() / variance)  # [B, K, n]

    gx, gy, gz = along(w, kp[..., 0]), along(h, kp[..., 1]), along(d, kp[..., 2])
    return gz[..., :, None, None] * gy[..., None, :, None] * gx[..., None, None, :]


def as_depth_batch(x: torch.Tensor) -> torch.Tensor:
    """[B, C, D, H, W] -> [B*D, C, H, W] (a view for channels_last_3d input, else a copy)."""
    b, c, d, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * d, c, h, w)


def avg_pool_hw(x: torch.Tensor) -> torch.Tensor:
    """2x2 average pool over H, W of a 5D volume, any float dtype and memory format."""
    # [B, C, D, H, W] -> [B, C, D, H/2, W/2]  (avg_pool3d has no bf16 CPU kernel)
    b, c, d, h, w = x.shape
    y = F.avg_pool2d(as_depth_batch(x), 2)
    return y.reshape(b, d, c, h // 2, w // 2).permute(0, 2, 1, 3, 4)


def conv3d_depth_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A 'same' 3D conv with few output channels, computed as one 2D conv over depth slices.

    The kd depth taps go into the output channels (so the GEMM is kd times wider, which suits
    AMX/AVX512 far better than a 22-wide one), then shifted slices are summed in float32.
    """
    # x [B, Cin, D, H, W], weight [Cout, Cin, kd, kh, kw] -> [B, D, H, W, Cout] float32
    b, _, d, h, w = x.shape
    cout, _, kd, kh, kw = weight.shape
    w2 = weight.permute(2, 0, 1, 3, 4).reshape(kd * cout, -1, kh, kw)
    y = F.conv2d(as_depth_batch(x.contiguous(memory_format=torch.channels_last_3d)),
                 w2.contiguous(memory_format=torch.channels_last), None, padding=(kh // 2, kw // 2))
    y = y.permute(0, 2, 3, 1).reshape(b, d, h, w, kd, cout)  # a view: y is channels_last
    out = torch.zeros(b, d, h, w, cout, dtype=torch.float32, device=x.device)
    if bias is not None:
        out += bias.float()
    for t in range(kd):
        off = t - kd // 2  # out[:, i] += y[:, i + off, ..., t, :]
        lo, hi = max(0, -off), min(d, d - off)
        if hi > lo:
            out[:, lo:hi] += y[:, lo + off:hi + off, :, :, t, :]
    return out


def conv2d_point_taps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A 'same' 2D conv with very few output channels: one 1x1 conv to every (tap, output) pair,
    then the shifted tap maps are summed in float32."""
    # x [B, Cin, H, W], weight [Cout, Cin, kh, kw] -> [B, Cout, H, W] float32
    b, _, h, w = x.shape
    cout, cin, kh, kw = weight.shape
    w1 = weight.permute(2, 3, 0, 1).reshape(kh * kw * cout, cin, 1, 1)
    y = F.conv2d(x, w1.contiguous(memory_format=torch.channels_last))  # [B, kh*kw*Cout, H, W]
    y = F.pad(y.float(), (kw // 2, kw // 2, kh // 2, kh // 2)).view(b, kh, kw, cout, h + kh - 1, w + kw - 1)
    out = torch.zeros(b, cout, h, w, dtype=torch.float32, device=x.device)
    if bias is not None:
        out += bias.float()[:, None, None]
    for i in range(kh):
        for j in range(kw):
            out += y[:, i, j, :, i:i + h, j:j + w]
    return out


def _nearest_tap_classes(s: int) -> list[tuple[int, list[list[float]], slice]]:
    """The classes of output row (or column) of a 3x3 conv over an s-fold nearest upsample, s >= 2:
    (first input offset, matrix from the 3 taps to the class's own taps, rows of each s-block in it)."""
    first = (-1, [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], slice(0, 1))       # sees row i-1 (tap 0) and i (taps 1, 2)
    middle = (0, [[1.0, 1.0, 1.0]], slice(1, s - 1))                       # all three taps on row i
    last = (0, [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], slice(s - 1, s))       # row i (taps 0, 1) and i+1 (tap 2)
    return [first, middle, last] if s > 2 else [first, last]


class NearestUpConv3x3(nn.Module):
    """relu(conv3x3(nearest_upsample(x, s))) computed on x itself, for s >= 2.

    After a nearest upsample, output rows at the same place in every s-block see the same input rows
    (only the first and last place of a block reach a neighbour), and so do columns. Each of the 4 (s=2)
    or 9 (s>2) classes of output position is then one small conv of x with its taps summed, and its
    result is copied to every position of its class: 2.25x (s=2) to 5.8x (s=4) fewer multiply-adds.
    """

    def __init__(self, conv: nn.Conv2d, s: int):
        super().__init__()
        assert conv.kernel_size == (3, 3) and conv.padding == (1, 1) and s >= 2
        self.s = s
        w = conv.weight.detach().double()                                   # [O, I, 3, 3]
        self.kernels, self.places = nn.ParameterList(), []
        for r0, rmap, rows in _nearest_tap_classes(s):
            for c0, cmap, cols in _nearest_tap_classes(s):
                k = torch.einsum("rt,oitu,cu->oirc", w.new_tensor(rmap), w, w.new_tensor(cmap))
                self.kernels.append(nn.Parameter(k.to(conv.weight.dtype).contiguous(memory_format=torch.channels_last),
                                                 requires_grad=False))
                self.places.append((1 + r0, 1 + c0, rows, cols))
        self.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, I, n, m] -> [B, O, s*n, s*m], channels-last
        b, _, n, m = x.shape
        s, o = self.s, self.bias.shape[0]
        padded = F.pad(x, (1, 1, 1, 1))
        out = torch.empty(b, o, s * n, s * m, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
        blocks = out.view(b, o, n, s, m, s)
        for k, (r0, c0, rows, cols) in zip(self.kernels, self.places):
            window = padded[:, :, r0:r0 + n + k.shape[2] - 1, c0:c0 + m + k.shape[3] - 1]
            blocks[:, :, :, rows, :, cols] = F.relu(F.conv2d(window, k, self.bias))[:, :, :, None, :, None]
        return out


# ----------------------------------------------------------------------------- folding


@torch.no_grad()
def fold_batchnorm(conv: nn.Module, bn: nn.Module) -> None:
    """Fold an eval-mode BatchNorm that directly follows `conv` into the conv's weight and bias."""
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return  # already folded
    scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    w = conv.weight.double() * scale.reshape(-1, *([1] * (conv.weight.dim() - 1)))
    b = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
    b = (b - bn.running_mean.double()) * scale + bn.bias.double()
    conv.weight.copy_(w.to(conv.weight.dtype))
    if conv.bias is None:
        conv.bias = nn.Parameter(b.to(conv.weight.dtype))
    else:
        conv.bias.copy_(b.to(conv.bias.dtype))


class Affine(nn.Module):
    """Per-channel y = x * scale + shift: an eval BatchNorm that cannot be folded into a conv."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm):
        super().__init__()
        with torch.no_grad():
            scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
            shift = bn.bias.double() - bn.running_mean.double() * scale
        self.scale = nn.Parameter(scale.float(), requires_grad=False)
        self.shift = nn.Parameter(shift.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return torch.addcmul(self.shift.reshape(shape), x, self.scale.reshape(shape))


# ----------------------------------------------------------------------------- spectral norm


class SNConv2d(nn.Module):
    """Conv2d with spectral norm as stored by torch's spectral_norm (weight_orig, weight_u, weight_v).

    The weight is weight_orig / (u . (W v)) with the stored u, v (eval semantics, no power iteration).
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, padding: int = 0, bias: bool = True):
        super().__init__()
        self.padding = padding
        self.weight_orig = nn.Parameter(torch.empty(cout, cin, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        w = self.weight_orig.detach().reshape(cout, -1)
        if w.is_meta:          # shapes for a checkpoint to fill: on meta tensors normalize costs a second at first use
            self.register_buffer("weight_u", torch.empty(cout))
            self.register_buffer("weight_v", torch.empty(w.shape[1]))
            return
        nn.init.kaiming_uniform_(self.weight_orig, a=5 ** 0.5)
        u = F.normalize(torch.randn(cout), dim=0, eps=1e-12)
        v = F.normalize(w.t() @ u, dim=0, eps=1e-12)
        self.register_buffer("weight_u", F.normalize(w @ v, dim=0, eps=1e-12))
        self.register_buffer("weight_v", v)

    def normalized_weight(self) -> torch.Tensor:
        """weight_orig divided by its stored spectral-norm estimate."""
        w = self.weight_orig
        sigma = torch.dot(self.weight_u.float(), w.reshape(w.shape[0], -1).float() @ self.weight_v.float())
        return (w.float() / sigma).to(w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.normalized_weight(), self.bias, padding=self.padding)

    @torch.no_grad()
    def to_conv(self) -> nn.Conv2d:
        """A plain Conv2d with the normalized weight folded in."""
        return conv2d_holding(self.normalized_weight(), self.bias, self.padding)


def conv2d_holding(weight: torch.Tensor, bias: torch.Tensor | None, padding: int | tuple) -> nn.Conv2d:
    """A Conv2d whose parameters are `weight` [out, in, k, k] and `bias` (built without a random init)."""
    conv = nn.Conv2d(weight.shape[1], weight.shape[0], tuple(weight.shape[2:]), padding=padding,
                     bias=bias is not None, device="meta")
    conv.weight = nn.Parameter(weight.detach())
    if bias is not None:
        conv.bias = nn.Parameter(bias.detach())
    return conv


def fold_spectral_norms(module: nn.Module) -> None:
    """Replace every SNConv2d below `module` by a plain Conv2d with its normalized weight."""
    for name, child in list(module.named_children()):
        if isinstance(child, SNConv2d):
            setattr(module, name, child.to_conv())
        else:
            fold_spectral_norms(child)


# ----------------------------------------------------------------------------- conv blocks


class SameBlock2d(nn.Module):
    """conv -> BatchNorm -> ReLU (or LeakyReLU 0.01), same resolution."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, padding: int = 1, lrelu: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, padding=padding)
        self.norm = nn.BatchNorm2d(cout, affine=True)
        self.lrelu = lrelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return F.leaky_relu(x, 0.01) if self.lrelu else F.relu(x)

    def fuse(self) -> None:
        fold_batchnorm(self.conv, self.norm)
        self.norm = nn.Identity()


class DownBlock2d(nn.Module):
    """conv -> BatchNorm -> ReLU -> 2x2 average pool."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, padding: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, padding=padding)
        self.norm = nn.BatchNorm2d(cout, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(F.relu(self.norm(self.conv(x))), 2)

    def fuse(self) -> None:
        fold_batchnorm(self.conv, self.norm)
        self.norm = nn.Identity()


class DownBlock3d(nn.Module):
    """conv3d -> BatchNorm3d -> ReLU -> (1, 2, 2) average pool."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, kernel_size, padding=kernel_size // 2)
        self.norm = nn.BatchNorm3d(cout, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return avg_pool_hw(F.relu(self.norm(self.conv(x))))

    def fuse(self) -> None:
        fold_batchnorm(self.conv, self.norm)
        self.norm = nn.Identity()


class UpBlock3d(nn.Module):
    """nearest (1, 2, 2) upsample -> conv3d -> BatchNorm3d -> ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, kernel_size, padding=kernel_size // 2)
        self.norm = nn.BatchNorm3d(cout, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        return F.relu(self.norm(self.conv(x)))

    def fuse(self) -> None:
        fold_batchnorm(self.conv, self.norm)
        self.norm = nn.Identity()


class ResBlock3d(nn.Module):
    """x + conv2(relu(bn2(conv1(relu(bn1(x)))))), same resolution."""

    def __init__(self, channels: int, kernel_size: int = 3):
        super().__init__()
        self.conv1 = nn.Conv3d(channels, channels, kernel_size, padding=kernel_size // 2)
        self.conv2 = nn.Conv3d(channels, channels, kernel_size, padding=kernel_size // 2)
        self.norm1 = nn.BatchNorm3d(channels, affine=True)
        self.norm2 = nn.BatchNorm3d(channels, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        out = self.conv2(F.relu(self.norm2(out)))
        return out + x

    def fuse(self) -> None:
        # norm2 directly follows conv1: fold it. norm1 precedes a ReLU: keep it as a plain affine.
        fold_batchnorm(self.conv1, self.norm2)
        self.norm2 = nn.Identity()
        if isinstance(self.norm1, nn.modules.batchnorm._BatchNorm):
            self.norm1 = Affine(self.norm1)


def fuse_blocks(module: nn.Module) -> None:
    """fuse() every block below `module` that has one, fold spectral norms, store conv weights
    channels-last (the layout the CPU kernels use, so no per-call weight reorder)."""
    for child in list(module.modules()):
        if child is not module and hasattr(child, "fuse") and callable(child.fuse):
            child.fuse()
    fold_spectral_norms(module)
    for child in module.modules():
        if isinstance(child, nn.Conv2d):
            child.weight.data = child.weight.data.contiguous(memory_format=torch.channels_last)
        elif isinstance(child, nn.Conv3d):
            child.weight.data = child.weight.data.contiguous(memory_format=torch.channels_last_3d)
