"""Random weights for a tiny checkpoint, encoded in the official storage formats.

Each tensor gets its own generator seeded from (seed, name), so a tensor does not change when
another is added, and the same seed always gives the same bytes. The 0731 release was retrained: its
tensors are seeded from (seed, "0731:" + name), so the two releases never share weights.

Planted popularity (synthetic, off by default): random weights route almost uniformly, unlike a
trained model. With strength S > 0 each layer gets a random expert ranking with Zipf-like
popularity p_e ~ exp(S * z_e), z = standardized log(1/rank). Score layers add S * z to the gate
bias (which steers selection only, never the routing weights); hash layers draw tid2eid rows from
p without replacement. S = 1 already makes the top quarter of experts take most routes.
"""

from __future__ import annotations

import math
import zlib

import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.formats import quantize_fp8, quantize_mxfp4
from ostinato.checkpoint.tensor_specs import TensorSpec


def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63))


def popularity_logits(cfg: ModelConfig, layer: int, seed: int, strength: float) -> torch.Tensor:
    """[E] float64: S * z_e, the planted log-popularity of each expert of `layer` (0 when S = 0)."""
    E = cfg.n_routed_experts
    if strength == 0:
        return torch.zeros(E, dtype=torch.float64)
    rank = torch.randperm(E, generator=_generator(seed, f"popularity.{layer}")).double()  # expert -> rank
    z = -torch.log1p(rank)
    z = (z - z.mean()) / z.std()
    return strength * z


def _dense_value(spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    """fp32 values for a non-expert tensor, scaled so activations stay O(1)."""
    name, shape = spec.name, spec.shape
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith("_base"):
        return 0.5 * torch.randn(shape, generator=g)       # spread, so Sinkhorn is not trivial
    if name.endswith("_scale") and "hc_" in name:
        return 0.5 + 0.5 * torch.rand(shape, generator=g)
    if name.endswith("attn_sink"):
        return torch.randn(shape, generator=g)
    if name.endswith(".ape"):
        return 0.1 * torch.randn(shape, generator=g)
    if name == "embed.weight":
        return torch.randn(shape, generator=g)
    if name.endswith("gate.bias"):
        return 0.01 * torch.randn(shape, generator=g)
    # linear weights and hc_*_fn: [out, in], std in^-1/2
    return torch.randn(shape, generator=g) / math.sqrt(shape[-1])


# Tensors above this many elements (V4-Flash's embedding and head: 529M) are made a block of rows at
# a time straight into their stored dtype, so the float32 draft of the whole tensor never exists.
BLOCKED_ELEMENTS = 1 << 26
_BLOCK_ROWS = 4096


def _blocked_value(spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    out = torch.empty(spec.shape, dtype=torch.bfloat16 if spec.dtype == "BF16" else torch.float32)
    for start in range(0, spec.shape[0], _BLOCK_ROWS):
        rows = min(_BLOCK_ROWS, spec.shape[0] - start)
        block = TensorSpec(spec.name, (rows,) + spec.shape[1:], spec.dtype, spec.role, spec.layer)
        out[start:start + rows] = _dense_value(block, g)
    return out


def _expert_weight(cfg: ModelConfig, spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    rows = spec.shape[0]
    cols = spec.shape[1] * 2  # packed: two codes per byte
    return torch.randn((rows, cols), generator=g) / math.sqrt(cols)


def encode_spec(cfg: ModelConfig, spec: TensorSpec, seed: int, popularity: float,
                release: str = "original") -> dict[str, torch.Tensor]:
    """The stored tensor(s) for `spec` in the official dtypes: a quantized weight comes with its `.scale`."""
    g = _generator(seed, spec.name if release == "original" else f"{release}:{spec.name}")
    if spec.role == "hash_table":
        probs = popularity_logits(cfg, spec.layer, seed, popularity).softmax(0)
        rows = torch.multinomial(probs.float().expand(spec.shape[0], -1), spec.shape[1], replacement=False,
                                 generator=g)
        return {spec.name: rows.to(torch.int64)}
    if spec.role == "routed_expert":
        q, s = quantize_mxfp4(_expert_weight(cfg, spec, g))
        return {spec.name: q, _scale(spec.name): s}
    if spec.dtype == "F8_E4M3":
        q, s = quantize_fp8(_dense_value(spec, g))
        return {spec.name: q, _scale(spec.name): s}
    if math.prod(spec.shape) > BLOCKED_ELEMENTS:
        return {spec.name: _blocked_value(spec, g)}
    value = _dense_value(spec, g)
    if spec.name.endswith("gate.bias"):
        value = value + popularity_logits(cfg, spec.layer, seed, popularity).float()
    return {spec.name: value.to(torch.bfloat16 if spec.dtype == "BF16" else torch.float32)}


def _scale(weight_name: str) -> str:
    return weight_name[: -len("weight")] + "scale"
