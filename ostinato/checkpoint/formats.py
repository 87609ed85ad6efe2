"""DeepSeek-V4 weight formats: FP8 e4m3 with e8m0 128x128 block scales, and MXFP4 experts.

Decoding is bit-exact with transformers' loader (docs/model.md 2.2): every product is a small-mantissa
value times a power of two, so float32 (and bfloat16) hold it exactly. Encoding follows the recipe
used for test checkpoints (power-of-two scales, round to nearest code).

Legend: N = output rows, K = input (contraction) columns, B = 128 (FP8 block), G = 32 (MXFP4 group).
"""

from __future__ import annotations

import torch

FP8_BLOCK = 128
FP8_MAX = 448.0
MXFP4_GROUP = 32
FP4_MAX = 6.0
E8M0_BIAS = 127

# e2m1 code -> value; bit 3 is the sign. Index = 4-bit code.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 byte b -> 2^(b-127) as float32 (255 is NaN, as the format defines)."""
    return scale.view(torch.uint8).to(torch.int32).sub(E8M0_BIAS).to(torch.float32).exp2().masked_fill(
        scale.view(torch.uint8) == 255, float("nan"))


def _e8m0_from_exponent(exponent: torch.Tensor) -> torch.Tensor:
    return (exponent + E8M0_BIAS).clamp(0, 254).to(torch.uint8).view(torch.float8_e8m0fnu)


def _pow2_exponent(amax: torch.Tensor, limit: float) -> torch.Tensor:
    """Smallest power-of-two exponent e with amax / 2^e <= limit (0 for an all-zero block)."""
    e = torch.ceil(torch.log2(amax.double() / limit))
    return torch.where(amax > 0, e, torch.zeros_like(e)).to(torch.int32)


# ----- FP8 ------------------------------------------------------------------------------------
def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [N, K] float8_e4m3fn, scale [ceil(N/B), ceil(K/B)] e8m0 -> W [N, K] in dtype."""
    n, k = q.shape
    s = e8m0_to_float(scale)  # [N/B, K/B]
    s = s.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]  # [N, K]
    return (q.to(torch.float32) * s).to(dtype)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] (multiples of 128) -> (q [N, K] e4m3, scale [N/B, K/B] e8m0)."""
    n, k = w.shape
    if n % FP8_BLOCK or k % FP8_BLOCK:
        raise ValueError(f"FP8 block quantization needs dims that are multiples of {FP8_BLOCK}, got {tuple(w.shape)}")
    blocks = w.float().reshape(n // FP8_BLOCK, FP8_BLOCK, k // FP8_BLOCK, FP8_BLOCK)  # [Nb, B, Kb, B]
    amax = blocks.abs().amax(dim=(1, 3))  # [Nb, Kb]
    exponent = _pow2_exponent(amax, FP8_MAX)
    s = exponent.to(torch.float32).exp2()[:, None, :, None]
    q = (blocks / s).clamp(-FP8_MAX, FP8_MAX).reshape(n, k).to(torch.float8_e4m3fn)
    return q, _e8m0_from_exponent(exponent)


# ----- MXFP4 ----------------------------------------------------------------------------------
def unpack_fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """packed [N, K/2] int8 -> codes [N, K] uint8 (low nibble is the even element)."""
    b = packed.view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def pack_fp4_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] uint8 (0..15) -> packed [N, K/2] int8."""
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).view(torch.int8)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed [N, K/2] int8, scale [N, K/G] e8m0 -> W [N, K] in dtype."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=packed.device)  # CUDA codes cannot index a CPU table
    values = lut[unpack_fp4_codes(packed).long()]  # [N, K]
    s = e8m0_to_float(scale).repeat_interleave(MXFP4_GROUP, dim=-1)  # [N, K]
    return (values * s).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] (K a multiple of 32) -> (packed [N, K/2] int8, scale [N, K/G] e8m0)."""
    n, k = w.shape
    if k % MXFP4_GROUP:
        raise ValueError(f"MXFP4 needs an input dim that is a multiple of {MXFP4_GROUP}, got {k}")
    groups = w.float().reshape(n, k // MXFP4_GROUP, MXFP4_GROUP)  # [N, K/G, G]
    exponent = _pow2_exponent(groups.abs().amax(dim=-1), FP4_MAX)  # [N, K/G]
    x = groups / exponent.to(torch.float32).exp2()[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8], dtype=torch.float32, device=w.device)
    # Nearest magnitude, the smaller one on an exact tie (bucketize puts a midpoint in the lower bucket).
    midpoints = (magnitudes[1:] + magnitudes[:-1]) / 2
    code = torch.bucketize(x.abs(), midpoints).to(torch.uint8)  # [N, K/G, G]
    code = code | ((x < 0).to(torch.uint8) << 3)
    return pack_fp4_codes(code.reshape(n, k)), _e8m0_from_exponent(exponent)
