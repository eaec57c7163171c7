"""DDIM sampling for the LMDM: Ditto's 1000-step cosine schedule, a small scheduler object and the sampling loop."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

NUM_TRAIN_TIMESTEPS = 1000


def cosine_betas(num_timesteps: int = NUM_TRAIN_TIMESTEPS, cosine_s: float = 8e-3) -> torch.Tensor:
    """Cosine beta schedule (Nichol & Dhariwal), computed in float64 and clipped to [0, 0.999]."""
    steps = torch.arange(num_timesteps + 1, dtype=torch.float64) / num_timesteps + cosine_s
    f = torch.cos(steps / (1 + cosine_s) * math.pi / 2).pow(2)
    f = f / f[0]
    return (1 - f[1:] / f[:-1]).clamp(0.0, 0.999)  # [T] float64


def cosine_alphas_cumprod(num_timesteps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """Cumulative product of (1 - beta) in float32, as Ditto computes it (betas cast to float32 first)."""
    alphas = 1.0 - cosine_betas(num_timesteps).to(torch.float32)
    return torch.cumprod(alphas, dim=0)  # [T] float32


class DDIMScheduler:
    """DDIM over Ditto's cosine schedule, eta = 1, any number of sampling steps.

    After ``set_timesteps(n)``: ``time_pairs`` is the list of ``(t, t_next)`` with ``t_next = -1`` last;
    ``alpha_next_sqrt``, ``sigma`` and ``c`` are float32 tensors with one entry per pair but the last.
    """

    def __init__(self, num_train_timesteps: int = NUM_TRAIN_TIMESTEPS, eta: float = 1.0):
        self.num_train_timesteps = num_train_timesteps
        self.eta = eta
        self.alphas_cumprod = cosine_alphas_cumprod(num_train_timesteps)  # [T] float32
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
             generator: torch.Generator | None = None) -> torch.Tensor:
        """x at the next timestep from the model's predictions at step `index`; the last step returns x_start."""
        if index == len(self.time_pairs) - 1:
            return x_start
        if generator is None:
            raise ValueError("DDIM step with eta > 0 needs a torch.Generator for its noise")
        noise = torch.randn(x_start.shape, generator=generator, device=generator.device,
                            dtype=torch.float32).to(device=x_start.device, dtype=x_start.dtype)
        return (x_start * self.alpha_next_sqrt[index].item() + self.c[index].item() * pred_noise
                + self.sigma[index].item() * noise)


@torch.no_grad()
def ddim_sample(net: nn.Module, cond_frame: torch.Tensor, cond: torch.Tensor, steps: int,
                generator: torch.Generator) -> torch.Tensor:
    """Ditto's DDIM loop: motion [B, seq_len, motion_dim] float32 for cond_frame [B, 265] and cond [B, seq_len, C].

    All noise (the start and every step's) is drawn from `generator`; the condition is encoded
    once and reused by every step.
    """
    scheduler = DDIMScheduler()
    scheduler.set_timesteps(steps)
    batch = cond_frame.shape[0]
    device = cond_frame.device
    x = torch.randn((batch, net.seq_len, net.motion_dim), generator=generator, device=generator.device,
                    dtype=torch.float32).to(device)
    encoded = net.encode_condition(cond)
    for i, t in enumerate(scheduler.timesteps):
        time = torch.full((batch,), t, dtype=torch.long, device=device)
        pred_noise, x_start = net.guided(x, cond_frame, encoded, time)
        x = scheduler.step(pred_noise, x_start, i, generator)
    return x  # [B, seq_len, motion_dim]
