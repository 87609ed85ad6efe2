"""Random weights for a tiny checkpoint, encoded in the official storage formats.

Each tensor gets its own generator seeded from (seed, name), so a tensor does not change when
another is added, and the same seed always gives the same bytes.

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


def _expert_weight(cfg: ModelConfig, spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    rows = spec.shape[0]
    cols = spec.shape[1] * 2  # packed: two codes per byte
    return torch.randn((rows, cols), generator=g) / math.sqrt(cols)


def encode_tensors(cfg: ModelConfig, specs: list[TensorSpec], seed: int, popularity: float) -> dict[str, torch.Tensor]:
    """Stored tensors for `specs` (weights with their `.scale` siblings), in the official dtypes."""
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.is_scale or spec.name in out:
            continue  # produced together with its weight
        g = _generator(seed, spec.name)
        if spec.role == "hash_table":
            probs = popularity_logits(cfg, spec.layer, seed, popularity).softmax(0)
            rows = torch.multinomial(probs.float().expand(spec.shape[0], -1), spec.shape[1], replacement=False,
                                     generator=g)
            out[spec.name] = rows.to(torch.int64)
        elif spec.role == "routed_expert":
            q, s = quantize_mxfp4(_expert_weight(cfg, spec, g))
            out[spec.name], out[_scale(spec.name)] = q, s
        elif spec.dtype == "F8_E4M3":
            q, s = quantize_fp8(_dense_value(spec, g))
            out[spec.name], out[_scale(spec.name)] = q, s
        else:
            value = _dense_value(spec, g)
            if spec.name.endswith("gate.bias"):
                value = value + popularity_logits(cfg, spec.layer, seed, popularity).float()
            out[spec.name] = value.to(torch.bfloat16 if spec.dtype == "BF16" else torch.float32)
    return out


def _scale(weight_name: str) -> str:
    return weight_name[: -len("weight")] + "scale"
