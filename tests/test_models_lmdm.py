"""LMDM and DDIM: parity with the reference vectors, guidance batching, sampler determinism, layout, bf16."""

import numpy as np
import pytest
import torch

from ditto_fast import models
from ditto_fast.models import lmdm
from ditto_fast.motion.ddim import DDIMSampler, DDIMScheduler
from conftest import assert_close_to_ref, layout_shapes, native_bf16
from reference import lmdm_two_pass, lmdm_uncond

TIMESTEPS = (999, 517, 3)


@pytest.fixture(scope="module")
def parity_net(parity_checkpoint):
    return models.load("lmdm", parity_checkpoint("lmdm"))


@pytest.fixture(scope="module")
def inputs(parity_vectors):
    v = parity_vectors
    return tuple(torch.from_numpy(v[f"lmdm.in.{k}"]) for k in ("x", "cond_frame", "cond"))


def _tiny(seed: int = 0, **widths) -> lmdm.LMDM:
    torch.manual_seed(seed)
    net = models.build("lmdm", {**lmdm.TINY_WIDTHS, **widths}).eval()
    with torch.no_grad():  # make the FiLM / null parameters matter as much as in a trained net
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


def _tiny_inputs(net: lmdm.LMDM, batch: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, net.seq_len, net.motion_dim, generator=g)
    cond_frame = torch.randn(batch, net.motion_dim, generator=g)
    cond = torch.randn(batch, net.seq_len, net.cond_dim, generator=g)
    return x, cond_frame, cond


@pytest.mark.parametrize("step", TIMESTEPS)
def test_lmdm_parity(parity_net, parity_vectors, inputs, step):
    x, cond_frame, cond = inputs
    t = torch.tensor([step], dtype=torch.int64)
    with torch.no_grad():
        pred_noise, x_start = parity_net(x, cond_frame, cond, t)
        uncond = lmdm_uncond(parity_net, x, cond_frame, t)
    for name, got in (("pred_noise", pred_noise), ("x_start", x_start), ("uncond", uncond)):
        assert got.dtype == torch.float32
        assert_close_to_ref(got.numpy(), parity_vectors[f"lmdm.out.t{step}.{name}"], f"lmdm t{step} {name}")


@native_bf16
@pytest.mark.slow
def test_lmdm_bf16_close_to_reference(parity_checkpoint, parity_vectors, inputs):
    net = models.load("lmdm", parity_checkpoint("lmdm"), dtype=torch.bfloat16)
    assert net.final_layer.weight.dtype == torch.bfloat16
    assert net.rotary.freqs.dtype == torch.float32  # positions x frequencies need float32
    x, cond_frame, cond = inputs
    with torch.no_grad():
        _, x_start = net(x, cond_frame, cond, torch.tensor([517]))
    assert_close_to_ref(x_start.numpy(), parity_vectors["lmdm.out.t517.x_start"], "lmdm bf16 x_start", rel=3e-2)


@pytest.mark.parametrize("steps", (50, 25, 10))
def test_ddim_schedule_matches_reference(parity_vectors, steps):
    s = DDIMScheduler()
    s.set_timesteps(steps)
    prefix = f"lmdm.schedule.s{steps}"
    np.testing.assert_array_equal(np.array(s.time_pairs), parity_vectors[f"{prefix}.time_pairs"])
    for name in ("alpha_next_sqrt", "sigma", "c"):
        assert_close_to_ref(getattr(s, name).numpy(), parity_vectors[f"{prefix}.{name}"], f"{prefix}.{name}")
    assert s.timesteps[0] == 999 and s.time_pairs[-1][1] == -1


def test_batched_guidance_equals_two_passes():
    net = _tiny()
    x, cond_frame, cond = _tiny_inputs(net, batch=2)
    t = torch.tensor([700, 40])
    with torch.no_grad():
        batched = net(x, cond_frame, cond, t)
        separate = lmdm_two_pass(net, x, cond_frame, cond, t)
        row1 = net(x[1:], cond_frame[1:], cond[1:], t[1:])
        uncond = lmdm_uncond(net, x, cond_frame, t)
    for a, b in zip(batched, separate):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(batched, row1):  # rows are independent in a batch
        torch.testing.assert_close(a[1:], b, rtol=1e-4, atol=1e-4)
    # guidance weight 2: x_start = 2 * conditional - unconditional, so it is not the unconditional output
    assert (batched[1] - uncond).abs().max() > 1e-2


def test_guidance_is_a_call_argument():
    net = _tiny()
    x, cond_frame, cond = _tiny_inputs(net, batch=1)
    t = torch.tensor([300])
    with torch.no_grad():
        _, default = net(x, cond_frame, cond, t)
        _, two = net(x, cond_frame, cond, t, guidance=2.0)
        _, one = net(x, cond_frame, cond, t, guidance=1.0)
        cond_only = net.model_output(x, cond_frame, net.encode_condition(cond, with_null=False), t)
        sampled = [DDIMSampler(net, 3, guidance=w)(cond_frame, cond, torch.Generator().manual_seed(5))
                   for w in (1.0, 2.0)]
    assert torch.equal(default, two)
    torch.testing.assert_close(one, cond_only, rtol=1e-5, atol=1e-5)   # weight 1: the conditional pass alone
    assert (sampled[0] - sampled[1]).abs().max() > 1e-3
    assert not hasattr(net, "guidance_weight")                          # nothing set on the loaded model


def test_ddim_sample_deterministic_per_generator():
    net = _tiny()
    _, cond_frame, cond = _tiny_inputs(net, batch=1)
    with torch.no_grad():
        sample = DDIMSampler(net, 5)
        a = sample(cond_frame, cond, torch.Generator().manual_seed(7))
        b = sample(cond_frame, cond, torch.Generator().manual_seed(7))
        c = sample(cond_frame, cond, torch.Generator().manual_seed(8))
    assert a.shape == (1, 80, 265) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3


def test_ddim_sample_follows_dittos_loop():
    net = _tiny()
    _, cond_frame, cond = _tiny_inputs(net, batch=1)
    sched = DDIMScheduler()
    sched.set_timesteps(4)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        got = DDIMSampler(net, 4)(cond_frame, cond, torch.Generator().manual_seed(11))
        x = torch.randn(1, 80, 265, generator=g)
        for i, (time, time_next) in enumerate(sched.time_pairs):
            pred_noise, x_start = net(x, cond_frame, cond, torch.tensor([time]))
            if time_next < 0:
                x = x_start
                break
            noise = torch.randn(1, 80, 265, generator=g)
            x = x_start * sched.alpha_next_sqrt[i] + sched.c[i] * pred_noise + sched.sigma[i] * noise
    torch.testing.assert_close(got, x, rtol=1e-4, atol=1e-4)


def test_lmdm_full_size_matches_layout(parity_layout):
    layout = parity_layout["lmdm"]
    with torch.device("meta"):                 # shapes only: no weights drawn
        sd = models.build("lmdm").state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == {k: v["shape"] for k, v in layout["keys"].items()}
    assert sum(v.numel() for v in sd.values()) == layout["num_params"]  # counts each rotary.freqs entry


def test_lmdm_widths_from_state_dict(parity_layout):
    sd = layout_shapes(parity_layout["lmdm"]["keys"])          # the published shapes (it reads no values)
    assert lmdm.widths_from_state_dict(sd) == {
        "motion_dim": 265, "seq_len": 80, "latent_dim": 512, "ff_size": 1024, "num_layers": 8,
        "num_cond_layers": 2, "num_heads": 8, "cond_dim": 1103}
    assert lmdm.widths_from_state_dict(_tiny(cond_dim=40).state_dict())["cond_dim"] == 40


def test_lmdm_tiny_round_trip(tmp_path):
    net = _tiny(cond_dim=32 + 79)
    torch.save({"model_state_dict": net.state_dict()}, tmp_path / "l.pth")
    loaded = models.load("lmdm", tmp_path / "l.pth")
    x, cond_frame, cond = _tiny_inputs(net, batch=1)
    t = torch.tensor([250])
    with torch.no_grad():
        for a, b in zip(loaded(x, cond_frame, cond, t), net(x, cond_frame, cond, t)):
            torch.testing.assert_close(a, b)


def test_lmdm_tiny_bf16_close_to_fp32(tmp_path):
    net = _tiny()
    torch.save({"model_state_dict": net.state_dict()}, tmp_path / "l.pth")
    half = models.load("lmdm", tmp_path / "l.pth", dtype=torch.bfloat16)
    x, cond_frame, cond = _tiny_inputs(net, batch=1)
    t = torch.tensor([600])
    with torch.no_grad():
        _, ref = net(x, cond_frame, cond, t)
        _, got = half(x, cond_frame, cond, t)
    assert got.dtype == torch.float32
    assert_close_to_ref(got.numpy(), ref.numpy(), "tiny lmdm bf16 x_start", rel=3e-2)


def test_lmdm_rejects_wrong_condition_width():
    net = _tiny(cond_dim=40)
    x, cond_frame, _ = _tiny_inputs(net, batch=1)
    with pytest.raises(ValueError, match="expects"):
        net(x, cond_frame, torch.zeros(1, 80, 41), torch.tensor([10]))


def test_the_denoiser_graphed_gives_the_eager_sample_bit_for_bit():
    """The engine's DDIM step through core/graphs' bookkeeping (on a CPU the stand-in replays the network on the
    static buffers): windows after windows, the same samples as the network called as it is; the encoded condition
    is copied into the graph once per window, not at every step."""
    from ditto_fast.core.graphs import Launched
    from ditto_fast.motion.ddim import Denoiser

    net, steps = _tiny(), 5
    denoise = Denoiser(net, "graphs")
    assert denoise._launched is None                     # a CPU launches eagerly
    denoise._launched = Launched(denoise._flat, cuda=False, skip_unchanged=True)
    with torch.no_grad():
        for window in range(3):
            _, cond_frame, cond = _tiny_inputs(net, batch=1, seed=20 + window)
            want = DDIMSampler(net, steps)(cond_frame, cond, torch.Generator().manual_seed(window))
            got = DDIMSampler(net, steps, denoise=denoise)(cond_frame, cond, torch.Generator().manual_seed(window))
            assert torch.equal(got, want), window
    run = denoise._launched
    assert dict(run.counts) == {"eager": 1, "capture": 1, "replay": 3 * steps - 2}
    # every step through the graph copies its x and t; a window's first one also its cond_frame, the pooled
    # condition and each decoder layer's keys and values
    per_window = 2 + 2 * len(net.seqTransDecoder.stack)
    assert run.copies == 2 * (3 * steps - 1) + 3 * per_window


def test_the_denoiser_eager_is_the_network():
    from ditto_fast.motion.ddim import Denoiser

    net = _tiny()
    _, cond_frame, cond = _tiny_inputs(net, batch=1)
    with torch.no_grad():
        a = DDIMSampler(net, 3, denoise=Denoiser(net))(cond_frame, cond, torch.Generator().manual_seed(1))
        b = DDIMSampler(net, 3)(cond_frame, cond, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
