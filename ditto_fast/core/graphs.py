"""How a function of tensors is launched (the engine option `launch`): `eager` calls it; `graphs` captures it once per
input shape as a CUDA graph and replays it; `compile` runs it through torch.compile (mode reduce-overhead).

The LMDM's DDIM step and warp + decode are launch-bound on a GPU: hundreds of small kernels, each launched from
Python (about 14 ms a step for the LMDM on an H200, where its arithmetic takes a fraction of that). A CUDA graph
records the kernels of one call and replays them with one launch, reading its inputs from buffers fixed at capture
(the static inputs: each call's tensors are copied into them) and writing its outputs into fixed buffers (valid until
the next replay: `take` copies what the caller keeps, under the lock). The same kernels on the same numbers: the same
results as eager.

`Launched` keeps the bookkeeping: the first call at an input shape runs eagerly (cuDNN and cuBLAS choose their
kernels, the allocator settles), the second captures, later ones replay; at most `max_graphs` shapes are captured
(others run eagerly: a render's last, shorter batch, seen once a clip); one call at a time (the engine's render and
its live sessions may share it). On a CPU there are no graphs: `Rerun` stands in for one (its replay calls the
function again on the static buffers), so the bookkeeping runs, and is tested, the same on every machine; the
engine itself launches eagerly on a CPU whatever the option says (`launcher`).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import torch

from ditto_fast.core.config import LAUNCHES

Take = Callable[[Any], Any]


class Rerun:
    """A CPU's stand-in for a captured CUDA graph: `replay()` calls the function again on the static inputs and
    copies its results into the static outputs, as a graph's replay writes them."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...]):
        self.fn, self.inputs = fn, inputs
        self.outputs = fn(*inputs)

    def replay(self) -> None:
        fresh = self.fn(*self.inputs)
        for static, new in zip(_tensors(self.outputs), _tensors(fresh)):
            static.copy_(new)


class CudaGraph:
    """`fn` captured over the static `inputs` as a CUDA graph (after one warm-up call on a side stream, as torch's
    docs ask); `pool`: the memory pool it shares with the other graphs of its Launched."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], pool: Any):
        self.inputs, device = inputs, inputs[0].device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: an engine's other threads (a live session beside a render) may call CUDA meanwhile
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.outputs = fn(*inputs)

    def replay(self) -> None:
        self.graph.replay()


def _tensors(out: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of a function's result: one tensor, or a tuple or list of them."""
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


class Launched:
    """`fn` (tensors in, a tensor or a tuple of tensors out) launched eagerly at a shape's first call, captured at its
    second, replayed after; see the module docstring. `skip_unchanged`: an input that is the very tensor object of the
    previous replay is not copied again (its owner never changes a tensor in place between calls: the DDIM step's
    encoded condition, the same for every step of a window)."""

    def __init__(self, fn: Callable[..., Any], *, cuda: bool, max_graphs: int = 2, eager_calls: int = 1,
                 skip_unchanged: bool = False):
        self.fn, self.cuda, self.max_graphs, self.eager_calls = fn, cuda, max_graphs, eager_calls
        self.skip_unchanged = skip_unchanged
        self.graphs: dict[tuple, CudaGraph | Rerun] = {}
        self.seen: Counter = Counter()          # calls per shape not captured (yet)
        self.counts = Counter()                 # eager, capture, replay: what each call did
        self.copies = 0                         # inputs copied into static buffers
        self._last: dict[tuple, tuple] = {}     # shape -> the input tensors of its last replay (skip_unchanged)
        self._pool = torch.cuda.graph_pool_handle() if cuda else None
        self._lock = threading.Lock()

    def __call__(self, *inputs: torch.Tensor, take: Take = lambda out: out) -> Any:
        """`take(fn(*inputs))`: the eager result, or the graph's static outputs (taken under the lock, before any other
        call can replay over them)."""
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        with self._lock:
            graph = self.graphs.get(key)
            if graph is None:
                self.seen[key] += 1
                if self.seen[key] <= self.eager_calls or len(self.graphs) >= self.max_graphs:
                    self.counts["eager"] += 1
                    return take(self.fn(*inputs))
                static = tuple(t.detach().clone() for t in inputs)
                graph = self.graphs[key] = CudaGraph(self.fn, static, self._pool) if self.cuda else \
                    Rerun(self.fn, static)
                del self.seen[key]
                self.counts["capture"] += 1
            else:
                self.counts["replay"] += 1
            last = self._last.get(key)
            for i, (static, new) in enumerate(zip(graph.inputs, inputs)):
                if not (self.skip_unchanged and last is not None and last[i] is new):
                    static.copy_(new)
                    self.copies += 1
            if self.skip_unchanged:
                self._last[key] = inputs
            graph.replay()
            return take(graph.outputs)


class Compiled:
    """`fn` through torch.compile (mode reduce-overhead: compiled kernels replayed as CUDA graphs on a GPU), one call
    at a time, its outputs taken before the next call."""

    def __init__(self, fn: Callable[..., Any], *, cuda: bool):
        self.cuda = cuda
        self.fn = torch.compile(fn, mode="reduce-overhead" if cuda else "default", dynamic=False)
        self.counts = Counter()
        self._lock = threading.Lock()

    def __call__(self, *inputs: torch.Tensor, take: Take = lambda out: out) -> Any:
        with self._lock:
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()      # the previous call's outputs are taken
            self.counts["compiled"] += 1
            return take(self.fn(*inputs))


def launcher(fn: Callable[..., Any], launch: str, device: torch.device, **graph_options: Any
             ) -> Launched | Compiled | None:
    """How `fn` is launched on `device` for the engine option `launch` (one of LAUNCHES): None for eager (call `fn`
    as it is), and for graphs on a CPU (nothing to capture there)."""
    if launch not in LAUNCHES:
        raise ValueError(f"launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
    cuda = torch.device(device).type == "cuda"
    if launch == "compile":
        return Compiled(fn, cuda=cuda)
    if launch == "graphs" and cuda:
        return Launched(fn, cuda=True, **graph_options)
    return None
