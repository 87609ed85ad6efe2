"""Interleaved rotary position embedding on the trailing channels of a head (docs/model.md section 3).

Pairs (2i, 2i+1) of the last R channels rotate by pos * theta_i. Sliding-only layers use the plain
base (rope_theta); layers with a compressor (CSA, HCA; their compressor and indexer too) use
compress_rope_theta with YaRN frequency interpolation and no mscale. The frequencies and the angle
product are computed exactly as transformers does (float32), so positions far out agree bit for bit.

Legend: T positions, R rope channels (qk_rope_head_dim), R2 = R/2 frequencies, ... leading dims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ostinato.checkpoint.config import ModelConfig

from .fused import active, inductor_generates


def plain_inv_freq(base: float, rope_dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))  # [R2]


def yarn_inv_freq(base: float, rope_dim: int, factor: float, original_max: int, beta_fast: float,
                  beta_slow: float) -> torch.Tensor:
    """YaRN: low frequencies are interpolated by `factor`, high ones kept, a linear ramp between."""
    pos_freqs = base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)  # [R2]

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [R2]
    keep = 1 - ramp  # share of the original (extrapolated) frequency
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


@dataclass(frozen=True)
class Rope:
    """One frequency table; `cos_sin(positions)` gives the per-position rotation."""

    inv_freq: torch.Tensor  # [R2] float32

    @property
    def rope_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)  # [T, R2]
        return freqs.cos(), freqs.sin()

    def to(self, device: torch.device | str) -> Rope:
        return Rope(self.inv_freq.to(device))


def rope_tables(cfg: ModelConfig) -> dict[str, Rope]:
    """{"main": plain RoPE of sliding layers, "compress": YaRN RoPE of CSA/HCA layers}."""
    rs = cfg.rope_scaling
    r = cfg.qk_rope_head_dim
    return {"main": Rope(plain_inv_freq(cfg.rope_theta, r)),
            "compress": Rope(yarn_inv_freq(cfg.compress_rope_theta, r, rs["factor"],
                                           rs["original_max_position_embeddings"],
                                           rs.get("beta_fast") or 32, rs.get("beta_slow") or 1))}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last R channels of x [T, ..., C] by cos/sin [T, R2]; `inverse` rotates by -angle.

    The rotation runs in float32 and is cast back to x's dtype, as in transformers. Each pair
    (2i, 2i+1) is the complex number a + bi times cos + i sin: (a cos - b sin) + (b cos + a sin) i,
    the same products and sums as the real formula, in about 10 ops instead of 17; one generated
    kernel when a plan's forward runs (fused.py).
    """
    if inductor_generates():
        return _rope_real(x, cos, sin, inverse)
    kernels = active()
    if kernels is not None and kernels.takes(x) and cos.is_contiguous() and sin.is_contiguous():
        return kernels.rope(x, cos, sin, inverse)
    r = 2 * cos.shape[-1]
    lead = (x.shape[0],) + (1,) * (x.dim() - 2)  # broadcast over head dims between T and C
    turn = torch.complex(cos, -sin if inverse else sin).reshape(*lead, -1)  # [T, 1.., R2] complex64
    pairs = x[..., -r:].float()  # [T, .., R]
    if pairs.storage_offset() % 2 or any(st % 2 for st in pairs.stride()[:-1]) or pairs.stride(-1) != 1:
        pairs = pairs.contiguous()  # view_as_complex needs whole complex numbers in place
    rotated = torch.view_as_real(torch.view_as_complex(pairs.unflatten(-1, (-1, 2))) * turn).flatten(-2)  # [T, .., R]
    return torch.cat((x[..., :-r], rotated.to(x.dtype)), dim=-1)


def _rope_real(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    """apply_rope's products and sums written on real pairs, for a compiled step (engine/cpu_step.py):
    Inductor generates no code for complex tensors, and this it fuses with the ops around it."""
    r = 2 * cos.shape[-1]
    lead = (x.shape[0],) + (1,) * (x.dim() - 2)
    c, s = cos.reshape(*lead, -1), (-sin if inverse else sin).reshape(*lead, -1)  # [T, 1.., R2]
    a, b = x[..., -r:].float().unflatten(-1, (-1, 2)).unbind(-1)  # [T, .., R2] each
    rotated = torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)  # [T, .., R]
    return torch.cat((x[..., :-r], rotated.to(x.dtype)), dim=-1)
