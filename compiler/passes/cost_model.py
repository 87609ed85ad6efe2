"""cost_model: the cost model of the placement (compiler/cost_model/ prices it), the split-route / upload-once
threshold and, where the memory pass reserved the slices' staging (2+ GPUs), the single-link / sharded upload
threshold: the crossovers at each workload's median cached prefix (least_wait.py)."""

from __future__ import annotations

import numpy as np

from ostinato.checkpoint import model_sizes
from ostinato.checkpoint.tensor_specs import layer_specs, mtp_block_specs

from ..cost_model import CostModel, LayerCostInputs, MtpCostInputs
from ..memory_model import held_bytes
from .build import Build, mtp_counts
from .least_wait import least_wait
from .memory import dense_format
from .policy import cpu_step


def cost_model(b: Build) -> None:
    cfg, pl = b.config, b.placement
    counts = b.profile.phase_counts(b.options.objective_phases).double().numpy()
    layers = []
    for l in range(cfg.n_layers):
        row = counts[l]
        share = row / row.sum() if row.sum() > 0 else np.full(row.size, 1.0 / row.size)
        hot = np.zeros(cfg.n_routed_experts, dtype=bool)
        hot[list(pl.hot[l])] = True
        layers.append(LayerCostInputs(pl.layer_gpu[l], b.layer_bytes[l]["dense_weights"],
                                      _matmul_params(layer_specs(cfg, l, with_experts=False)), hot, share))
    head = b.gpu_fixed[-1]["head"]
    mtp = None
    if cfg.mtp_blocks:  # the first MTP block (speculative decoding drafts with it), by the head
        dense = mtp_block_specs(cfg, 0, with_experts=False)
        row = mtp_counts(b)  # its experts as placed: none hot when the plan leaves it out or has no row for it
        row = row.double().numpy() if row is not None and row.sum() > 0 else np.ones(cfg.n_routed_experts)
        hot = np.zeros(cfg.n_routed_experts, dtype=bool)
        hot[list(pl.mtp_hot)] = True
        mtp = MtpCostInputs(pl.layer_gpu[-1], sum(held_bytes(s, dense_format(b.options, b.hardware)) for s in dense),
                            _matmul_params(dense), hot, row / row.sum())
    b.cost = CostModel(cfg, b.hardware, layers, model_sizes(cfg).expert_bytes, head, b.options.context,
                       b.options.prefill_chunk, mtp, cpu_step(b.options))
    b.cost = b.cost.with_decode_threads(b.cost.choose_decode_threads())   # policy.decode_cpu_threads (pool_threads.py)
    c, sharded = b.cost, bool(b.slice_reserve)
    # split-route up to the threshold, then upload-once: the faster of the single-link and (with the slices'
    # staging reserved) the sharded upload, each workload's uploads sharded past its own crossover
    shard_at = {w.name: c.shard_crossover(w.median_cached) if sharded else None for w in b.workloads}
    b.threshold, b.threshold_from = least_wait(
        b, [(w.name, c.crossover(position=w.median_cached, sharded=sharded)) for w in b.workloads],
        lambda w, t, n: c.eager_prefill(n, t, w.median_cached, _at_least(shard_at[w.name], t)),
        lambda t, n: t is None or n > t, lambda: c.crossover(sharded=sharded))
    t = b.threshold
    b.shard_threshold, b.shard_from = None, ""
    if sharded and t is not None:  # of the prefills that upload, those past the crossover shard their uploads
        b.shard_threshold, b.shard_from = least_wait(
            b, [(w.name, _at_least(shard_at[w.name], t)) for w in b.workloads],
            lambda w, s, n: c.eager_prefill(n, t, w.median_cached, s), lambda s, n: s is not None and n > s,
            lambda: _at_least(c.shard_crossover(), t))


def _at_least(shard_threshold: int | None, threshold: int | None) -> int | None:
    """A shard threshold as policy.shard_threshold holds it: no lower than the upload threshold (every upload
    shards when sharding pays from fewer tokens than uploading does), None where nothing uploads or shards."""
    if shard_threshold is None or threshold is None:
        return None
    return max(shard_threshold, threshold)


def _matmul_params(dense) -> int:
    """Multiply-adds per token of a layer's dense matmuls (its 2-D weights but hash tables, scales, mHC fns)."""
    return sum(int(np.prod(s.shape)) for s in dense if len(s.shape) == 2 and s.role != "hash_table"
               and not s.is_scale and not s.name.endswith("_fn"))
