"""Appearance extractor, warping network, SPADE decoder: parity with the reference vectors
(fused and unfused), checkpoint layout, tiny round trips, reduced precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import assert_close_to_ref, native_bf16
from ditto_fast import models
from ditto_fast.core.errors import CheckpointError
from ditto_fast.models.registry import module_of

NETS = ("appearance_extractor", "warp_network", "decoder")
INPUTS = {
    "appearance_extractor": ("image",),
    "warp_network": ("feature_3d", "kp_source", "kp_driving"),
    "decoder": ("feature",),
}
OUTPUT = {"appearance_extractor": "f_s", "warp_network": "out", "decoder": "image"}
# full-size warping network and decoder passes take from seconds to minutes on a CPU: only the full run has them
PARITY_NETS = [n if n == "appearance_extractor" else pytest.param(n, marks=pytest.mark.slow) for n in NETS]


def _inputs(vectors: dict, name: str) -> list[torch.Tensor]:
    return [torch.from_numpy(vectors[f"{name}.in.{k}"]) for k in INPUTS[name]]


@pytest.fixture(scope="module")
def parity_outputs(parity_checkpoint, parity_vectors):
    """outputs(name, fuse, dtype) -> numpy float32 output of the loaded network on the parity input."""
    cache: dict[tuple, np.ndarray] = {}

    def run(name: str, fuse: bool, dtype: torch.dtype = torch.float32) -> np.ndarray:
        key = (name, fuse, dtype)
        if key not in cache:
            net = models.load(name, parity_checkpoint(name), fuse=fuse, dtype=dtype)
            with torch.no_grad():
                out = net(*_inputs(parity_vectors, name))
            assert out.dtype == dtype
            cache[key] = out.float().numpy()
        return cache[key]

    return run


def _tiny_inputs(name: str, batch: int, gen: torch.Generator, side: int = 16) -> list[torch.Tensor]:
    """Inputs of a tiny network whose features are `side` x `side` (64 in a render, a sixteenth of the pixels at 16:
    the networks are convolutional; test_tiny_chain_shapes runs the render's sizes)."""
    w = module_of(name).TINY_WIDTHS
    if name == "appearance_extractor":
        return [torch.rand(batch, 3, 4 * side, 4 * side, generator=gen)]
    if name == "warp_network":
        feat = torch.randn(batch, w["feature_channel"], w["feature_depth"], side, side, generator=gen)
        kp_s = 0.4 * torch.randn(batch, 21, 3, generator=gen)
        return [feat, kp_s, kp_s + 0.05 * torch.randn(batch, 21, 3, generator=gen)]
    return [torch.randn(batch, w["in_channels"], side, side, generator=gen)]


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", PARITY_NETS)
def test_parity(name, fuse, parity_outputs, parity_vectors):
    ref = parity_vectors[f"{name}.out.{OUTPUT[name]}"]
    assert_close_to_ref(parity_outputs(name, fuse), ref, f"{name} (fuse={fuse})")


@pytest.mark.slow
def test_decoder_output_range(parity_outputs):
    img = parity_outputs("decoder", True)
    assert img.shape == (1, 3, 512, 512)
    assert img.min() >= 0.0 and img.max() <= 1.0


@native_bf16
@pytest.mark.slow
@pytest.mark.parametrize("name", NETS)
def test_bfloat16_close_to_reference(name, parity_outputs, parity_vectors):
    ref = parity_vectors[f"{name}.out.{OUTPUT[name]}"].astype(np.float64)
    got = parity_outputs(name, True, torch.bfloat16).astype(np.float64)
    assert np.isfinite(got).all()
    if name == "decoder":
        psnr = 10 * np.log10(1.0 / np.mean((got - ref) ** 2))
        assert psnr >= 38.0, f"decoder bf16 PSNR {psnr:.1f} dB < 38 dB"
    else:
        rel = np.abs(got - ref).mean() / np.abs(ref).mean()
        assert rel < 0.02, f"{name} bf16 mean relative error {rel:.3g}"


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("name", NETS)
def test_full_size_layout_matches_checkpoint(name, parity_layout):
    with torch.device("meta"):                 # shapes and dtypes only: no weights drawn
        sd = models.build(name).state_dict()
    expected = parity_layout[name]["keys"]
    assert sorted(sd) == sorted(expected)
    for k, v in sd.items():
        assert list(v.shape) == expected[k]["shape"], k
        assert str(v.dtype).removeprefix("torch.") == expected[k]["dtype"], k
    assert sum(v.numel() for v in sd.values()) == parity_layout[name]["num_params"]


@pytest.mark.parametrize("name", NETS)
def test_widths_round_trip(name):
    mod = module_of(name)
    with torch.device("meta"):                 # shapes only: no weights drawn
        for net in (models.build(name), models.build(name, tiny=True)):
            widths = mod.widths_from_state_dict(net.state_dict())
            rebuilt = models.build(name, widths).state_dict()
            assert {k: v.shape for k, v in rebuilt.items()} == {k: v.shape for k, v in net.state_dict().items()}


@pytest.mark.parametrize("name,key", [("appearance_extractor", "second.weight"),
                                      ("warp_network", "third.conv.weight"),
                                      ("decoder", "fc.weight")])
def test_missing_tensor_is_a_checkpoint_error(name, key, tmp_path):
    sd = models.build(name, tiny=True).state_dict()
    with pytest.raises(KeyError):
        module_of(name).widths_from_state_dict({k: v for k, v in sd.items() if k != key})
    del sd[key]
    torch.save(sd, tmp_path / "broken.pth")
    with pytest.raises(CheckpointError):
        models.load(name, tmp_path / "broken.pth")


# ----------------------------------------------------------------------------- tiny networks


@pytest.mark.parametrize("name", NETS)
def test_tiny_save_load_round_trip(name, tmp_path):
    gen = torch.Generator().manual_seed(1)
    net = models.build(name, tiny=True).eval()
    # non-trivial BatchNorm statistics so that folding them is exercised
    for m in net.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(1 + 0.2 * torch.rand(m.num_features, generator=gen))
            m.weight.data.copy_(1 + 0.1 * torch.randn(m.num_features, generator=gen))
    torch.save(net.state_dict(), tmp_path / f"{name}.pth")
    x = _tiny_inputs(name, 2, gen)
    with torch.no_grad():
        ref = net(*x)
        for fuse in (False, True):
            out = models.load(name, tmp_path / f"{name}.pth", fuse=fuse)(*x)
            assert out.shape == ref.shape
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, ref.abs().max().item()))


@pytest.mark.parametrize("name", NETS)
def test_fuse_is_idempotent(name):
    gen = torch.Generator().manual_seed(6)
    net = models.build(name, tiny=True).eval()
    x = _tiny_inputs(name, 1, gen)
    with torch.no_grad():
        net.fuse_for_inference()
        once = net(*x)
        net.fuse_for_inference()
        torch.testing.assert_close(net(*x), once)


def test_fuse_removes_checkpoint_only_parts():
    dec = models.build("decoder", tiny=True).eval()
    dec.fuse_for_inference()
    assert not any(k.endswith(("weight_orig", "weight_u", "weight_v")) for k in dec.state_dict())
    warp = models.build("warp_network", tiny=True).eval()
    warp.fuse_for_inference()
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in warp.modules())
    app = models.build("appearance_extractor", tiny=True).eval()
    app.fuse_for_inference()
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in app.modules())


@pytest.mark.parametrize("s", [2, 3, 4])
def test_nearest_up_conv_is_the_conv_of_the_upsample(s):
    """The folded SPADE conv gives relu(conv3x3(nearest upsample)) at every output position, borders included."""
    from ditto_fast.models.blocks import NearestUpConv3x3

    gen = torch.Generator().manual_seed(s)
    conv = torch.nn.Conv2d(6, 5, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen))
        x = torch.randn(2, 6, 7, 9, generator=gen).contiguous(memory_format=torch.channels_last)
        ref = torch.relu(conv(torch.nn.functional.interpolate(x, scale_factor=s, mode="nearest")))
        out = NearestUpConv3x3(conv, s)(x)
    assert out.shape == (2, 5, 7 * s, 9 * s)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fused_decoder_computes_the_upsampled_spade_convs_on_the_feature():
    dec = models.build("decoder", tiny=True).eval()
    dec.fuse_for_inference()
    for block, s in ((dec.up_0, 2), (dec.up_1, 4)):
        for norm in (block.norm_0, block.norm_1):
            assert norm.mlp_shared_up.s == s and not hasattr(norm, "mlp_shared")
    assert dec.G_middle_0.norm_0.mlp_shared_up is None


def test_tiny_chain_shapes():
    gen = torch.Generator().manual_seed(2)
    app, warp, dec = (models.build(n, tiny=True).eval() for n in NETS)
    with torch.no_grad():
        f_s = app(torch.rand(2, 3, 256, 256, generator=gen))
        w = module_of("warp_network").TINY_WIDTHS
        assert f_s.shape == (2, w["feature_channel"], w["feature_depth"], 64, 64)
        kp = 0.4 * torch.randn(2, 21, 3, generator=gen)
        feat = warp(f_s, kp, kp + 0.05)
        assert feat.shape == (2, module_of("decoder").TINY_WIDTHS["in_channels"], 64, 64)
        img = dec(feat)
    assert img.shape == (2, 3, 512, 512)
    assert img.min() >= 0 and img.max() <= 1


def test_warp_identity_motion_keeps_feature_geometry():
    """With kp_driving == kp_source every keypoint's flow is the identity, so the deformation is too."""
    gen = torch.Generator().manual_seed(3)
    warp = models.build("warp_network", tiny=True).eval()
    feat, kp_s, _ = _tiny_inputs("warp_network", 1, gen)
    with torch.no_grad():
        dm = warp.dense_motion_network
        deformation, occlusion = dm(feat, kp_s, kp_s)
    from ditto_fast.models.blocks import make_coordinate_grid
    torch.testing.assert_close(deformation[0], make_coordinate_grid(*feat.shape[2:]), atol=1e-5, rtol=0)
    assert occlusion.shape == (1, 1, *feat.shape[3:]) and 0 <= occlusion.min() and occlusion.max() <= 1


def test_batch_items_are_independent():
    gen = torch.Generator().manual_seed(4)
    for name in NETS:
        net = models.build(name, tiny=True).eval()
        net.fuse_for_inference()
        x = _tiny_inputs(name, 3, gen)
        with torch.no_grad():
            full = net(*x)
            single = net(*[t[1:2] for t in x])
        torch.testing.assert_close(full[1:2], single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_tiny_chain(dtype):
    gen = torch.Generator().manual_seed(5)
    nets32 = [models.build(n, tiny=True).eval() for n in NETS]
    nets_lo = []
    for n, net in zip(NETS, nets32):
        lo = models.build(n, tiny=True).eval()
        lo.load_state_dict(net.state_dict())
        lo.fuse_for_inference()
        nets_lo.append(lo.to(dtype))
    img = torch.rand(1, 3, 64, 64, generator=gen, dtype=torch.float64)  # any float input dtype; 16x16 features
    kp_s = 0.4 * torch.randn(1, 21, 3, generator=gen)
    kp_d = kp_s + 0.05 * torch.randn(1, 21, 3, generator=gen)
    with torch.no_grad():
        outs = []
        for app, warp, dec in (nets32, nets_lo):
            f_s = app(img)
            feat = warp(f_s, kp_s, kp_d)
            outs.append((f_s, feat, dec(feat)))
    for (a32, a_lo), what in zip(zip(*outs), ("f_s", "warp", "image")):
        assert a_lo.dtype == dtype and a32.dtype == torch.float32, what
        err = (a_lo.float() - a32).abs().mean() / a32.abs().mean()
        assert err < 0.03, f"{what}: {dtype} mean relative error {err:.3g}"
