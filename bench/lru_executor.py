"""A baseline, not Ostinato's policy: llama.cpp's LRU expert cache, run by the same engine for comparison.

llama.cpp's `--moe-cache-mib` keeps recently used experts on the GPU: a batch of up to 32 tokens
reads the cache and fills it (a miss is uploaded and inserted, evicting the least recently used
expert); a batch of more than 32 tokens (its op-offload size, GGML_OP_OFFLOAD_MIN_BATCH) only
reads it: misses are uploaded for that batch and not inserted (docs/baselines.md). Here the cache holds as
many experts per layer as the plan's hot set (the same bytes) and starts with that set.
Built from an all-cold engine, whose host copies of every expert feed the uploads.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ostinato.runtime.engine.executor import PlacementExecutor
from ostinato.runtime.engine.loader import Engine, _staging

FILL_MAX_TOKENS = 32  # llama.cpp: batches above this only read the cache


class LruCacheExecutor(PlacementExecutor):
    def __init__(self, base: PlacementExecutor, warm: list[list[int]], capacity: list[int], D: int, I: int):
        super().__init__(base.layers, base.compute, base.cpu_kernel, base.cpu_threads, base.upload_group,
                         base.expert_bytes, base.dtype, base.top_k)
        self.cache: list[OrderedDict] = []
        self.pools = []
        for le, hot, cap in zip(self.layers, warm, capacity):
            self.pools.append(_staging(cap, D, I, le.device))
            self.cache.append(OrderedDict())
            for e in hot[:cap]:
                self._insert(len(self.pools) - 1, e, count=False)

    def _insert(self, layer: int, expert: int, count: bool = True) -> None:
        le, cache, pool = self.layers[layer], self.cache[layer], self.pools[layer]
        if len(cache) < pool.w1.shape[0]:
            slot = len(cache)
        else:
            _, slot = cache.popitem(last=False)  # least recently used
        self._copy_group(le, [expert], _SlotView(pool, slot), None)
        cache[expert] = slot
        if count:
            self._counters.experts_uploaded += 1
            self._counters.bytes_uploaded += self.expert_bytes

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        le, cache, pool = self.layers[layer], self.cache[layer], self.pools[layer]
        t, k = expert_ids.shape
        token = torch.arange(t, device=expert_ids.device).repeat_interleave(k)  # [R]
        ids, w = expert_ids.reshape(-1), weights.reshape(-1).float()
        c = self._counters
        c.forwards += 1
        for e in ids.unique().tolist():
            if e in cache:
                cache.move_to_end(e)
            elif t <= FILL_MAX_TOKENS and pool.w1.shape[0]:
                self._insert(layer, e)
        slot_of = torch.full((le.slot_of.numel(),), -1, dtype=torch.int64, device=ids.device)
        for e, s in cache.items():
            slot_of[e] = s
        slot = slot_of[ids]
        hit = slot >= 0
        c.routes_hot += int(hit.sum())
        c.routes_cold += int((~hit).sum())
        c.distinct_cold += int(ids[~hit].unique().numel())
        out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=le.device)  # [T, D]
        self._hot(pool, x, token[hit], slot[hit], w[hit], out)
        self._upload_and_compute(le, x, token[~hit], ids[~hit], w[~hit], out)  # bypass: not inserted
        return out.to(x.dtype)


class _SlotView:
    """One slot of a pool, shaped like a one-expert pool (for the copy helper)."""

    def __init__(self, pool, slot: int):
        for name in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
            setattr(self, name, getattr(pool, name)[slot:slot + 1])


def lru_cache_engine(all_cold: Engine, hot_sets: list[list[int]]) -> Engine:
    """The LRU-cache baseline on an all-cold engine: per layer a cache of len(hot_sets[l]) experts."""
    cfg = all_cold.model.config
    assert all(le.cold_of.numel() == len(le.cold) for le in all_cold.executor.layers), "needs an all-cold plan"
    lru = LruCacheExecutor(all_cold.executor, hot_sets, [len(h) for h in hot_sets], cfg.hidden_size,
                           cfg.moe_intermediate_size)
    all_cold.model.set_executor(lru)
    return Engine(all_cold.plan, all_cold.model_dir, all_cold.model, lru, all_cold.devices,
                  None, all_cold.cpu_threads)  # no decode runner: decodes through the dynamic model

