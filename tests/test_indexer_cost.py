"""The CSA indexer's price counts the bytes its selection materializes, not only its matmul's FLOPs
(runtime/model/indexer.py: per (query, row, head) the float32 scores written, relu'd, scaled, head-weighted and
summed; per (query, row) the sum, the mask and the top-k's passes), and the CPU selection scores in blocks
small enough to stay in the cache, picking exactly what one big block (and a float64 reference) picks.
The counts are written out here from the runtime's ops, not taken from the cost model."""

import pytest
import torch
from test_cost_model_position import CSA, HCA, v4_cost

from ostinato.runtime.model import indexer
from ostinato.runtime.model.indexer import select

# bytes per (query, row, head): matmul write 4, relu r+w 8, scale r+w 8, head weights r+w 8, sum read 4
PER_HEAD = 4 + 8 + 8 + 8 + 4
# bytes per (query, row): sum write 4, mask 1, masked_fill 4+1+4, topk read 4, kept mask 4+1, nonzero 2
PER_ROW = 4 + 1 + 9 + 4 + 5 + 2
# ...and on a GPU, one fused kernel (runtime/kernels/triton_indexer.py): its scores written 4, then top-k's passes
# (read 4, kept mask 4+1, nonzero 2); no per-head bytes, no mask pass; besides, each query's HI x dI q read once
FUSED_PER_ROW = 4 + 4 + 5 + 2


@pytest.mark.parametrize("hardware", ["rtx4090d-x4", "cpu-only"])
def test_a_csa_layers_price_grows_with_its_rows_by_the_indexers_counted_bytes(hardware):
    """Between two positions far past the picks (the FLOPs or the KV read, whichever bounds, grow linearly), a
    CSA layer's time grows by the max() part's growth plus the indexer's intermediates over the bandwidth:
    n x rows x (64 heads x 32 + 25) bytes at V4-Flash's dims. An HCA layer has no indexer: no such term."""
    c = v4_cost(hardware, "bf16")
    g = c.hw.gpus
    n, p1, p2 = 120, 60_000, 140_000
    rows = (p2 + n) // 4 - (p1 + n) // 4
    f1, kv1 = c.attention_work(CSA, n, p1 + n)
    f2, kv2 = c.attention_work(CSA, n, p2 + n)
    l = c.layers[CSA]
    shared_bytes, shared_params = c._shared[CSA]
    dense = (l.dense_bytes - shared_bytes, 2 * n * (l.dense_params - shared_params))
    bound = [max((dense[0] + kv) / g.bandwidth, (dense[1] + f) / g.matmul_flops) for f, kv in ((f1, kv1), (f2, kv2))]
    grown = c.before_experts_time(CSA, n, position=p2) - c.before_experts_time(CSA, n, position=p1)
    if c.hw.cpu_only:  # torch's materialized tensors
        scratch = n * rows * (64 * PER_HEAD + PER_ROW)
        assert scratch == n * rows * 2073
    else:  # the fused kernel's scores (its q read is the same at both positions)
        scratch = n * rows * FUSED_PER_ROW
    assert grown == pytest.approx(bound[1] - bound[0] + scratch / g.bandwidth, rel=1e-9)
    assert c.indexer_scratch_bytes(HCA, n, p2 + n) == 0


def test_the_decode_step_prices_the_indexer_over_every_row_of_its_buffers():
    """A fixed-shape step scores ceil(context / 4) rows whatever the position: its indexer bytes are those rows'
    (on the GPU the fused kernel's, plus its one query's q read; on the host torch's materialized tensors)."""
    c = v4_cost("rtx4090d-x4", "bf16")
    rows = -(-c.context // 4)
    fused = rows * FUSED_PER_ROW + 64 * 128 * 2
    assert c.indexer_scratch_bytes(CSA, 1, c.context, fixed_shape=True) == fused
    assert c.indexer_scratch_bytes(CSA, 1, c.context, fixed_shape=True, on_host=True) == rows * (64 * PER_HEAD
                                                                                                   + PER_ROW)
    f, kv = c.attention_work(CSA, 1, c.context, fixed_shape=True)
    l, g = c.layers[CSA], c.hw.gpus
    shared_bytes, shared_params = c._shared[CSA]
    bound = max((l.dense_bytes - shared_bytes + kv) / g.bandwidth, (2 * (l.dense_params - shared_params) + f)
                / g.matmul_flops)
    assert c.before_experts_time(CSA, 1, step_context=c.context) == pytest.approx(
        bound + fused / g.bandwidth, rel=1e-9)


def _inputs(T: int, HI: int, dI: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, HI, dI, generator=g).to(torch.bfloat16)
    w = torch.randn(T, HI, generator=g) * HI ** -0.5
    keys = torch.randn(n, dI, generator=g).to(torch.bfloat16)
    return q, w, keys


def test_cpu_select_scores_in_cache_sized_blocks(monkeypatch):
    """No CPU score block holds more than CPU_SCORE_BLOCK_ELEMENTS float32 elements (T x HI x n): at the old
    bound (1 << 24, 64 MiB) each of the scores' intermediates was a fresh mapping the kernel zeroed page by page."""
    q, w, keys = _inputs(300, 8, 32, 3_000, 0)
    seen = []
    scores = indexer.index_scores

    def recording(qb, wb, kb):
        seen.append(qb.shape[0] * qb.shape[1] * kb.shape[0])
        return scores(qb, wb, kb)

    monkeypatch.setattr(indexer, "index_scores", recording)
    select(q, w, keys, torch.arange(12_000 - 300, 12_000), 4, 64)
    assert len(seen) > 1 and max(seen) <= indexer.CPU_SCORE_BLOCK_ELEMENTS <= 1 << 20


def test_cpu_blocks_pick_what_one_block_and_a_float64_reference_pick(monkeypatch):
    """Blocking over queries changes no score: the picks equal one whole block's (the old bound) exactly, and a
    float64 reference's wherever the reference's k-th and (k+1)-th scores are apart (no near tie to flip)."""
    T, HI, dI, n, k = 200, 8, 64, 2_500, 48
    for seed in range(3):
        q, w, keys = _inputs(T, HI, dI, n, seed)
        positions = torch.arange(4 * n - T, 4 * n)
        got = select(q, w, keys, positions, 4, k)
        monkeypatch.setattr(indexer, "CPU_SCORE_BLOCK_ELEMENTS", T * HI * n)  # one block
        whole = select(q, w, keys, positions, 4, k)
        monkeypatch.undo()
        assert torch.equal(got, whole)
        s = (torch.relu(q.double() @ keys.double().T) * dI ** -0.5 * w.double()[:, :, None]).sum(1)  # [T, n]
        s = s.masked_fill(torch.arange(n) >= ((positions + 1) // 4)[:, None], float("-inf"))
        top = s.topk(k + 1, dim=-1)
        apart = (top.values[:, k - 1] - top.values[:, k]) > 1e-4 * top.values[:, 0].abs()
        assert apart.sum() > T // 2
        for t in torch.nonzero(apart).flatten().tolist():
            assert set(got[t].tolist()) == set(top.indices[t, :k].tolist()), (seed, t)


def test_a_baselines_indexer_is_priced_at_its_work_alone():
    """A baseline's attention kernels are not measured here (cost_model.with_csa_picks_only): its indexer is
    priced at its FLOPs and the rows it reads, without Ostinato's materialized score tensors, so a CSA layer at a
    long position costs it less than the runtime's indexer by exactly those bytes."""
    c = v4_cost("rtx4090d-x4", "bf16")
    baseline = c.with_csa_picks_only()
    n, p = 120, 140_000
    assert c.indexer_scratch_bytes(CSA, n, p + n) > 0
    assert baseline.indexer_scratch_bytes(CSA, n, p + n) == 0
    assert baseline.before_experts_time(CSA, n, position=p) < c.before_experts_time(CSA, n, position=p)
