"""Profiles that are not measured: uniform routing, and a documented synthetic Zipf popularity.

Synthetic generator (used where real routing is not available, e.g. planning the real
DeepSeek-V4-Flash here): for each layer, a seeded random ranking of the experts and a Zipf law
p(rank r) = (r + 1)^-alpha / sum_j (j + 1)^-alpha. Counts are the expected routes of
`tokens_per_phase` tokens per phase (tokens x top_k x p, rounded), identical in every phase.
With alpha = 1 and 256 experts the top half of the experts gets ~89% of the routes. This is an
assumption about trained routing, not a measurement: plans built from it say so.

Both give the model's MTP blocks (config num_nextn_predict_layers) a row each after the main layers,
made the same way (the synthetic rankings continue the same generator: the main layers' rows are those
of a model without the block).
"""

from __future__ import annotations

import torch

from ostinato.checkpoint.config import ModelConfig
from ostinato.profile_format import PHASES, RoutingProfile

DEFAULT_TOKENS_PER_PHASE = 1_000_000


def uniform_profile(cfg: ModelConfig) -> RoutingProfile:
    """Every expert equally likely: what planning without a profile assumes."""
    M = cfg.mtp_blocks
    counts = torch.ones(cfg.n_layers + M, len(PHASES), cfg.n_routed_experts, dtype=torch.int64)
    return RoutingProfile(counts=counts, top_k=cfg.num_experts_per_tok, phase_boundary=0, source="uniform",
                          mtp_layers=M)


def synthetic_profile(cfg: ModelConfig, alpha: float = 1.0, seed: int = 0,
                      tokens_per_phase: int = DEFAULT_TOKENS_PER_PHASE) -> RoutingProfile:
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    zipf = torch.arange(1, E + 1, dtype=torch.float64).pow(-alpha)
    zipf = zipf / zipf.sum()                                                  # [E] by rank
    M = cfg.mtp_blocks
    counts = torch.empty(cfg.n_layers + M, len(PHASES), E, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    for layer in range(cfg.n_layers + M):
        rank = torch.randperm(E, generator=g)                                 # expert -> rank
        expected = (zipf[rank] * tokens_per_phase * k).round().to(torch.int64)  # [E]
        counts[layer] = expected.expand(len(PHASES), E)
    return RoutingProfile(counts=counts, top_k=k, phase_boundary=0, mtp_layers=M,
                          source=f"synthetic zipf alpha={alpha} seed={seed} tokens_per_phase={tokens_per_phase}")
