"""Exact byte sizes of a DeepSeek-V4 checkpoint, from config.json alone (no weights needed).

These are the stored bytes (FP8 + scales, MXFP4 + scales, BF16/F32 as stored), the numbers the
placement planner budgets with.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .config import ModelConfig
from .tensor_specs import expert_specs, global_specs, layer_specs


@dataclass(frozen=True)
class LayerSizes:
    layer: int
    attention_kind: str
    hash_layer: bool
    dense_bytes: int                  # everything but the routed experts
    dense_by_role: dict = field(hash=False)
    expert_bytes: int                 # one routed expert (all experts of a model have the same size)
    n_experts: int

    @property
    def routed_bytes(self) -> int:
        return self.expert_bytes * self.n_experts


@dataclass(frozen=True)
class ModelSizes:
    layers: tuple[LayerSizes, ...]
    global_bytes: int                 # embed + head + final norm + hc head
    global_by_role: dict = field(hash=False)

    @property
    def expert_bytes(self) -> int:
        return self.layers[0].expert_bytes

    @property
    def routed_bytes(self) -> int:
        return sum(l.routed_bytes for l in self.layers)

    @property
    def dense_layer_bytes(self) -> int:
        return sum(l.dense_bytes for l in self.layers)

    @property
    def dense_bytes(self) -> int:
        """All non-routed bytes: every layer's dense part plus the global tensors."""
        return self.dense_layer_bytes + self.global_bytes

    @property
    def total_bytes(self) -> int:
        return self.dense_bytes + self.routed_bytes


def model_sizes(cfg: ModelConfig) -> ModelSizes:
    layers = []
    for layer in range(cfg.num_hidden_layers):
        by_role: dict[str, int] = defaultdict(int)
        for spec in layer_specs(cfg, layer, with_experts=False):
            by_role[spec.role] += spec.nbytes
        one_expert = sum(s.nbytes for s in expert_specs(cfg, layer, 0))
        layers.append(LayerSizes(layer, cfg.attention_kind(layer), cfg.is_hash_layer(layer), sum(by_role.values()),
                                 dict(by_role), one_expert, cfg.n_routed_experts))
    g: dict[str, int] = defaultdict(int)
    for spec in global_specs(cfg):
        g[spec.role] += spec.nbytes
    return ModelSizes(tuple(layers), sum(g.values()), dict(g))
