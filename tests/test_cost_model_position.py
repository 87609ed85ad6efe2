"""The cost model prices what runs at the session's position (issue #54) and in the layer's order (#56 item 1).

Attention and the CSA indexer read the rows of the position a forward runs at: the expected bytes and FLOPs
are written out here from DeepSeek-V4's forward pass (shared DSV4.md section 3: sliding window, CSA's index keys
and top-k picks, HCA's every row), not taken from the cost model. A layer runs its dense part first (the
router needs attention's output), then its hot and shared experts beside its cold ones. The session
simulator passes each turn's position to every system.
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from simulator_helpers import ACT, EXPERT, HW, MS

from ostinato.bench.simulator.ktransformers import KTransformers
from ostinato.bench.simulator.llamacpp import CpuExperts
from ostinato.bench.simulator.ostinato_policy import Ostinato
from ostinato.bench.simulator.policy import Forward, Policy, static_decode
from ostinato.bench.simulator.replay import chunked_prefill, simulate
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.compiler.cost_model import CSA_DENSE_MAX_RATIO, CostModel, LayerCostInputs, shared_expert_part
from ostinato.compiler.memory_model import layer_dense_bytes
from ostinato.hardware import load_hardware
from ostinato.workload import SessionShape, Turn

ROOT = Path(__file__).resolve().parents[1]
V4 = ROOT / "plans" / "models" / "deepseek-v4-flash"
CONTEXT = 262_144
SLIDING, CSA, HCA = 0, 2, 3   # V4-Flash's layers 0-1 slide only; from layer 2 on even layers are CSA, odd HCA


def v4_cost(hardware: str, dense_format: str, context: int = CONTEXT) -> CostModel:
    """V4-Flash's layers as the memory model holds them in `dense_format`, every expert cold, routes even."""
    cfg = ModelConfig.from_json(V4)
    E = cfg.n_routed_experts
    layers = [LayerCostInputs(0, layer_dense_bytes(cfg, l, dense_format),
                              sum(int(np.prod(s.shape)) for s in layer_specs(cfg, l, with_experts=False)
                                  if len(s.shape) == 2 and s.role != "hash_table" and not s.is_scale
                                  and not s.name.endswith("_fn")),
                              np.zeros(E, dtype=bool), np.full(E, 1.0 / E)) for l in range(cfg.n_layers)]
    return CostModel(cfg, load_hardware(hardware), layers, 13_369_344, 0, context)


def expected_reads(layer_kind: str, visible_tokens: int) -> int:
    """KV bytes (bf16 rows) one query reads at V4-Flash's shapes with `visible_tokens` tokens in the session
    (DSV4.md section 3): the 128-row window of 512; CSA: every index key (one per 4 tokens, 128 wide) and its
    min(512, rows) picked rows of 512; HCA: every row (one per 128 tokens) of 512."""
    window = 128 * 512
    if layer_kind == "sliding":
        return 2 * window
    if layer_kind == "csa":
        rows = visible_tokens // 4
        return 2 * (window + rows * 128 + min(512, rows) * 512)
    return 2 * (window + visible_tokens // 128 * 512)


def test_a_decode_token_at_128k_reads_the_kv_and_index_keys_of_128k_tokens_not_1k():
    """A dynamic forward (the baselines' paged attention) of one token: the difference between position 131,072
    and 1,024 is exactly the extra rows' bytes over the GPU's bandwidth, layer kind by layer kind. The CSA rows
    at 1,024 (256 of them) are few enough to score densely (runtime/model/attention.py), so neither end is that
    mode's boundary; every layer here stays bound by its reads (checked)."""
    c = v4_cost("rtx4090d-x4", "fp8")
    bw = c.hw.gpus.bandwidth
    early, late = 1024, 131_072
    for layer, kind in ((SLIDING, "sliding"), (CSA, "csa"), (HCA, "hca")):
        for p in (early, late):  # read-bound at both ends, so seconds = bytes / bandwidth
            flops, kv = c.attention_work(layer, 1, p + 1)
            dense = c.layers[layer].dense_bytes - c._shared[layer][0]
            assert (dense + kv) / bw > (2 * (c.layers[layer].dense_params - c._shared[layer][1]) + flops) \
                / c.hw.gpus.matmul_flops
        more = expected_reads(kind, late + 1) - expected_reads(kind, early + 1)
        got = c.before_experts_time(layer, 1, late) - c.before_experts_time(layer, 1, early)
        if kind == "csa":   # at 1k the dense mode reads its 256 rows whole: picks = rows, the same bytes
            assert early // 4 * 64 <= CSA_DENSE_MAX_RATIO * (early // 4) * 512
            # ...and the fused GPU indexer's scores, passes of their own after the max(): per (query, row) its
            # float32 score written (4) and top-k's passes over it (4 + 5 + 2); its q read is the same at both ends
            more += ((late + 1) // 4 - (early + 1) // 4) * (4 + 4 + 5 + 2)
        assert got == pytest.approx(more / bw, rel=1e-9), kind
    assert expected_reads("csa", late + 1) - expected_reads("csa", early + 1) == 2 * (32_768 - 256) * 128 \
        + 2 * (512 - 256) * 512


def test_the_csa_indexer_scores_every_compressed_row_and_attention_its_picks():
    """Per query at 131,072 tokens: 64 heads x 512 x 4 FLOP per key over the window's 128 and the 512 picks,
    plus the indexer's 64 heads x 128 x 2 FLOP over all 32,768 index keys; HCA's 1,024 rows all scored."""
    c = v4_cost("rtx4090d-x4", "fp8")
    flops, _ = c.attention_work(CSA, 1, 131_072)
    assert flops == 4 * 64 * 512 * (128 + 512) + 2 * 64 * 128 * 32_768
    flops, _ = c.attention_work(HCA, 1, 131_072)
    assert flops == 4 * 64 * 512 * (128 + 1024)
    # a prefill of n tokens after a cached prefix of p attends to p + n: every query scores the rows of both
    n, p = 4096, 65_536
    flops, _ = c.attention_work(HCA, n, p + n)
    assert flops == n * 4 * 64 * 512 * (128 + (p + n) // 128)
    assert c.split_prefill(n, position=p) > c.split_prefill(n, position=0)


def test_the_dense_csa_rule_is_the_runtimes_and_only_the_runtimes():
    """Ostinato's eager forward scores every CSA row while few (4,096 rows x 64 heads <= 512 picks x 512): 4,096
    keys a query at 16,384 tokens; a baseline's kernels are priced at the model's 512 picks."""
    from ostinato.runtime.model import attention

    assert CSA_DENSE_MAX_RATIO == attention.CSA_DENSE_MAX_RATIO
    c = v4_cost("rtx4090d-x4", "fp8")
    n, visible = 4096, 16_384
    assert c.attention_work(CSA, n, visible)[0] == n * (4 * 64 * 512 * (128 + 4096) + 2 * 64 * 128 * 4096)
    assert c.with_csa_picks_only().attention_work(CSA, n, visible)[0] == \
        n * (4 * 64 * 512 * (128 + 512) + 2 * 64 * 128 * 4096)
    assert c.attention_work(CSA, 1, 16_388)[0] == 4 * 64 * 512 * (128 + 512) + 2 * 64 * 128 * 4097  # past: picks
    assert KTransformers(c, threshold=100).cost.csa_dense_max_ratio == 0.0
    assert CpuExperts(c).cost.csa_dense_max_ratio == 0.0


def test_a_fixed_shape_step_reads_its_buffers_rows_whatever_the_position():
    """A fixed-shape step scores every row of its buffers at any position (runtime/model/static_decode): the engine
    decodes with the step of the smallest context that holds the token (buckets.decode_contexts; compiled per
    context on the CPU, captured per context on GPUs): at 1,000 the 1,024-token step, at 131,072 the plan's, and
    the difference is those steps' rows (float32 rows on a cpu-only spec). Within one step's context the position
    changes nothing; the buckets and the verify step read the plan's whole context."""
    gpu = v4_cost("rtx4090d-x4", "fp8")
    assert gpu.decode_step(70_000) == gpu.decode_step(131_072) == gpu.decode_step()  # all within the plan's step
    assert gpu.decode_step(1000) < gpu.decode_step(20_000) < gpu.decode_step()
    assert (gpu.step_context(1, 1000), gpu.step_context(2, 1000), gpu.step_context(4, 1000)) == (1024, 1024, CONTEXT)
    cpu = v4_cost("cpu-only", "float32")
    assert cpu.dense_format == "float32" and cpu.kv_element_bytes == 4
    assert (cpu.step_context(1, 1000), cpu.step_context(1, 131_072), cpu.step_context(4, 1000)) == (1024, CONTEXT,
                                                                                                   CONTEXT)
    host = cpu.hw.host

    def step_layer(l: int, context: int) -> float:
        """One token's dense part before the experts in a step holding `context` tokens' rows (float32), written
        out: each CSA layer scores all its index keys and gathers min(512, rows) picks, each HCA layer every row."""
        ratio, shared_bytes, shared_params = cpu.cfg.compress_ratio(l), *shared_expert_part(cpu.cfg, l, "float32")
        rows = -(-context // ratio) if ratio else 0
        keys, read, score = 128, 128 * 512, 0
        if ratio == 4:
            keys, read, score = 128 + min(512, rows), read + rows * 128 + min(512, rows) * 512, 2 * 64 * 128 * rows
        elif ratio == 128:
            keys, read = 128 + rows, read + rows * 512
        flops = 2 * (cpu.layers[l].dense_params - shared_params) + 4 * 64 * 512 * keys + score
        scratch = rows * (64 * 32 + 25) if ratio == 4 else 0  # the indexer's intermediates (test_indexer_cost.py)
        return max((cpu.layers[l].dense_bytes - shared_bytes + 4 * read) / host.bandwidth, flops / host.matmul_flops) \
            + scratch / host.bandwidth

    predicted = sum(step_layer(l, CONTEXT) - step_layer(l, 1024) for l in range(cpu.cfg.n_layers))
    assert predicted > 0
    assert cpu.decode_step(131_072) - cpu.decode_step(1000) == pytest.approx(predicted, rel=1e-9)


def hand_cost(dense_bytes: int = 0) -> CostModel:
    """The hand-built machine of test_simulator (simulator_helpers): one layer of 4 experts, 0 and 1 hot, top-1;
    `dense_bytes` read by the layer's dense part on the GPU (1 ms per 1,000)."""
    cfg = SimpleNamespace(num_experts_per_tok=1, hidden_size=1, moe_intermediate_size=1, sliding_window=0,
                          index_topk=0, num_attention_heads=1, head_dim=1, hc_mult=1, vocab_size=0,
                          compress_ratio=lambda layer: 0)
    hot = np.array([True, True, False, False])
    return CostModel(cfg, HW, [LayerCostInputs(0, dense_bytes, 0, hot, np.full(4, 0.25))], EXPERT, 0, 0)


def test_attention_never_overlaps_the_cold_experts():
    """The router needs attention's output, so the cold experts start after it: a decode token routed to a
    cold expert takes attention (5 ms) + the host's expert (10 ms) + its activations both ways, not the longer
    of the two; one routed to a hot expert takes 5 + 1 ms. Every system priced through the cost model."""
    c = hand_cost(dense_bytes=5 * EXPERT)
    cold, hot = np.array([[[3]]]), np.array([[[0]]])
    ours = Ostinato(c, np.array([[True, True, False, False]]), None)
    assert ours.decode(cold)[0][0] == pytest.approx(5 * MS + 10 * MS + 2 * ACT)
    assert ours.decode(hot)[0][0] == pytest.approx(5 * MS + 1 * MS)
    kt = KTransformers(c, threshold=100, gpu_experts=np.array([[True, True, False, False]]))
    assert kt.decode(cold)[0][0] == pytest.approx(5 * MS + 10 * MS + 2 * ACT)
    first, gpu, cpu = c.split_layer(0, 1)
    assert first == pytest.approx(5 * MS)
    assert c.decode_step() == pytest.approx(first + max(gpu, cpu))
    # a 1-token prefill split-routes its one route the same way: 5 ms, then 10 ms on the host for a cold route
    counts = np.array([[0, 0, 0, 1]])
    assert ours.prefill(counts, 1).seconds == pytest.approx(5 * MS + 10 * MS + 2 * ACT)


def test_the_shared_expert_runs_beside_the_cold_experts():
    """V4-Flash's shared expert (3 FP8 matrices of 2,048 x 4,096 with their block scales) is priced on the GPU
    side of the layer, not before the experts."""
    cfg = ModelConfig.from_json(V4)
    assert shared_expert_part(cfg, CSA, "fp8") == (3 * 2048 * 4096 + 3 * 16 * 32, 3 * 2048 * 4096)
    c = v4_cost("rtx4090d-x4", "fp8")
    first, gpu, cpu = c.split_layer(CSA, 1, 1024)
    assert c.shared_expert_time(CSA, 1) == pytest.approx((3 * 2048 * 4096 + 3 * 16 * 32) / c.hw.gpus.bandwidth)
    assert gpu == pytest.approx(c.shared_expert_time(CSA, 1))   # no hot expert: the GPU side is the shared one
    assert first + c.shared_expert_time(CSA, 1) == pytest.approx(c.attention_time(CSA, 1, 1024))


class Recording(Policy):
    """A policy that records the (tokens, position) of every forward it is asked to price."""
    name = "recording"

    def __init__(self, cost, reuses_prefix=True):
        super().__init__(cost)
        self.reuses_prefix = reuses_prefix
        self.prefills, self.decodes = [], []

    def prefill(self, counts, n, position=0):
        self.prefills.append((n, position))
        return Forward(0.0)

    def decode(self, ids, position=0):
        self.decodes.append((ids.shape[0], position))
        return np.zeros(ids.shape[0]), Forward(0.0)


class Sampler:
    def counts(self, n):
        return np.ones((1, 4), dtype=np.int64)

    def ids(self, n):
        return np.zeros((n, 1, 1), dtype=np.int64)

    def fork(self, stream):
        return self


def test_the_simulator_passes_each_turns_position_to_every_system():
    """Turn t prefills after the tokens of the turns before it (appended and generated), its decode starts after
    its own prefill; a system without a prefix cache prefills everything again from 0, chunk after chunk."""
    cached, again = Recording(hand_cost()), Recording(hand_cost(), reuses_prefix=False)
    again.name = "again"
    session = SessionShape("s", (Turn(5, 3), Turn(4, 2), Turn(6, 1)))
    simulate([session], [cached, again], Sampler(), chunk=4)
    # context before each turn: 0, 5 + 3 = 8, 8 + 4 + 2 = 14; prefills in chunks of 4
    assert cached.prefills == [(4, 0), (1, 4), (4, 8), (4, 14), (2, 18)]
    assert cached.decodes == [(3, 5), (2, 12), (1, 20)]
    assert again.prefills == [(4, 0), (1, 4), (4, 0), (4, 4), (4, 8), (4, 0), (4, 4), (4, 8), (4, 12), (4, 16)]
    assert again.decodes == cached.decodes
    assert chunked_prefill(cached, [(None, 3), (None, 2)], position=7).seconds == 0.0
    assert cached.prefills[-2:] == [(3, 7), (2, 10)]


def test_a_dynamic_decode_in_the_simulator_costs_more_later_and_a_fixed_step_does_not():
    """static_decode at a later position: the baselines' dynamic steps read more rows; Ostinato's captured
    steps (fixed_shape, on GPUs) read the buffers of the decode context that holds the position: more rows
    later too, the same within one context. llama.cpp's whole layers too."""
    c = v4_cost("rtx4090d-x4", "fp8")
    E = c.cfg.n_routed_experts
    gpu = np.zeros((c.cfg.n_layers, E), dtype=bool)
    ids = np.tile(np.arange(6), (4, c.cfg.n_layers, 1))   # [T=4, L, k]
    early, _ = static_decode(c, gpu, ids, position=1000)
    late, _ = static_decode(c, gpu, ids, position=131_072)
    assert np.all(late > early) and np.all(np.diff(late) >= 0)
    fixed_early, _ = static_decode(c, gpu, ids, position=1000, fixed_shape=True)
    fixed_late, _ = static_decode(c, gpu, ids, position=131_072, fixed_shape=True)
    fixed_after, _ = static_decode(c, gpu, ids, position=100_000, fixed_shape=True)  # the same 262,144-token step
    assert np.all(fixed_early < fixed_late) and fixed_after == pytest.approx(fixed_late)
    assert fixed_early[0] == pytest.approx(c.decode_step(1000)) and fixed_late[0] == pytest.approx(c.decode_step())
    llama = CpuExperts(c)
    assert np.all(llama.decode(ids, 131_072)[0] > llama.decode(ids, 1000)[0])
