"""Routes (token -> expert assignments) grouped by expert: the layout every expert kernel reads.

Legend: T = tokens, k = experts per token, E = experts in the group, R = routes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupedRoutes:
    """Routes of expert e are offsets[e] .. offsets[e+1]-1, tokens ascending inside an expert."""

    offsets: torch.Tensor  # [E+1] int64
    token: torch.Tensor    # [R] int64
    weight: torch.Tensor   # [R] float32

    def __post_init__(self):
        if self.offsets.dtype != torch.int64 or self.token.dtype != torch.int64:
            raise ValueError("offsets and token must be int64")
        if self.weight.dtype != torch.float32:
            raise ValueError(f"weight must be float32, got {self.weight.dtype}")
        if int(self.offsets[-1]) != self.token.numel() or self.weight.numel() != self.token.numel():
            raise ValueError(f"offsets[-1]={int(self.offsets[-1])} must equal the route count {self.token.numel()}")

    @property
    def n_experts(self) -> int:
        return self.offsets.numel() - 1

    def counts(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]  # [E]


def group_flat_routes(token: torch.Tensor, expert: torch.Tensor, weight: torch.Tensor, n_experts: int) -> GroupedRoutes:
    """Flat routes token [R], expert [R] (0..E-1), weight [R] -> GroupedRoutes (on the CPU)."""
    token, expert, weight = token.cpu().long(), expert.cpu().long(), weight.cpu().float()
    order = torch.sort(expert * (int(token.max()) + 1 if token.numel() else 1) + token, stable=True).indices
    offsets = torch.zeros(n_experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.bincount(expert, minlength=n_experts), 0)
    return GroupedRoutes(offsets, token[order].contiguous(), weight[order].contiguous())


def group_routes(expert_ids: torch.Tensor, weights: torch.Tensor, n_experts: int) -> GroupedRoutes:
    """expert_ids [T, k] (values in 0..E-1, or -1 for no route), weights [T, k] -> GroupedRoutes."""
    t = torch.arange(expert_ids.shape[0]).unsqueeze(1).expand_as(expert_ids).reshape(-1)  # [T*k]
    e = expert_ids.reshape(-1).long()
    keep = e >= 0
    return group_flat_routes(t[keep], e[keep], weights.reshape(-1)[keep], n_experts)
