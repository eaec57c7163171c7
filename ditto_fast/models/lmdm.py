"""LMDM: Ditto's latent motion diffusion model, a FiLM transformer decoder with rotary attention.

The network predicts the clean motion window x_start from a noisy one at timestep t; classifier-free
guidance (weight `guidance`, 2 by default, an argument of each call) runs the conditional and the
unconditional pass as one batch. The predicted noise follows from x_start and the noise level of t,
which the 1000-step cosine schedule the network was trained with defines; that schedule is here
because it is part of what the network's inputs and outputs mean. Sampling (which timesteps, the
DDIM step) is motion/ddim.py's. Parameter names follow Ditto's ``MotionDecoder`` so the published
``lmdm_v0.4_hubert.pth`` loads unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import gcd

import torch
import torch.nn as nn
import torch.nn.functional as F

DITTO_NUM_HEADS = 8
DEFAULT_GUIDANCE = 2.0      # Ditto's classifier-free guidance weight
NUM_TRAIN_TIMESTEPS = 1000
TINY_WIDTHS = {"latent_dim": 64, "ff_size": 128, "num_layers": 2, "num_cond_layers": 1,
               "num_heads": DITTO_NUM_HEADS, "cond_dim": 32 + 8 + 2 + 6 + 63}


# ---------------------------------------------------------------- helpers

def cosine_betas(num_timesteps: int = NUM_TRAIN_TIMESTEPS, cosine_s: float = 8e-3) -> torch.Tensor:
    """Cosine beta schedule (Nichol & Dhariwal), computed in float64 and clipped to [0, 0.999]."""
    # on the CPU even under a meta-device build: these are constants, not weights
    steps = torch.arange(num_timesteps + 1, dtype=torch.float64, device="cpu") / num_timesteps + cosine_s
    f = torch.cos(steps / (1 + cosine_s) * math.pi / 2).pow(2)
    f = f / f[0]
    return (1 - f[1:] / f[:-1]).clamp(0.0, 0.999)  # [T] float64


def cosine_alphas_cumprod(num_timesteps: int = NUM_TRAIN_TIMESTEPS) -> torch.Tensor:
    """Signal level of each training timestep: cumulative product of (1 - beta) in float32, as Ditto computes it."""
    alphas = 1.0 - cosine_betas(num_timesteps).to(torch.float32)
    return torch.cumprod(alphas, dim=0)  # [T] float32


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm whose statistics are computed in float32 whatever the parameter dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position angles over interleaved feature pairs; `freqs` stays float32 under .to(dtype)."""

    def __init__(self, dim: int, theta: float = 10000.0):
        super().__init__()
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, device="cpu")[: dim // 2].float() / dim)
        self.register_buffer("freqs", freqs)  # [dim/2]

    def _apply(self, fn, recurse=True):
        kept = self.freqs
        super()._apply(fn, recurse)
        if self.freqs.dtype != torch.float32:
            self.freqs = kept.to(device=self.freqs.device, dtype=torch.float32)
        return self

    def cos_sin(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of position * freq for positions 0..length-1, each [length, dim/2] float32."""
        pos = torch.arange(length, device=device, dtype=torch.float32)
        angles = pos[:, None] * self.freqs.to(device=device, dtype=torch.float32)[None, :]
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each interleaved feature pair (x0, x1) of x [..., N, D] by the angle of its position."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return out.flatten(-2).to(x.dtype)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] (sin half, then cos half) of integer timesteps t [B]."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -scale)
    angles = t.float()[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class Attention(nn.Module):
    """Multi-head attention with nn.MultiheadAttention's parameter layout (packed in_proj, out_proj)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"latent width {dim} is not divisible by {heads} attention heads")
        self.dim, self.heads = dim, heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def project(self, x: torch.Tensor, which: slice) -> torch.Tensor:
        """x [R, N, D] through the q/k/v rows selected by `which` (in units of D), split into heads."""
        d = self.dim
        rows = slice(which.start * d, which.stop * d)
        y = F.linear(x, self.in_proj_weight[rows], self.in_proj_bias[rows])
        n_parts = which.stop - which.start
        y = y.unflatten(-1, (n_parts, self.heads, d // self.heads)).permute(2, 0, 3, 1, 4)
        return y  # [parts, R, H, N, D/H]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Softmax attention over heads [R, H, N, D/H] -> [R, N, D] through out_proj."""
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(1, 2).flatten(2))


class FiLM(nn.Module):
    """Scale and shift [R, 1, D] from a conditioning vector [R, D] (Mish -> Linear)."""

    def __init__(self, dim: int):
        super().__init__()
        self.block = nn.Sequential(nn.Mish(), nn.Linear(dim, 2 * dim))

    def forward(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift = self.block(cond)[:, None, :].chunk(2, dim=-1)
        return scale, shift


# ---------------------------------------------------------------- blocks

class CondEncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with rotary self-attention (queries/keys rotated, values not)."""

    def __init__(self, dim: int, heads: int, ff_size: int, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.linear1 = nn.Linear(dim, ff_size)
        self.linear2 = nn.Linear(ff_size, dim)
        self.norm1 = FP32LayerNorm(dim)
        self.norm2 = FP32LayerNorm(dim)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k = self.self_attn.project(rotate(h, cos, sin), slice(0, 2))
        (v,) = self.self_attn.project(h, slice(2, 3))
        x = x + self.self_attn.attend(q, k, v)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class FiLMDecoderLayer(nn.Module):
    """Pre-norm decoder layer: rotary self-attention, cross-attention to the condition, GELU MLP, each FiLM-modulated."""

    def __init__(self, dim: int, heads: int, ff_size: int, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.multihead_attn = Attention(dim, heads)
        self.linear1 = nn.Linear(dim, ff_size)
        self.linear2 = nn.Linear(ff_size, dim)
        self.norm1 = FP32LayerNorm(dim)
        self.norm2 = FP32LayerNorm(dim)
        self.norm3 = FP32LayerNorm(dim)
        self.film1 = FiLM(dim)
        self.film2 = FiLM(dim)
        self.film3 = FiLM(dim)
        self.rotary = rotary

    def memory_kv(self, mem: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys (from rotated memory) and values for memory tokens [R, M, D] -> [R, H, M, D/H] each."""
        (k,) = self.multihead_attn.project(rotate(mem, cos, sin), slice(1, 2))
        (v,) = self.multihead_attn.project(mem, slice(2, 3))
        return k, v

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], t: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [R, N, D]; kv: cross-attention keys/values [R, H, M, D/H]; t [R, D]; cos/sin [N, D/2]
        h = self.norm1(x)
        q, k = self.self_attn.project(rotate(h, cos, sin), slice(0, 2))
        (v,) = self.self_attn.project(h, slice(2, 3))
        scale, shift = self.film1(t)
        x = x + (scale + 1) * self.self_attn.attend(q, k, v) + shift

        (q,) = self.multihead_attn.project(rotate(self.norm2(x), cos, sin), slice(0, 1))
        scale, shift = self.film2(t)
        x = x + (scale + 1) * self.multihead_attn.attend(q, *kv) + shift

        scale, shift = self.film3(t)
        y = self.linear2(F.gelu(self.linear1(self.norm3(x))))
        return x + (scale + 1) * y + shift  # [R, N, D]


class DecoderStack(nn.Module):
    """Holds the decoder layers under the checkpoint's `seqTransDecoder.stack.*` names."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.stack = nn.ModuleList(layers)


@dataclass
class EncodedCondition:
    """The condition side of the network, fixed across diffusion steps: rows are [conditional B | null B]."""

    batch: int                                  # B
    num_cond: int                               # 0 or B conditional rows (first)
    num_null: int                               # 0 or B unconditional rows (after)
    length: int                                 # L condition tokens
    hidden: torch.Tensor                        # [R, D] pooled condition for FiLM
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per decoder layer: keys/values [R, H, L, D/H]


# ---------------------------------------------------------------- model

def _randn(*shape: int) -> torch.Tensor:
    """Standard normal values; only the shape when built on the meta device (randn there costs half a second)."""
    t = torch.empty(*shape)
    return t if t.is_meta else torch.randn(*shape)


class LMDM(nn.Module):
    """(x [B,N,F], cond_frame [B,F], cond [B,N,C], t [B] int64, guidance=2) -> (pred_noise, x_start) [B,N,F]."""

    def __init__(self, motion_dim: int = 265, seq_len: int = 80, latent_dim: int = 512, ff_size: int = 1024,
                 num_layers: int = 8, num_cond_layers: int = 2, num_heads: int = DITTO_NUM_HEADS,
                 cond_dim: int = 1103):
        super().__init__()
        d = latent_dim
        self.motion_dim, self.seq_len, self.latent_dim = motion_dim, seq_len, latent_dim
        self.num_heads, self.cond_dim = num_heads, cond_dim

        self.rotary = RotaryEmbedding(d)
        self.time_mlp = nn.Sequential(nn.Identity(), nn.Linear(d, 4 * d), nn.Mish())  # [0] is the sinusoid
        self.to_time_cond = nn.Sequential(nn.Linear(4 * d, d))
        self.to_time_tokens = nn.Sequential(nn.Linear(4 * d, 2 * d))
        self.null_cond_embed = nn.Parameter(_randn(1, seq_len, d))
        self.null_cond_hidden = nn.Parameter(_randn(1, d))
        self.norm_cond = FP32LayerNorm(d)
        self.input_projection = nn.Linear(2 * motion_dim, d)
        self.cond_encoder = nn.Sequential(*[CondEncoderLayer(d, num_heads, ff_size, self.rotary)
                                            for _ in range(num_cond_layers)])
        self.cond_projection = nn.Linear(cond_dim, d)
        self.non_attn_cond_projection = nn.Sequential(FP32LayerNorm(d), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.seqTransDecoder = DecoderStack([FiLMDecoderLayer(d, num_heads, ff_size, self.rotary)
                                             for _ in range(num_layers)])
        self.final_layer = nn.Linear(d, motion_dim)

        # plain tensors, not state: they are no part of the checkpoint
        self.alphas_cumprod = cosine_alphas_cumprod()                        # [T] float32
        self._sqrt_recip1m_ac = torch.sqrt(1.0 / (1.0 - self.alphas_cumprod))  # [T] float32
        self._sqrt_recipm1_ac = torch.sqrt(1.0 / self.alphas_cumprod - 1)      # [T] float32

    @property
    def _dtype(self) -> torch.dtype:
        return self.input_projection.weight.dtype

    # -- condition side (once per window)

    def encode_condition(self, cond: torch.Tensor | None, with_cond: bool = True, with_null: bool = True,
                         batch: int | None = None) -> EncodedCondition:
        """Encode the condition cond [B, N, C] for the conditional rows and/or the null (dropped) rows."""
        dev, dtype = self.input_projection.weight.device, self._dtype
        if cond is not None:
            batch = cond.shape[0]
        if batch is None or (with_cond and cond is None) or not (with_cond or with_null):
            raise ValueError("encode_condition needs cond for conditional rows and at least one kind of row")
        if with_cond and (cond.ndim != 3 or cond.shape[-1] != self.cond_dim):
            raise ValueError(f"condition has shape {list(cond.shape)}; this LMDM expects [B, frames, {self.cond_dim}]")
        tokens, hidden = [], []
        if with_cond:
            c = self.cond_projection(cond.to(device=dev, dtype=dtype))  # [B, L, D]
            cos, sin = self.rotary.cos_sin(c.shape[1], dev)
            for layer in self.cond_encoder:
                c = layer(c, cos, sin)
            tokens.append(c)
            hidden.append(self.non_attn_cond_projection(c.mean(dim=-2)))
        if with_null:
            tokens.append(self.null_cond_embed.expand(batch, -1, -1))
            hidden.append(self.null_cond_hidden.expand(batch, -1))
        mem = self.norm_cond(torch.cat(tokens))  # [R, L, D]; per-token norm, so the time tokens can join later
        cos, sin = self.rotary.cos_sin(mem.shape[1], dev)
        kv = [layer.memory_kv(mem, cos, sin) for layer in self.seqTransDecoder.stack]
        return EncodedCondition(batch, batch if with_cond else 0, batch if with_null else 0, mem.shape[1],
                                torch.cat(hidden), kv)

    # -- denoiser

    def model_output(self, x: torch.Tensor, cond_frame: torch.Tensor, enc: EncodedCondition,
                     t: torch.Tensor) -> torch.Tensor:
        """Raw network output (x_start-like) [R, N, F] float32 for every row of `enc`, same x for each."""
        dtype, dev = self._dtype, self.input_projection.weight.device
        b, n, _ = x.shape
        if b != enc.batch:
            raise ValueError(f"x has batch {b} but the encoded condition has batch {enc.batch}")
        reps = (enc.num_cond + enc.num_null) // b
        x = x.to(device=dev, dtype=dtype)
        frame = cond_frame.to(device=dev, dtype=dtype)[:, None, :].expand(-1, n, -1)
        h = self.input_projection(torch.cat([x, frame], dim=-1))  # [B, N, D]

        t_hidden = self.time_mlp(timestep_embedding(t.to(dev), self.latent_dim).to(dtype))  # [B, 4D]
        t_vec = self.to_time_cond(t_hidden)                           # [B, D]
        t_tokens = self.to_time_tokens(t_hidden).unflatten(-1, (2, -1))  # [B, 2, D]

        t_vec = t_vec.repeat(reps, 1) + enc.hidden                    # [R, D]
        h = h.repeat(reps, 1, 1)                                      # [R, N, D]
        t_mem = self.norm_cond(t_tokens)                              # [B, 2, D], same for every kind of row
        cos_m, sin_m = self.rotary.cos_sin(enc.length + 2, dev)
        cos_m, sin_m = cos_m[enc.length:], sin_m[enc.length:]        # time tokens sit after the condition
        cos, sin = self.rotary.cos_sin(n, dev)
        for layer, (k_c, v_c) in zip(self.seqTransDecoder.stack, enc.kv):
            k_t, v_t = (kv.repeat(reps, 1, 1, 1) for kv in layer.memory_kv(t_mem, cos_m, sin_m))
            h = layer(h, (torch.cat([k_c, k_t], dim=2), torch.cat([v_c, v_t], dim=2)), t_vec, cos, sin)
        return self.final_layer(h).float()  # [R, N, F]

    def predict_noise_from_start(self, x_t: torch.Tensor, t: torch.Tensor, x_start: torch.Tensor) -> torch.Tensor:
        """Noise implied by x_start at timestep t: x_t / sqrt(1 - a) - x_start / sqrt(1 / a - 1)."""
        a = self._sqrt_recip1m_ac.to(t.device)[t].view(-1, 1, 1)
        b = self._sqrt_recipm1_ac.to(t.device)[t].view(-1, 1, 1)
        return a * x_t.float() - x_start / b

    def guided(self, x: torch.Tensor, cond_frame: torch.Tensor, enc: EncodedCondition, t: torch.Tensor,
               guidance: float = DEFAULT_GUIDANCE, model_output=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(pred_noise, x_start) [B, N, F] float32, guided by `guidance`, from an encoding with both kinds of rows;
        `model_output`: what computes the raw output in place of `self.model_output` (the same function, launched
        otherwise: a captured CUDA graph)."""
        if not (enc.num_cond and enc.num_null):
            raise ValueError("guidance needs an encoding with conditional and null rows")
        out = (model_output or self.model_output)(x, cond_frame, enc, t)
        cond_out, uncond_out = out[: enc.batch], out[enc.batch:]
        x_start = uncond_out + (cond_out - uncond_out) * guidance
        return self.predict_noise_from_start(x, t, x_start), x_start

    def forward(self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, t: torch.Tensor,
                guidance: float = DEFAULT_GUIDANCE) -> tuple[torch.Tensor, torch.Tensor]:
        # x [B, N, F], cond_frame [B, F], cond [B, N, C], t [B] int64 -> (pred_noise, x_start) [B, N, F]
        return self.guided(x, cond_frame, self.encode_condition(cond), t, guidance)


def widths_from_state_dict(sd: dict[str, torch.Tensor]) -> dict:
    """LMDM widths from checkpoint tensors; the head count is not stored, so Ditto's 8 (when it divides) is used."""
    motion_dim, latent = sd["final_layer.weight"].shape
    if sd["input_projection.weight"].shape[1] != 2 * motion_dim:
        raise ValueError("input_projection does not take [x, cond_frame] (multi-frame conditioning is unsupported)")

    def count(prefix: str) -> int:
        return len({k[len(prefix):].split(".")[0] for k in sd if k.startswith(prefix)})

    return {
        "motion_dim": int(motion_dim),
        "seq_len": int(sd["null_cond_embed"].shape[1]),
        "latent_dim": int(latent),
        "ff_size": int(sd["seqTransDecoder.stack.0.linear1.weight"].shape[0]),
        "num_layers": count("seqTransDecoder.stack."),
        "num_cond_layers": count("cond_encoder."),
        "num_heads": gcd(int(latent), DITTO_NUM_HEADS),
        "cond_dim": int(sd["cond_projection.weight"].shape[1]),
    }
