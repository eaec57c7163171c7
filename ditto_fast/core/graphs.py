"""How a function of tensors is launched (the engine option `launch`): `eager` calls it; `graphs` captures it once per
input shape as a CUDA graph and replays it; `compile` runs it through torch.compile (mode reduce-overhead).

The LMDM's DDIM step and warp + decode are launch-bound on a GPU: hundreds of small kernels, each launched from
Python (about 14 ms a step for the LMDM on an H200, where its arithmetic takes a fraction of that). A CUDA graph
records the kernels of one call and replays them with one launch, reading its inputs from buffers fixed at capture
(the static inputs: each call's tensors are copied into them) and writing its outputs into fixed buffers (valid until
the next replay: `take` copies what the caller keeps, under the lock). The same kernels on the same numbers: the same
results as eager.

`PerShape` keeps the bookkeeping both share: the first call at an input shape runs eagerly (cuDNN and cuBLAS choose
their kernels, the allocator settles), the second captures (`Launched`) or compiles (`Compiled`), later ones replay;
at most two shapes are taken (others run eagerly: a render's last, shorter batch, seen once a clip); one call at a
time (the engine's render and its live sessions may share it). On a CPU there are no graphs: `Rerun` stands in for
one (its replay calls the function again on the static buffers), so the bookkeeping runs, and is tested, the same on
every machine; the engine itself launches eagerly on a CPU when asked for graphs (`launcher`).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import torch

from ditto_fast.core.config import LAUNCHES

Take = Callable[[Any], Any]
BUCKETS = (1, 2, 4, 8)          # the batch sizes shared batches are padded to: each captured once, at warm-up


def bucket(rows: int) -> int:
    """The batch size `rows` rows run at when shared: the smallest of BUCKETS that holds them (more: as they are)."""
    return next((b for b in BUCKETS if b >= rows), rows)


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
    docs ask) on the inputs' device; `pool`: the memory pool it shares with the other graphs of its Launched."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], pool: Any):
        self.inputs, self.device = inputs, inputs[0].device
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn(*inputs)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the engine's other threads (a live session beside a render) may call CUDA meanwhile
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs = fn(*inputs)

    def replay(self) -> None:
        with torch.cuda.device(self.device):        # on the device's current stream, after the inputs' copies
            self.graph.replay()


def _tensors(out: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of a function's result: one tensor, or a tuple or list of them."""
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


class PerShape:
    """The bookkeeping every launcher of `fn` shares: a shape's first `eager_calls` calls run eagerly, then the shape
    is admitted (at most `max_shapes` of them: the rest always eager) and runs the launcher's own way; one call at a
    time, its result taken (`take`) before the next call can write over it. `counts` says what each call did."""

    def __init__(self, fn: Callable[..., Any], *, max_shapes: int = 2, eager_calls: int = 1):
        self.fn, self.max_shapes, self.eager_calls = fn, max_shapes, eager_calls
        self.admitted: set[tuple] = set()
        self.seen: Counter = Counter()          # eager calls per shape not admitted (yet)
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def __call__(self, *inputs: torch.Tensor, take: Take = lambda out: out) -> Any:
        """`take(fn(*inputs))`, launched eagerly or the launcher's way (taken under the lock)."""
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        with self._lock:
            if key not in self.admitted:
                self.seen[key] += 1
                if self.seen[key] <= self.eager_calls or len(self.admitted) >= self.max_shapes:
                    self.counts["eager"] += 1
                    return take(self.fn(*inputs))
                self.admitted.add(key)
                del self.seen[key]
                return take(self._first(key, inputs))
            return take(self._again(key, inputs))

    def _first(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        raise NotImplementedError

    def _again(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        raise NotImplementedError


class Launched(PerShape):
    """`fn` (tensors in, a tensor or a tuple of tensors out) captured at a shape's second call (a CUDA graph, or on a
    CPU its stand-in), replayed after; see the module docstring. `skip_unchanged`: an input that is the very tensor
    object of the previous replay is not copied again (its owner never changes a tensor in place between calls: the
    DDIM step's encoded condition, the same for every step of a window)."""

    def __init__(self, fn: Callable[..., Any], *, cuda: bool, max_graphs: int = 2, eager_calls: int = 1,
                 skip_unchanged: bool = False):
        super().__init__(fn, max_shapes=max_graphs, eager_calls=eager_calls)
        self.cuda, self.skip_unchanged = cuda, skip_unchanged
        self.graphs: dict[tuple, CudaGraph | Rerun] = {}
        self.copies = 0                         # inputs copied into static buffers
        self._last: dict[tuple, tuple] = {}     # shape -> the input tensors of its last replay (skip_unchanged)
        self._pool = torch.cuda.graph_pool_handle() if cuda else None

    def _first(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        static = tuple(t.detach().clone() for t in inputs)
        self.graphs[key] = CudaGraph(self.fn, static, self._pool) if self.cuda else Rerun(self.fn, static)
        self.counts["capture"] += 1
        return self._replay(key, inputs)

    def _again(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        self.counts["replay"] += 1
        return self._replay(key, inputs)

    def _replay(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        graph, last = self.graphs[key], self._last.get(key)
        for i, (static, new) in enumerate(zip(graph.inputs, inputs)):
            if not (self.skip_unchanged and last is not None and last[i] is new):
                static.copy_(new)
                self.copies += 1
        if self.skip_unchanged:
            self._last[key] = inputs
        graph.replay()
        return graph.outputs


class Compiled(PerShape):
    """`fn` through torch.compile (mode reduce-overhead: compiled kernels replayed as CUDA graphs on a GPU) at the
    shapes admitted, each compiled at its second call (a compile takes a minute or more: the few shapes a render
    repeats, not its last shorter batch); other shapes eager. `skip_unchanged` is the graphs' (compiled code keeps
    its own static buffers)."""

    def __init__(self, fn: Callable[..., Any], *, cuda: bool, max_graphs: int = 2, eager_calls: int = 1,
                 skip_unchanged: bool = False):
        super().__init__(fn, max_shapes=max_graphs, eager_calls=eager_calls)
        self.cuda = cuda
        self.compiled = torch.compile(fn, mode="reduce-overhead" if cuda else "default", dynamic=False)

    def _first(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        self.counts["compile"] += 1
        return self._call(inputs)

    def _again(self, key: tuple, inputs: tuple[torch.Tensor, ...]) -> Any:
        self.counts["compiled"] += 1
        return self._call(inputs)

    def _call(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()      # the previous call's outputs were taken
        return self.compiled(*inputs)


def launcher(fn: Callable[..., Any], launch: str, device: torch.device, **graph_options: Any
             ) -> Launched | Compiled | None:
    """How `fn` is launched on `device` for the engine option `launch` (one of LAUNCHES): None for eager (call `fn`
    as it is), and for graphs on a CPU (nothing to capture there)."""
    if launch not in LAUNCHES:
        raise ValueError(f"launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
    cuda = torch.device(device).type == "cuda"
    if launch == "compile":
        return Compiled(fn, cuda=cuda, **graph_options)
    if launch == "graphs" and cuda:
        return Launched(fn, cuda=True, **graph_options)
    return None
