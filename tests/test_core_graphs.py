"""The launch bookkeeping of core/graphs.py on a CPU, where `Rerun` stands in for a CUDA graph with the same contract:
a shape's first call eager, its second captured, the rest replayed through static buffers; other shapes eager past
the cap; unchanged inputs not copied again; one call at a time; the outputs written again by the next replay unless
taken. On CUDA the same object captures real graphs (scripts/gpu/gpu_check.py measures them)."""

from __future__ import annotations

import threading

import pytest
import torch

from ditto_fast.core import graphs
from ditto_fast.core.graphs import Launched, launcher


def affine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w + 1.0                               # [B, 4] @ [4, 4]


def inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 4, generator=g), torch.randn(4, 4, generator=g)


def test_first_call_eager_second_captured_then_replayed_with_the_same_numbers():
    run = Launched(affine, cuda=False)
    got = [run(*inputs(3, s), take=torch.Tensor.clone) for s in range(4)]
    assert all(torch.equal(g, affine(*inputs(3, s))) for s, g in enumerate(got))
    assert dict(run.counts) == {"eager": 1, "capture": 1, "replay": 2}
    assert len(run.graphs) == 1


def test_other_shapes_run_eager_until_seen_twice_and_past_the_cap_always():
    run = Launched(affine, cuda=False, max_graphs=2)
    for batch in (8, 8, 8, 3, 8, 3, 3, 5, 5, 5):
        assert torch.equal(run(*inputs(batch, batch), take=torch.Tensor.clone), affine(*inputs(batch, batch)))
    assert sorted(k[0][0][0] for k in run.graphs) == [3, 8]      # 5 came after the cap: eager every time
    assert dict(run.counts) == {"eager": 5, "capture": 2, "replay": 3}


def test_the_outputs_are_static_until_taken():
    """A graph writes its outputs into the same buffers at every replay: what a caller keeps, `take` copies."""
    run = Launched(affine, cuda=False)
    run(*inputs(2, 0))                                   # eager
    first = run(*inputs(2, 1))                           # captured: the static outputs themselves
    kept = first.clone()
    second = run(*inputs(2, 2))
    assert second is first and not torch.equal(first, kept)
    assert torch.equal(kept, affine(*inputs(2, 1))) and torch.equal(second, affine(*inputs(2, 2)))


def test_an_input_that_is_the_same_object_is_not_copied_again():
    run = Launched(affine, cuda=False, skip_unchanged=True)
    x, w = inputs(2, 0)
    run(x, w)                                            # eager: nothing copied
    run(x, w)                                            # captured: both copied into the static buffers
    assert run.copies == 2
    for s in range(3):                                   # new x each call, the same w: only x copied
        x = inputs(2, s + 5)[0]
        assert torch.equal(run(x, w, take=torch.Tensor.clone), affine(x, w))
    assert run.copies == 5
    w2 = w.clone() * 2                                   # another object: copied (x is the last call's: not)
    assert torch.equal(run(x, w2, take=torch.Tensor.clone), affine(x, w2)) and run.copies == 6


def test_without_skip_unchanged_every_input_is_copied():
    run = Launched(affine, cuda=False)
    x, w = inputs(2, 0)
    for _ in range(4):
        run(x, w)
    assert run.copies == 2 * 3


def test_calls_from_two_threads_each_get_their_own_numbers():
    run = Launched(affine, cuda=False, skip_unchanged=True)
    errors = []

    def worker(seed: int) -> None:
        for k in range(30):
            x, w = inputs(4, seed * 1000 + k)
            if not torch.equal(run(x, w, take=torch.Tensor.clone), affine(x, w)):
                errors.append((seed, k))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and run.counts["replay"] > 0


def test_tuple_outputs_are_replayed_too():
    def two(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ w, (x * 2).permute(1, 0)             # a view among them, as the crops are

    run = Launched(two, cuda=False)
    for s in range(3):
        got = run(*inputs(3, s), take=lambda out: tuple(t.clone() for t in out))
        want = two(*inputs(3, s))
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_launcher_choices(monkeypatch):
    assert launcher(affine, "eager", torch.device("cpu")) is None
    assert launcher(affine, "graphs", torch.device("cpu")) is None          # a CPU runs eager
    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode, dynamic: modes.append((mode, dynamic)) or fn)
    compiled = launcher(affine, "compile", torch.device("cpu"))
    assert isinstance(compiled, graphs.Compiled) and modes == [("default", False)]
    for s in range(4):                                   # compiled at its second call, as a graph is captured
        x, w = inputs(2, s)
        assert torch.equal(compiled(x, w), affine(x, w))
    assert dict(compiled.counts) == {"eager": 1, "compile": 1, "compiled": 2}
    with pytest.raises(ValueError, match="launch must be one of eager, graphs, compile"):
        launcher(affine, "cudagraphs", torch.device("cpu"))
