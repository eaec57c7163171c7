"""DDIM sampling for the LMDM: a small scheduler (set_timesteps / step), the per-window sampling loop, and the
network's step as the engine launches it (`Denoiser`).

The scheduler holds all of DDIM's maths (which timesteps, the per-step coefficients, the update);
the network only predicts (pred_noise, x_start) at a timestep, and this module wires the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from ditto_fast.core.graphs import BUCKETS, launcher
from ditto_fast.models.lmdm import DEFAULT_GUIDANCE, EncodedCondition, cosine_alphas_cumprod


Generators = torch.Generator | Sequence[torch.Generator]


def draw(shape: tuple, generator: Generators) -> torch.Tensor:
    """Standard normal float32 noise of `shape` from one generator, or row by row from one generator per row (windows
    of several sessions sampled together: each row's noise is what its session alone would draw)."""
    if isinstance(generator, torch.Generator):
        return torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    if len(generator) != shape[0]:
        raise ValueError(f"{len(generator)} generators for {shape[0]} rows")
    return torch.cat([torch.randn((1, *shape[1:]), generator=g, device=g.device, dtype=torch.float32)
                      for g in generator])


class DDIMScheduler:
    """DDIM over a training noise schedule (default: Ditto's 1000-step cosine one), eta = 1, any number of steps.

    After ``set_timesteps(n)``: ``time_pairs`` is the list of ``(t, t_next)`` with ``t_next = -1`` last;
    ``alpha_next_sqrt``, ``sigma`` and ``c`` are float32 tensors with one entry per pair but the last.
    """

    def __init__(self, alphas_cumprod: torch.Tensor | None = None, eta: float = 1.0):
        self.alphas_cumprod = cosine_alphas_cumprod() if alphas_cumprod is None else alphas_cumprod  # [T] float32
        self.num_train_timesteps = int(self.alphas_cumprod.shape[0])
        self.eta = eta
        self.time_pairs: list[tuple[int, int]] = []
        self.alpha_next_sqrt = torch.empty(0)
        self.sigma = torch.empty(0)
        self.c = torch.empty(0)

    @property
    def timesteps(self) -> list[int]:
        """The model timestep of each sampling step, from noisiest to cleanest."""
        return [t for t, _ in self.time_pairs]

    def set_timesteps(self, num_inference_steps: int) -> None:
        """Choose `num_inference_steps` evenly spaced timesteps and the per-step DDIM coefficients."""
        if num_inference_steps < 1 or num_inference_steps > self.num_train_timesteps:
            raise ValueError(f"sampling steps must be in 1..{self.num_train_timesteps}, got {num_inference_steps}")
        times = torch.linspace(-1, self.num_train_timesteps - 1, steps=num_inference_steps + 1)
        times = list(reversed(times.int().tolist()))  # truncation toward zero, like Ditto
        self.time_pairs = list(zip(times[:-1], times[1:]))
        ac = self.alphas_cumprod
        alpha_next_sqrt, sigma, c = [], [], []
        for t, t_next in self.time_pairs[:-1]:
            a, a_next = ac[t], ac[t_next]
            s = self.eta * ((1 - a / a_next) * (1 - a_next) / (1 - a)).sqrt()
            alpha_next_sqrt.append(a_next.sqrt())
            sigma.append(s)
            c.append((1 - a_next - s ** 2).clamp_min(0).sqrt())
        self.alpha_next_sqrt = torch.stack(alpha_next_sqrt) if alpha_next_sqrt else torch.empty(0)
        self.sigma = torch.stack(sigma) if sigma else torch.empty(0)
        self.c = torch.stack(c) if c else torch.empty(0)

    def step(self, pred_noise: torch.Tensor, x_start: torch.Tensor, index: int,
             generator: Generators | None = None) -> torch.Tensor:
        """x at the next timestep from the model's predictions at step `index`; the last step returns x_start."""
        if index == len(self.time_pairs) - 1:
            return x_start
        if generator is None:
            raise ValueError("DDIM step with eta > 0 needs a torch.Generator for its noise")
        noise = draw(x_start.shape, generator).to(device=x_start.device, dtype=x_start.dtype)
        return (x_start * self.alpha_next_sqrt[index].item() + self.c[index].item() * pred_noise
                + self.sigma[index].item() * noise)


class Denoiser:
    """The LMDM's raw output at a DDIM step, (x [B,N,F], cond_frame [B,F], encoded condition, t [B]) -> [R,N,F]
    float32, launched as the engine option `launch` says (core/graphs.py): eager, or on CUDA captured once as a graph
    and replayed every step after (the step's hundreds of kernel launches in one: the same numbers), or compiled.
    One per engine: its graph serves every window of every clip and live session, one step at a time; each call's
    result is its own (a copy of the graph's output). The guidance and the DDIM update stay eager (they draw the
    step's noise from the caller's generator)."""

    def __init__(self, net: nn.Module, launch: str = "eager"):
        self.net = net
        device = net.input_projection.weight.device
        # a render's windows and, on a GPU engine carrying live sessions, each batch size of core/graphs.BUCKETS
        self._launched = launcher(self._flat, launch, device, max_graphs=len(BUCKETS) + 1, skip_unchanged=True)

    def _flat(self, x: torch.Tensor, cond_frame: torch.Tensor, t: torch.Tensor, hidden: torch.Tensor,
              *kv: torch.Tensor) -> torch.Tensor:
        """model_output over plain tensors (a graph's inputs): the encoding's keys and values flattened, layer by
        layer; its rows are B conditional then B null ones, as a guided step's are."""
        b = x.shape[0]
        enc = EncodedCondition(b, b, b, kv[0].shape[2], hidden, list(zip(kv[0::2], kv[1::2])))
        return self.net.model_output(x, cond_frame, enc, t)

    def __call__(self, x: torch.Tensor, cond_frame: torch.Tensor, enc: EncodedCondition,
                 t: torch.Tensor) -> torch.Tensor:
        if self._launched is None or not (enc.num_cond == enc.num_null == enc.batch == x.shape[0]):
            return self.net.model_output(x, cond_frame, enc, t)
        flat = [tensor for pair in enc.kv for tensor in pair]
        return self._launched(x, cond_frame, t, enc.hidden, *flat, take=torch.Tensor.clone)


class DDIMSampler:
    """One LMDM window by Ditto's DDIM loop: (cond_frame [B, F], cond [B, seq_len, C], generator) -> [B, seq_len, F].

    All noise (the start and every step's) is drawn from the generator; the condition is encoded
    once per window and reused by every step. Guided by weight `guidance` (Ditto's 2 by default). `denoise`: the
    engine's Denoiser (the network's step as it launches it); None: the network called as it is.
    """

    def __init__(self, net: nn.Module, steps: int, guidance: float = DEFAULT_GUIDANCE,
                 denoise: Denoiser | None = None):
        self.net, self.guidance, self.denoise = net, guidance, denoise
        self.scheduler = DDIMScheduler(net.alphas_cumprod)
        self.scheduler.set_timesteps(steps)

    @torch.no_grad()
    def __call__(self, cond_frame: torch.Tensor, cond: torch.Tensor, generator: Generators) -> torch.Tensor:
        """Sample one motion window [B, seq_len, F] float32 for these conditions; `generator`: one for the whole
        batch, or one per row."""
        net, scheduler = self.net, self.scheduler
        batch, device = cond_frame.shape[0], cond_frame.device
        x = draw((batch, net.seq_len, net.motion_dim), generator).to(device)
        encoded = net.encode_condition(cond)
        for i, t in enumerate(scheduler.timesteps):
            time = torch.full((batch,), t, dtype=torch.long, device=device)
            pred_noise, x_start = net.guided(x, cond_frame, encoded, time, self.guidance, self.denoise)
            x = scheduler.step(pred_noise, x_start, i, generator)
        return x  # [B, seq_len, motion_dim] float32
