"""LMDM windows of several sessions sampled as one batch (motion/shared_windows.py, on a GPU): each row draws its noise
from its own session's generator, so each session gets the window it would get alone."""

from __future__ import annotations

import pytest
import torch

from ditto_fast import models
from ditto_fast.motion.ddim import DDIMSampler, draw
from ditto_fast.motion.shared_windows import SharedWindows
from support import together

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sampler():
    torch.manual_seed(0)
    return DDIMSampler(models.build("lmdm", tiny=True).eval(), steps=3)


def asks(net, n: int) -> list:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(1, net.motion_dim, generator=g), torch.randn(1, net.seq_len, net.cond_dim, generator=g),
             100 + i) for i in range(n)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_one_generator_per_row_draws_each_row_as_alone():
    rows = draw((3, 4, 5), [gen(1), gen(2), gen(3)])
    for i, seed in enumerate((1, 2, 3)):
        assert torch.equal(rows[i:i + 1], draw((1, 4, 5), gen(seed)))
    with pytest.raises(ValueError):
        draw((2, 4, 5), [gen(1)])


def test_a_batch_with_a_generator_per_row_gives_each_row_its_window_alone(sampler):
    a = asks(sampler.net, 3)
    alone = [sampler(f, c, gen(s)) for f, c, s in a]
    batched = sampler(torch.cat([f for f, _, _ in a]), torch.cat([c for _, c, _ in a]), [gen(s) for _, _, s in a])
    for i in range(3):
        torch.testing.assert_close(batched[i:i + 1], alone[i], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(alone[0], alone[1])                  # the rows differ: each its own noise and condition


def test_threads_sharing_windows_get_their_own_in_batches(sampler):
    a = asks(sampler.net, 4)
    alone = [sampler(f, c, gen(s)) for f, c, s in a]
    shared = SharedWindows(sampler, gather_s=0.2)           # a generous gather: the four threads meet in one batch
    got = together(4, lambda i: shared(a[i][0], a[i][1], gen(a[i][2])))
    assert shared.windows == 4 and shared.batches < 4, (shared.batches, shared.windows)
    for i in range(4):
        torch.testing.assert_close(got[i], alone[i], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):                         # a bad ask fails its own thread only
        shared(a[0][0], torch.cat([a[0][1]] * 2), gen(1))
    torch.testing.assert_close(shared(a[0][0], a[0][1], gen(a[0][2])), alone[0], rtol=1e-4, atol=1e-4)


def test_an_engine_shares_one_sampler_per_step_count_and_nothing_on_a_cpu(sampler):
    from types import SimpleNamespace

    from ditto_fast.handles.engine_sessions import EngineSessions

    engine = SimpleNamespace(device=torch.device("cpu"), lmdm=sampler.net, denoise=None,
                             config=SimpleNamespace(motion=SimpleNamespace(guidance=2.0)))
    sessions = EngineSessions(engine, send=lambda *message: None)
    assert sessions._shared() == {}                         # on a CPU each session keeps its own: a batch buys nothing
    w25 = sessions._windows_for(25)
    assert sessions._windows_for(25) is w25 and sessions._windows_for(10) is not w25
    assert len(w25.sampler.scheduler.timesteps) == 25 and w25.sampler.guidance == 2.0


def test_batches_run_at_fixed_sizes_captured_before_any_session_streams(sampler):
    """Sessions meeting in threes, twos and ones run at the bucket sizes warm-up captured (a CPU's stand-in for
    CUDA graphs): no capture while they stream, and each session's window as alone."""
    from ditto_fast.core.graphs import BUCKETS, Launched
    from ditto_fast.motion.ddim import Denoiser

    denoise = Denoiser(sampler.net)
    denoise._launched = Launched(denoise._flat, cuda=False, max_graphs=len(BUCKETS) + 1, skip_unchanged=True)
    shared = SharedWindows(DDIMSampler(sampler.net, 3, sampler.guidance, denoise), gather_s=0.3)
    shared.warm()
    counts = dict(denoise._launched.counts)
    assert counts["capture"] == len(BUCKETS) and len(denoise._launched.graphs) == len(BUCKETS), counts
    a = asks(sampler.net, 3)
    alone = [sampler(f, c, gen(s)) for f, c, s in a]
    for n in (3, 2, 1, 3):
        got = together(n, lambda i: shared(a[i][0], a[i][1], gen(a[i][2])))
        for i in range(n):
            torch.testing.assert_close(got[i], alone[i], rtol=1e-4, atol=1e-4)
    after = dict(denoise._launched.counts)
    assert after["capture"] == counts["capture"] and after.get("eager", 0) == counts.get("eager", 0), after
    assert after.get("replay", 0) > counts.get("replay", 0), (counts, after)
