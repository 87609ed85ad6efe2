"""The session simulator: hand-computed times on a hand-built machine, and each baseline's rule."""

from types import SimpleNamespace

import numpy as np
import pytest
from simulator_helpers import ACT, EXPERT, HW, MS

from ostinato.adaptation import AdaptPolicy
from ostinato.bench.simulator.kernels import load_kernel_table
from ostinato.bench.simulator.ktransformers import KTransformers, KTransformersDynamic, frequency_placed, uniform_placed
from ostinato.bench.simulator.llamacpp import CpuExperts, LayerPlacement, LruCache, layers_that_fit
from ostinato.bench.simulator.ostinato_policy import Ostinato
from ostinato.bench.simulator.replacement import AdaptiveOstinato, default_adapt
from ostinato.bench.simulator.replay import chunks, simulate, summarize
from ostinato.bench.simulator.trace import (
    PUBLISHED_JACCARD,
    DriftSampler,
    TraceSampler,
    at_coverage,
    calibrate_drift,
    counts_of,
    hot_set,
    jaccard,
    median_jaccard,
)
from ostinato.compiler.cost_model import CostModel, LayerCostInputs
from ostinato.compiler.host_kernel import KernelRates
from ostinato.workload import SessionShape, Turn


def cost(layers=1, experts=4, top_k=1, hot=(0, 1)):
    """No attention, head or hops cost anything: only experts and the link."""
    cfg = SimpleNamespace(num_experts_per_tok=top_k, hidden_size=1, moe_intermediate_size=1, sliding_window=0,
                          index_topk=0, num_attention_heads=1, head_dim=1, hc_mult=1, vocab_size=0,
                          compress_ratio=lambda layer: 0)
    mask = np.zeros(experts, dtype=bool)
    mask[list(hot)] = True
    share = np.full(experts, 1.0 / experts)
    return CostModel(cfg, HW, [LayerCostInputs(0, 0, 0, mask, share) for _ in range(layers)], EXPERT, 0, 0)


class Fixed:
    """A 'sampler' that returns given routings: counts for each prefill size, ids for decode."""
    def __init__(self, counts: dict, ids: np.ndarray):
        self.c, self.i = counts, ids

    def counts(self, n):
        return self.c[n]

    def ids(self, n):
        return self.i[:n]

    def fork(self, stream):
        return self


def routing(layers, experts, per_layer):
    c = np.zeros((layers, experts), dtype=np.int64)
    for l, row in enumerate(per_layer):
        for e, n in row.items():
            c[l, e] = n
    return c


def test_one_turn_split_wait_is_hand_computed():
    c = cost()
    hot = c.layers[0].hot[None]
    pol = Ostinato(c, hot, threshold=None)
    # 2 tokens: one to hot e0 (GPU 1 ms), one to cold e2 (host 10 ms + 2 tokens' activations both ways)
    sampler = Fixed({2: routing(1, 4, [{0: 1, 2: 1}])}, np.array([[[1]], [[3]]]))  # decode: hot e1, cold e3
    run = simulate([SessionShape("s", (Turn(2, 2),))], [pol], sampler)["Ostinato"][0]
    turn = run.turns[0]
    prefill = max(1 * MS, 10 * MS + 2 * 2 * ACT)
    assert turn.prefill.seconds == pytest.approx(prefill)
    assert turn.wait_s == pytest.approx(prefill + 1 * MS)                       # first step: hot route only
    assert turn.decode.seconds == pytest.approx(1 * MS + (10 * MS + 2 * ACT))   # second step: cold on the host
    assert run.seconds == pytest.approx(prefill + 1 * MS + 10 * MS + 2 * ACT)


def test_bucket_steps_are_hand_computed():
    """6 tokens as 4 + 2 steps; each step gets its share of the trace's routes, each hot route reads its
    expert (the step's per-route launch), cold ones run on the host as in split-route."""
    c = cost()
    pol = Ostinato(c, c.layers[0].hot[None], threshold=None, buckets=[2, 4, 8])
    f = pol.prefill(routing(1, 4, [{0: 3, 2: 3}]), 6)  # 3 routes to hot e0, 3 to cold e2
    step4 = max(4 / 6 * 3 * MS, 10 * MS + 2 * 4 * ACT)   # 2 hot reads on the GPU | one cold expert on the host
    step2 = max(2 / 6 * 3 * MS, 10 * MS + 2 * 2 * ACT)
    assert f.mode == "bucket" and f.seconds == pytest.approx(step4 + step2)
    assert pol.prefill(routing(1, 4, [{0: 9}]), 9).mode == "split"  # past the largest bucket
    assert c.bucket_prefill(6, [2, 4]) == pytest.approx(c.bucket_step(4) + c.bucket_step(2))


def test_buckets_are_kept_only_where_every_prompt_gains():
    """No dispatch or launch cost in the hand-built machine: a step (hot routes read per route) never
    beats the eager forward (hot experts read once), so no bucket is kept; with op dispatch priced and
    a free graph launch, buckets are kept until per-route reads outweigh the dispatch they save."""
    c = cost(hot=(0, 1, 2, 3))
    assert c.choose_buckets(None, context=10 ** 6) == []
    dispatch = HW.replace(host=HW.host.replace(op_dispatch_s=MS / 1000))
    d = CostModel(c.cfg, dispatch, c.layers, EXPERT, 0, 0)
    d.eager_ops_per_layer = 8000  # 8 ms of dispatch per eager forward; a hot route reads 1 ms
    buckets = d.choose_buckets(None, context=10 ** 6)
    assert buckets and buckets == [2 ** i for i in range(1, len(buckets) + 1)]
    B = buckets[-1]
    assert all(d.bucket_prefill(n, buckets) < d.eager_prefill(n, None) for n in range(1, B + 1))
    assert any(d.bucket_prefill(n, buckets + [2 * B]) >= d.eager_prefill(n, None) for n in range(1, 2 * B + 1))
    assert d.choose_buckets(None, context=3 * 4) == [b for b in buckets if b <= 4]  # 3 x B <= context
    assert d.choose_buckets(2, context=10 ** 6) == [2]                               # B <= the threshold


def test_upload_once_above_the_threshold_is_hand_computed():
    c = cost()
    pol = Ostinato(c, c.layers[0].hot[None], threshold=1)
    f = pol.prefill(routing(1, 4, [{0: 1, 2: 1}]), 2)
    assert f.mode == "upload" and f.uploaded == 1
    assert f.seconds == pytest.approx(100 * MS + 2 * MS)     # one cold upload, then 2 distinct on the GPU
    assert pol.prefill(routing(1, 4, [{2: 1}]), 1).mode == "split"


def test_ktransformers_runs_experts_on_the_cpu_below_its_threshold_then_streams_whole_layers():
    """kt_ep_wrapper switches a forward of num_tokens >= the threshold to its layerwise prefill."""
    c = cost()
    kt = KTransformers(c, threshold=5)
    below = kt.prefill(routing(1, 4, [{0: 2, 1: 2}]), 4)
    assert below.mode == "cpu" and below.seconds == pytest.approx(2 * 10 * MS + 2 * 4 * ACT)
    at = kt.prefill(routing(1, 4, [{0: 3, 1: 2}]), 5)
    assert at.mode == "layerwise" and at.uploaded == 4                # the whole layer, touched or not
    assert at.seconds == pytest.approx(4 * 100 * MS + 2 * MS)
    steps, _ = kt.decode(np.array([[[0]]]))
    assert steps[0] == pytest.approx(10 * MS + 2 * ACT)


@pytest.mark.parametrize("n, mode, seconds", [(31, "layers", 2 * MS + 20 * MS), (32, "offload", 2 * MS + 202 * MS),
                                              (33, "offload", 2 * MS + 202 * MS)])
def test_layer_placement_op_offload_starts_at_32_tokens(n, mode, seconds):
    c = cost(layers=2)
    pol = LayerPlacement(c, gpu_layers=1)
    a = n // 2
    f = pol.prefill(routing(2, 4, [{0: a, 1: n - a}, {0: a, 1: n - a}]), n)
    # layer 0 on the GPU (2 experts, 2 ms); layer 1 on the host (20 ms), or uploaded (200 ms) + GPU (2 ms)
    assert f.mode == mode and f.seconds == pytest.approx(seconds)


def test_ktransformers_gpu_experts_are_each_layers_most_frequent():
    shares = np.array([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.4, 0.1]])
    assert frequency_placed(shares, 2).tolist() == [[False, True, False, True], [True, False, True, False]]
    c = cost(hot=())                                           # Ostinato's hot set plays no part here
    kt = KTransformers(c, threshold=5, gpu_experts=frequency_placed(np.array([[0.4, 0.3, 0.2, 0.1]]), 1))
    f = kt.prefill(routing(1, 4, [{0: 2, 1: 2}]), 4)           # e0 on the GPU (1 ms) | e1 on the host
    assert f.mode == "cpu" and f.seconds == pytest.approx(10 * MS + 2 * 4 * ACT)


@pytest.mark.parametrize("n, mode, seconds", [(31, "cpu", 20 * MS + 2 * 31 * ACT), (32, "offload", 200 * MS + 2 * MS)])
def test_llamacpp_cpu_experts_offload_at_32_tokens(n, mode, seconds):
    """Experts on the host below 32 tokens (two touched: 10 ms each, activations both ways each time);
    from 32 the touched experts are uploaded (100 ms each) and run on the GPU (1 ms each), serially."""
    c = cost()
    pol = CpuExperts(c)
    a = n // 2
    f = pol.prefill(routing(1, 4, [{0: a, 1: n - a}]), n)
    assert f.mode == mode and f.seconds == pytest.approx(seconds)
    steps, _ = pol.decode(np.array([[[0]], [[3]]]))            # one route per step, on the host either way
    assert steps == pytest.approx([10 * MS + 2 * ACT] * 2)


@pytest.mark.parametrize("n, mode, seconds", [(31, "cpu", 20 * MS + 2 * 31 * ACT + 2 * MS),
                                              (32, "offload", 200 * MS + 2 * MS + 2 * MS)])
def test_llamacpp_n_cpu_moe_keeps_the_last_layers_experts_on_the_gpu(n, mode, seconds):
    """--n-cpu-moe 1 of 2 layers: layer 0's experts on the host (or offloaded from 32 tokens), layer 1's
    on the GPU (two touched, 1 ms each) whatever the batch; only layer 0's experts cross the link."""
    pol = CpuExperts(cost(layers=2), n_cpu_moe=1)
    a = n // 2
    f = pol.prefill(routing(2, 4, [{0: a, 1: n - a}, {2: a, 3: n - a}]), n)
    assert pol.name == "llama.cpp --n-cpu-moe 1"
    assert f.mode == mode and f.seconds == pytest.approx(seconds) and f.uploaded == (2 if mode == "offload" else 0)
    steps, _ = pol.decode(np.array([[[0], [3]]]))             # layer 0: host (10 ms); layer 1: GPU (1 ms)
    assert steps == pytest.approx([10 * MS + 2 * ACT + 1 * MS])


def test_each_ablation_removes_one_mechanism():
    from ostinato.bench.simulator.ablation import FULL, ablations

    c = cost()
    d = CostModel(c.cfg, HW.replace(host=HW.host.replace(op_dispatch_s=MS / 1000)), c.layers, EXPERT, 0, 0)
    d.eager_ops_per_layer = 2000                                    # 2 ms per eager forward
    pols = ablations(d, c.layers[0].hot[None], threshold=2, buckets=[2])
    assert pols[0].name == FULL and len({p.name for p in pols}) == 7
    full, no_hot, no_split, no_upload, no_graphs, no_buckets, mtp = pols
    two, three = routing(1, 4, [{0: 1, 2: 1}]), routing(1, 4, [{0: 2, 2: 1}])
    assert [p.prefill(two, 2).mode for p in pols] == ["bucket", "bucket", "upload", "bucket", "bucket", "split",
                                                      "bucket"]
    assert mtp.name.startswith("+ MTP") and mtp.mtp_acceptance == 0.9 and full.mtp_acceptance is None
    assert mtp.decode(np.array([[[0]]]))[1].mode == "speculative"   # only decode changes
    assert full.prefill(three, 3).mode == "upload" and no_upload.prefill(three, 3).mode == "split"
    hot_token = np.array([[[0]]])                                   # e0: resident in the plan
    assert full.decode(hot_token)[0][0] == pytest.approx(1 * MS)    # a replayed graph: no dispatch
    assert no_graphs.decode(hot_token)[0][0] == pytest.approx(2 * MS)  # the host's dispatch, not the GPU, sets it
    assert no_hot.decode(hot_token)[0][0] == pytest.approx(10 * MS + 2 * ACT)


def test_lru_cache_evicts_the_least_recently_used_computes_misses_on_the_cpu_and_big_batches_skip_it():
    """llama.cpp's expert cache (llamacpp.py LruCache): a miss is a host-resident expert, so a pass below
    GGML_OP_OFFLOAD_MIN_BATCH (32) tokens computes it on the CPU (not uploaded on the step's path) and inserts it;
    a pass of more than 32 tokens skips the cache (the paper's abstract): every expert it uses is uploaded."""
    c = cost()
    lru = LruCache(c, c.layers[0].hot[None].copy())            # capacity 2, warm {0, 1}
    steps, f = lru.decode(np.array([[[1]], [[2]], [[0]]]))
    assert steps[0] == pytest.approx(1 * MS)                    # hit: on the GPU
    assert steps[1] == pytest.approx(10 * MS + 2 * ACT)         # miss: on the CPU, inserted, e0 evicted
    assert steps[2] == pytest.approx(10 * MS + 2 * ACT)         # e0 misses again; e1 (older than e2) evicted
    assert set(np.flatnonzero(lru.cached[0])) == {0, 2} and f.uploaded == 2 and f.upload_s == 0.0
    assert f.cpu_experts_s == pytest.approx(2 * (10 * MS + 2 * ACT)) and f.gpu_experts_s == pytest.approx(1 * MS)
    big = lru.prefill(routing(1, 4, [{0: 20, 3: 13}]), 33)      # > 32: the cache skipped, both experts uploaded
    assert big.mode == "skip" and big.uploaded == 2 and set(np.flatnonzero(lru.cached[0])) == {0, 2}
    assert big.seconds == pytest.approx(2 * 100 * MS + 2 * MS)  # the cached e0 crosses the link too
    at32 = lru.prefill(routing(1, 4, [{0: 16, 1: 16}]), 32)     # 32: op offload uploads the miss, and it is inserted
    assert at32.mode == "fill" and at32.uploaded == 1 and at32.seconds == pytest.approx(100 * MS + 2 * MS)
    assert set(np.flatnonzero(lru.cached[0])) == {0, 1}
    small = lru.prefill(routing(1, 4, [{0: 20, 3: 11}]), 31)    # < 32: the hit on the GPU, the miss on the CPU
    assert small.mode == "fill" and set(np.flatnonzero(lru.cached[0])) == {0, 3}   # e1 (older than e0) evicted
    assert small.seconds == pytest.approx(1 * MS + 10 * MS + 2 * 31 * ACT) and small.upload_s == 0.0
    lru.reset()
    assert set(np.flatnonzero(lru.cached[0])) == {0, 1}


def test_layers_that_fit_fill_gpus_in_order():
    # layers of 10 + 4 experts x 5 = 30 bytes; GPUs of 65 and 40 bytes: 2 + 1 layers
    assert layers_that_fit([10] * 5, 5, 4, [65, 40]) == 3
    assert layers_that_fit([10] * 2, 5, 4, [1000]) == 2


def test_sampler_draws_distinct_experts_per_token_by_share_and_is_seeded():
    shares = np.array([[8.0, 4, 2, 1, 1, 1, 1, 1]] * 2)
    ids = TraceSampler(shares, 3, seed=5).ids(4000)                         # [T, L, k]
    assert ids.shape == (4000, 2, 3)
    assert all(len(set(row)) == 3 for row in ids.reshape(-1, 3)[:500].tolist())
    assert (ids == TraceSampler(shares, 3, seed=5).ids(4000)).all()
    freq = counts_of(ids, 8)[0] / 4000                                      # per-token inclusion
    assert freq[0] > 0.8 and freq[0] > freq[1] > freq[2] > freq[3]
    long = TraceSampler(shares, 3, seed=5).counts(1000)
    assert long.shape == (2, 8) and (long.sum(axis=1) == 3000).all() and long[0].argmax() == 0


def test_at_coverage_puts_the_asked_share_on_the_hot_set():
    shares = np.array([[5.0, 3, 1, 1]])
    hot = np.array([[True, False, False, True]])
    s = at_coverage(shares, hot, 0.84)
    assert s[0, hot[0]].sum() == pytest.approx(0.84) and s.sum() == pytest.approx(1.0)
    assert s[0, 0] / s[0, 3] == pytest.approx(5.0)


def test_summary_skips_the_first_turn_and_rates_decode_over_all_turns():
    c = cost()
    pol = Ostinato(c, c.layers[0].hot[None], threshold=None)
    sampler = Fixed({2: routing(1, 4, [{0: 2}]), 1: routing(1, 4, [{2: 1}])}, np.array([[[0]]] * 4))
    runs = simulate([SessionShape("s", (Turn(2, 4), Turn(1, 4)))], [pol], sampler)["Ostinato"]
    s = summarize(runs)
    assert s.median_wait_s == pytest.approx((10 * MS + 2 * ACT) + 1 * MS)      # turn 1 only
    assert s.decode_tokens_per_s == pytest.approx(1 / MS)


def test_kernel_rates_interpolate_in_log_tokens_and_clamp_at_the_ends():
    k = KernelRates("k", (1.0, 4.0, 16.0), (3e9, 2e9, 1e9))
    assert k.per_core_at(1) == 3e9 and k.per_core_at(16) == pytest.approx(1e9)
    assert k.per_core_at(2) == pytest.approx(2.5e9)             # halfway in log(tokens) from 1 to 4
    assert k.per_core_at(0.5) == 3e9                               # the first value below the first point
    assert k.per_core_at(64) == pytest.approx(1e9 * 16 / 64)        # past the last: its FLOP rate held
    # cores x per-core, capped by the read bandwidth; reserved cores do not compute
    assert k.rate(1, cores=4, read_bandwidth=1e12) == pytest.approx(12e9)
    assert k.rate(1, cores=4, read_bandwidth=5e9) == pytest.approx(5e9)
    kt = KernelRates("kt", (1.0,), (3e9,), reserved_cores=1)
    assert kt.rate(1, cores=4, read_bandwidth=1e12) == pytest.approx(9e9)
    with pytest.raises(ValueError, match="ascending"):
        KernelRates("bad", (4.0, 1.0), (1e9, 1e9))


def test_a_baselines_kernel_is_priced_by_its_per_core_rate_scaled_to_the_host(tmp_path):
    """HW's host: 1 core, 1e5 B/s read (so an expert costs 10 ms at the spec's rates). A measured kernel
    reading 4e4 B/s per core takes 1000 / 4e4 = 25 ms per expert: capped by the 0.8 x 1e5 expert read,
    more cores do not help past 2."""
    table = tmp_path / "k.yaml"
    table.write_text("source: hand\nisa: avx2\ncores: 2\nread_bandwidth: 1.0e+5\ntokens_per_expert: [1.0, 4.0]\n"
                     "systems:\n  ostinato: {per_core: [5.0e+4, 5.0e+4]}\n"
                     "  other: {per_core: [4.0e+4, 1.0e+4], reserved_cores: 0}\n")
    speeds = load_kernel_table(table)
    c = cost()
    kt = KTransformers(c, threshold=5, kernel=speeds.of("other"))
    f = kt.prefill(routing(1, 4, [{2: 1}]), 1)                  # one route to one cold expert: 1 token per expert
    assert f.seconds == pytest.approx(EXPERT / 4e4 + 2 * ACT)
    f = kt.prefill(routing(1, 4, [{2: 4}]), 4)                  # 4 tokens on one expert: 1e4 B/s per core
    assert f.seconds == pytest.approx(EXPERT / 1e4 + 2 * 4 * ACT)
    many = HW.replace(host=HW.host.replace(cores=8))
    wide = KTransformers(CostModel(c.cfg, many, c.layers, EXPERT, 0, 0), threshold=5, kernel=speeds.of("other"))
    # ...plus the hand-off of 8 cores' pool (HostSpec.handoff_s: grown past the 2 threads it was measured at)
    assert wide.prefill(routing(1, 4, [{2: 1}]), 1).seconds == pytest.approx(EXPERT / (0.8 * 1e5) + 2 * ACT
                                                                            + many.host.handoff_s)
    assert many.host.handoff_s > HW.host.handoff_s
    with pytest.raises(KeyError, match="'ggml' has no kernel measurement"):
        speeds.of("ggml")
    head = "isa: avx2\ncores: 2\nread_bandwidth: 1.0\ntokens_per_expert: [1, 4]\nsystems:\n"
    table.write_text(head + "  other: {per_core: [1, 2]}\n")
    with pytest.raises(ValueError, match="k.yaml: field 'systems': needs an 'ostinato' row"):
        load_kernel_table(table)
    table.write_text(head + "  ostinato: {per_core: [1]}\n")
    with pytest.raises(ValueError, match="k.yaml: field 'systems.ostinato.per_core' against 'tokens_per_expert'"):
        load_kernel_table(table)


def test_the_layers_hand_off_is_paid_once_per_layer_with_cold_routes():
    c = CostModel(cost().cfg, HW.replace(host=HW.host.replace(task_handoff_s=3 * MS)), cost().layers, EXPERT, 0, 0)
    pol = Ostinato(c, c.layers[0].hot[None], threshold=None)
    assert pol.prefill(routing(1, 4, [{0: 1}]), 1).seconds == pytest.approx(1 * MS)          # hot only: none
    assert pol.prefill(routing(1, 4, [{2: 1, 3: 1}]), 2).seconds == pytest.approx(20 * MS + 3 * MS + 2 * 2 * ACT)


def test_a_server_without_prefix_cache_prefills_the_whole_context_every_turn():
    """Turn 1 of a prefix-less system prefills turn 0's 2 + 1 tokens again with its 1 new one: 4 tokens
    (routed by the forked sampler), where a prefix-caching system prefills 1."""
    c = cost()
    cached = KTransformers(c, threshold=100, reuses_prefix=True)   # a prefix cache its DSV4 recipe lacks
    again = KTransformers(c, threshold=100, name="no radix")         # as its recipe runs: --disable-radix-cache
    sampler = Fixed({2: routing(1, 4, [{2: 2}]), 1: routing(1, 4, [{2: 1}]), 4: routing(1, 4, [{2: 4}])},
                    np.array([[[0]]] * 4))
    runs = simulate([SessionShape("s", (Turn(2, 1), Turn(1, 1)))], [cached, again], sampler)
    assert runs["KTransformers"][0].turns[1].prefill.seconds == pytest.approx(10 * MS + 2 * ACT)
    assert runs["no radix"][0].turns[1].prefill.seconds == pytest.approx(10 * MS + 2 * 4 * ACT)


def test_long_prefills_run_chunk_by_chunk():
    c = cost()
    pol = Ostinato(c, c.layers[0].hot[None], threshold=None)
    sampler = Fixed({2: routing(1, 4, [{2: 2}]), 1: routing(1, 4, [{3: 1}])}, np.array([[[0]]] * 4))
    run = simulate([SessionShape("s", (Turn(5, 1),))], [pol], sampler, chunk=2)["Ostinato"][0]
    assert chunks(5, 2) == [2, 2, 1]
    assert run.turns[0].prefill.seconds == pytest.approx(2 * (10 * MS + 2 * 2 * ACT) + 10 * MS + 2 * ACT)


def test_ktransformers_uniform_strategy_is_blind_to_routing():
    gpu = uniform_placed((2, 8), 2)
    assert gpu.sum(axis=1).tolist() == [2, 2] and gpu[0].tolist() == gpu[1].tolist()
    assert gpu[0].tolist() == [True, False, False, False, True, False, False, False]
    assert not uniform_placed((1, 8), 0).any()


def test_a_tensor_parallel_upload_spreads_over_every_link_up_to_the_host_read():
    """KTransformers' layerwise prefill streams a layer's shards over every GPU's link at once: 4 links of
    1e4 B/s, but the host reads only 3e4 B/s."""
    c = cost()
    four = HW.replace(gpus=HW.gpus.replace(count=4), host=HW.host.replace(bandwidth=3e4))
    c4 = CostModel(c.cfg, four, c.layers, EXPERT, 0, 0)
    assert c4.upload_time(1) == pytest.approx(EXPERT / 1e4)
    assert c4.upload_time(1, links=4) == pytest.approx(EXPERT / 3e4)
    assert c4.upload_time(1, links=2) == pytest.approx(EXPERT / 2e4)


# ---- re-placement during tool time (issue #31) ------------------------------------------------------------

def zipf_profile(layers=43, experts=256, exponent=0.9, seed=0):
    """The synthetic profile's shape (world.PROFILE): one Zipf curve per layer, dealt to the experts at random."""
    rng = np.random.default_rng(seed)
    curve = np.arange(1, experts + 1, dtype=float) ** -exponent
    return np.stack([rng.permutation(curve) for _ in range(layers)])


@pytest.mark.slow   # about 3 s: 16 bisection steps over 8 draws of 5 sessions of 43 x 256 experts
def test_drift_is_calibrated_to_the_published_hot_set_overlap():
    shares = zipf_profile()
    weight = calibrate_drift(shares)
    assert 0.5 < weight < 1.0
    assert median_jaccard(shares, weight) == pytest.approx(PUBLISHED_JACCARD, abs=0.015)
    assert median_jaccard(shares, weight, seed=7) == pytest.approx(PUBLISHED_JACCARD, abs=0.025)  # other sessions
    assert median_jaccard(shares, 0.0) == 1.0                   # no drift: every session's hot set is the profile's
    # the sessions a DriftSampler draws have that overlap (the laws it routes by)
    drift = DriftSampler(shares, 6, weight, seed=3)
    sets = [hot_set(drift.for_session(i).shares) for i in range(5)]
    j = np.median([jaccard(sets[a], sets[b]) for a in range(5) for b in range(a + 1, 5)])
    assert j == pytest.approx(PUBLISHED_JACCARD, abs=0.04)


def test_hot_set_overlap_is_the_jaccard_of_each_layers_top_experts():
    a = np.array([[4.0, 3, 2, 1], [1, 2, 3, 4]])
    b = np.array([[4.0, 1, 3, 2], [4, 3, 2, 1]])
    assert hot_set(a, pairs=4).tolist() == [0, 1, 7, 6] and hot_set(b, pairs=4).tolist() == [0, 2, 4, 5]
    assert jaccard(hot_set(a, pairs=4), hot_set(b, pairs=4)) == pytest.approx(1 / 7)
    assert median_jaccard(a, 0.0, topics=3) == 1.0   # no drift: every session's hot set is the profile's


def test_no_drift_traces_are_todays():
    """Weight 0: every session shares the one sampler, so a replay is the TraceSampler's, draw for draw."""
    shares = zipf_profile(layers=2, experts=4)
    drift = DriftSampler(shares, 1, 0.0, seed=5)
    assert drift.for_session(0) is drift.for_session(3) is drift.base
    c = cost(layers=2)
    sessions = [SessionShape(f"s{i}", (Turn(3, 2), Turn(300, 2))) for i in range(2)]
    plain = simulate(sessions, [Ostinato(c, np.stack([c.layers[0].hot] * 2), None)], TraceSampler(shares, 1, 5))
    same = simulate(sessions, [Ostinato(c, np.stack([c.layers[0].hot] * 2), None)], drift)
    assert [[t.wait_s for t in s.turns] for s in plain["Ostinato"]] == [[t.wait_s for t in s.turns]
                                                                          for s in same["Ostinato"]]
    other = simulate(sessions, [Ostinato(c, np.stack([c.layers[0].hot] * 2), None)],
                     DriftSampler(shares, 1, 0.9, seed=5))
    assert [t.hot_routes for s in other["Ostinato"] for t in s.turns] != [t.hot_routes for s in plain["Ostinato"]
                                                                         for t in s.turns]


def adapting(c, hot, idle_bytes=10 ** 6, max_experts=8, prior=0.5, min_gain=0.002):
    policy = AdaptPolicy(mode="idle", max_experts=max_experts, max_bytes=idle_bytes, decay=0.5, prior=prior,
                         min_gain=min_gain)
    return AdaptiveOstinato(c, hot, None, [], policy)


def test_the_turns_hot_share_is_its_routes_to_the_resident_set():
    """test_one_turn_split_wait's turn: prefill e0 (hot), e2 (cold); decode e1 (hot), e3 (cold): half hot."""
    c = cost()
    sampler = Fixed({2: routing(1, 4, [{0: 1, 2: 1}])}, np.array([[[1]], [[3]]]))
    turn = simulate([SessionShape("s", (Turn(2, 2),))], [Ostinato(c, c.layers[0].hot[None], None)],
                    sampler)["Ostinato"][0].turns[0]
    assert (turn.hot_routes, turn.routes, turn.hot_share) == (2, 4, 0.5)


def test_re_placement_follows_a_drifting_session_one_for_one():
    """Every route of the session goes to cold e2, e3: after the turn both become hot in place of e0, e1,
    the next turn runs all hot, and no layer's hot pool grows."""
    c = cost(experts=6, hot=(0, 1, 4))
    hot = c.layers[0].hot[None]
    pol = adapting(c, hot)
    sampler = Fixed({4: routing(1, 6, [{2: 2, 3: 2}])}, np.array([[[2]], [[3]]] * 2))
    runs = simulate([SessionShape("s", (Turn(4, 2), Turn(4, 2), Turn(4, 2)))], [pol], sampler, idle_s=1.0)
    turns = runs[pol.name][0].turns
    assert [t.hot_share for t in turns] == [0.0, 1.0, 1.0]
    assert pol.hot.sum() == hot.sum() and pol.hot[0, [2, 3]].all() and pol.hot[0, 4]
    assert pol.moves == [2, 0]              # the second idle period has nothing left worth moving
    assert turns[1].wait_s < turns[0].wait_s
    pol.reset()                             # a new session starts from the plan again
    assert (pol.hot == hot).all()


def test_re_placement_uploads_no_more_than_the_idle_link_moves():
    """The hand link moves 1e4 B/s, an expert is 1000 B: 0.25 s of idle uploads 2 experts, 0.05 s none."""
    c = cost(layers=2, experts=8, hot=(0, 1, 2, 3))
    hot = np.stack([c.layers[0].hot] * 2)
    session = np.zeros((2, 8))
    session[:, 4:] = 100                     # every cold expert is worth promoting: 8 candidate swaps
    for idle, moved in ((0.25, 2), (0.05, 0), (10.0, 5)):   # 10 s: the policy's max_experts (5) binds
        pol = adapting(c, hot, max_experts=5, prior=0.2)
        pol.session = session.copy()
        pol.end_turn(idle)
        assert pol.moves == [moved] and (pol.hot.sum(axis=1) == 4).all()


def test_re_placement_leaves_a_session_that_routes_like_the_profile_alone():
    """No drift: routes drawn from the profile the plan was made from (hot e0-e2 take 3/4) move nothing."""
    c = cost(experts=8, hot=(0, 1, 2))
    shares = np.array([[0.25, 0.25, 0.25, 0.05, 0.05, 0.05, 0.05, 0.05]])
    pol = adapting(c, c.layers[0].hot[None])
    sampler = TraceSampler(shares, 1, seed=0)
    simulate([SessionShape("s", tuple(Turn(50, 20) for _ in range(6)))], [pol], sampler, idle_s=1.0)
    assert pol.moves == [0] * 5 and (pol.hot == c.layers[0].hot[None]).all()


def test_ktransformers_dynamic_update_moves_its_gpu_set_only_on_layerwise_prefills():
    c = cost(experts=6, hot=(0, 1))
    gpu = frequency_placed(np.array([[6.0, 5, 4, 3, 2, 1]]), 2)            # e0, e1
    kt = KTransformersDynamic(c, threshold=4, gpu_experts=gpu)
    short = routing(1, 6, [{4: 3}])
    assert kt.prefill(short, 3).mode == "cpu" and (kt.gpu == gpu).all()   # under the threshold: no update
    kt.decode(np.array([[[5]]] * 3))
    assert (kt.gpu == gpu).all() and kt.updates == 0
    long = routing(1, 6, [{4: 5, 5: 2, 0: 2, 1: 1}])
    assert kt.prefill(long, 10).mode == "layerwise"
    # e4 (5 routes), then e0 (2 routes, tied with e5: kept where it is resident)
    assert kt.gpu[0].tolist() == [True, False, False, False, True, False] and kt.updates == 1
    assert kt.resident() is kt.gpu
    kt.reset()
    assert (kt.gpu == gpu).all()


def test_the_stated_adaptation_policy_is_a_quarter_of_the_hot_set_and_the_links_idle_bytes():
    hot = np.zeros((4, 10), dtype=bool)
    hot[:, :5] = True
    p = default_adapt(hot, 25e9, 2.0)
    assert (p.mode, p.max_experts, p.max_bytes, p.decay, p.prior, p.min_gain) == ("idle", 5, 50 * 10 ** 9, 0.5, 0.5,
                                                                                   0.002)
