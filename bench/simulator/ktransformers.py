"""KTransformers-like (kt-kernel + its SGLang fork, as docs/baselines.md summarises its docs): attention, the
shared expert and the dense parts on the GPUs, routed experts on the CPU except `--kt-num-gpu-experts N`
per layer kept on the GPUs; prefills above `--kt-gpu-prefill-token-threshold` switch to layerwise GPU
prefill, streaming the layer's experts to the GPUs (tensor parallel: every GPU takes its shard over its
own link at once, as fast as host memory feeds them; modeled double-buffered like every upload here).
The threshold is compared with each forward's tokens, `num_tokens >= threshold` where num_tokens is the MoE
layer's input rows (kvcache-ai/sglang python/sglang/srt/layers/moe/kt_ep_wrapper.py at 04653fa88), and a forward
has at most --chunked-prefill-size tokens (RECIPE_CHUNKED_PREFILL): a prompt longer than that runs chunk by
chunk, each chunk deciding alone, and a threshold above the chunk never switches (the recipe's 4096 over 2048).
Decode: the CPU experts run inside the captured graph.
Like Ostinato it runs PyTorch: prefill eagerly (op dispatch counted at an unfused PyTorch forward's
UNFUSED_EAGER_OPS_PER_LAYER), decode as captured CUDA graphs.

Its configurations (World.policies), named below: as its DeepSeek-V4-Flash recipe runs it (DOCUMENTED:
`--disable-radix-cache`, so every turn prefills the whole context again; GPU experts by the default `uniform`
strategy; prefill threshold 4096); at its best-documented (BEST_DOCUMENTED: GPU experts by the `frequency`
strategy from the same routing profile Ostinato plans with, the threshold where its layerwise prefill starts
to win, and still no prefix reuse: the recipe turns the radix cache off and SGLang's DeepSeek-V4 radix cache is
in open pull requests, sglang 31097 / 35837 / 39055); and, labeled hypothetical, the same with a prefix cache
it does not have for this model (WITH_PREFIX_CACHE: every turn prefills only what it appends).
With `mtp` (acceptance, depth): EAGLE speculative decoding with the MTP block as SGLang runs it
(`--speculative-num-steps depth`, top-1 drafts): `depth` drafts, one verify forward of depth + 1 tokens in
its decode graph (split routes over the distinct experts of those tokens), the accepted prefix and the
verify's own next token kept, no re-run (cost_model.speculative_step with rerun False).
KTransformersDynamic adds its dynamic expert update (`--kt-enable-dynamic-expert-update`, issue #31).
Not modeled: expert deferral (an approximation Ostinato does not make) and tensor parallelism's per-layer
all-reduce (which would only slow it). Its weights are the checkpoint's as stored (formats.py CHECKPOINT), as its
recipe loads them, not the plan's formats."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from ostinato.compiler.cost_model import UNFUSED_EAGER_OPS_PER_LAYER, CostModel

from .formats import CHECKPOINT, with_weights
from .policy import Forward, Policy, speculative_decode, split_pass, static_decode, upload_pass

DOCUMENTED_THRESHOLD = 4096   # --kt-gpu-prefill-token-threshold in its DeepSeek-V4-Flash tutorial (PUBLISHED.md)
# The tokens of one prefill forward: SGLang cuts a prompt into forwards of --chunked-prefill-size tokens, 2048 in
# every version of that tutorial's launch command (kvcache-ai/ktransformers doc/en/DeepSeek-V4-Flash.md, commits
# 041bdfc6 2026-05-03 to f5ee50d4 2026-08-05), and SGLang's own default for GPUs of 20-35 GB (A10, 4090, 5090:
# kvcache-ai/sglang python/sglang/srt/server_args.py at 04653fa88, 2026-07-15).
RECIPE_CHUNKED_PREFILL = 2048
# How that tutorial (kvcache-ai/ktransformers doc/en/DeepSeek-V4-Flash.md) batches requests: since commit 37db9a3b
# (2026-05-09; still so at 95009ea6, 2026-08-21) `--max-running-requests 2` with CUDA graphs captured for batch 1
# only (`--cuda-graph-bs 1 --cuda-graph-max-bs 1`), so two requests decode in an eager forward; its first recipe
# (8x RTX 5090, to commit c465557c) ran 4 at a time with graphs for 1, 2 and 4 (`--cuda-graph-bs 1 2 4`).
RECIPE_MAX_RUNNING, RECIPE_GRAPH_BATCHES = 2, (1,)
FIRST_RECIPE_MAX_RUNNING, FIRST_RECIPE_GRAPH_BATCHES = 4, (1, 2, 4)
DOCUMENTED = "KTransformers (its DSV4 recipe)"
BEST_DOCUMENTED = "KTransformers + frequency GPU experts"
HYPOTHETICAL = "(hypothetical)"   # the mark of a variant with a feature its DeepSeek-V4 recipe lacks
WITH_PREFIX_CACHE = f"KTransformers + frequency GPU experts + prefix cache {HYPOTHETICAL}"


def is_hypothetical(name: str) -> bool:
    """Whether a table row is a variant with features its system's recipe lacks (not a baseline that exists)."""
    return name.endswith(HYPOTHETICAL)


def frequency_placed(shares: np.ndarray, per_layer: int) -> np.ndarray:
    """[L, E] bool: each layer's `per_layer` most-routed experts by the profile's shares [L, E] (the
    `frequency` strategy: N per layer chosen by activation frequency; ties to the lower id)."""
    L, E = shares.shape
    top = np.argsort(-shares, axis=1, kind="stable")[:, :min(per_layer, E)]  # [L, N]
    gpu = np.zeros((L, E), dtype=bool)
    gpu[np.arange(L)[:, None], top] = True
    return gpu


def uniform_placed(shape: tuple[int, int], per_layer: int) -> np.ndarray:
    """[L, E] bool: `per_layer` experts per layer spread evenly over the ids, blind to routing (the
    `uniform` strategy, which needs no activation statistics)."""
    L, E = shape
    gpu = np.zeros((L, E), dtype=bool)
    n = min(per_layer, E)
    gpu[:, (np.arange(n) * E) // max(n, 1)] = n > 0
    return gpu


def kt_cost(cost: CostModel, kernel=None) -> CostModel:
    """The plan's cost model as KTransformers runs it: the checkpoint's weights, its unfused eager forward, and
    kt-kernel's measured rates (compiler/host_kernel.py's KernelRates; None: the cost model's own)."""
    cost = with_weights(cost, CHECKPOINT).with_eager_ops(UNFUSED_EAGER_OPS_PER_LAYER)  # its forward is not ours
    cost = cost.with_decode_threads(None)   # its workers: --kt-cpuinfer, the recipe's, not Ostinato's decode pool
    cost = cost.with_csa_picks_only()   # its attention kernels: priced at the model's work (cost_model/)
    return cost.with_host_kernel(kernel) if kernel is not None else cost


class KTransformers(Policy):
    name = "KTransformers"
    weights = CHECKPOINT.name
    max_running = RECIPE_MAX_RUNNING          # --max-running-requests
    prefill_chunk = RECIPE_CHUNKED_PREFILL    # --chunked-prefill-size: the most tokens of one prefill forward
    graph_batches = RECIPE_GRAPH_BATCHES      # --cuda-graph-bs: the batch sizes decoded by a captured graph

    def __init__(self, cost: CostModel, threshold: int, gpu_experts: np.ndarray | None = None, kernel=None,
                 reuses_prefix: bool = False, name: str | None = None, mtp: tuple[float, int] | None = None):
        """`gpu_experts` [L, E] bool: the experts it keeps on the GPUs (None: none); `kernel`: kt-kernel's
        measured rates (compiler/host_kernel.py's KernelRates; None: the cost model's own); `reuses_prefix`:
        a prefix cache across turns, which its DeepSeek-V4 recipe does not have (True only for a variant named
        hypothetical); `mtp`: (acceptance, depth) of EAGLE speculative decoding (None: plain decode)."""
        super().__init__(kt_cost(cost, kernel))
        E = cost.layers[0].hot.size
        self.threshold = threshold
        self.gpu = gpu_experts if gpu_experts is not None else np.zeros((self.L, E), dtype=bool)
        self.reuses_prefix = reuses_prefix
        self.links = cost.hw.gpus.count
        self.name = name or self.name
        self.mtp = mtp
        self._draft_s = with_gpu_set(self.cost, self.gpu).mtp_draft() if mtp is not None else 0.0

    def with_mtp(self, acceptance: float, depth: int, name: str | None = None) -> KTransformers:
        """The same system decoding with EAGLE speculation (`mtp` of __init__)."""
        other = copy.copy(self)
        other.mtp, other.name = (acceptance, depth), name or f"{self.name} + MTP"
        other._draft_s = with_gpu_set(self.cost, self.gpu).mtp_draft()
        return other

    def with_batching(self, max_running: int, graph_batches: tuple[int, ...], name: str | None = None) -> KTransformers:
        """The same system serving with `--max-running-requests max_running --cuda-graph-bs *graph_batches`."""
        other = copy.copy(self)
        other.max_running, other.graph_batches, other.name = max_running, tuple(graph_batches), name or self.name
        return other

    def batched_step(self, sessions: int, position: int) -> float:
        """SGLang's decode batch: its running requests' tokens in one forward, the dense parts and the GPU experts
        once over the batch (its fused MoE groups the routes by expert: each distinct GPU expert read once),
        kt-kernel the batch's cold routes over their distinct experts, each request's paged attention over the rows
        visible to it. A captured graph serves a batch no larger than its largest captured size (SGLang pads up to
        the next captured size; the padding is not priced); a larger batch runs eagerly, dispatched op by op
        (UNFUSED_EAGER_OPS_PER_LAYER, as its prefill)."""
        if not 1 <= sessions <= self.max_running:
            raise ValueError(f"{self.name}: {sessions} sessions decoding at once; it runs 1 to {self.max_running}")
        if self.mtp is not None:
            raise ValueError(f"{self.name}: speculative decoding of several sessions at once is not modeled")
        eager = None if sessions <= max(self.graph_batches) else True
        return with_gpu_set(self.cost, self.gpu).batched_decode_step([position] * sessions, fixed_shape=False,
                                                                    grouped_hot=True, eager=eager)

    def resident(self) -> np.ndarray:
        return self.gpu

    def layerwise(self, n: int) -> bool:
        """Whether a forward of n tokens takes its layerwise GPU prefill (kt_ep_wrapper: num_tokens >= threshold)."""
        return n >= self.threshold

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        if self.layerwise(n):
            return upload_pass(self.cost, counts, n, np.broadcast_to(~self.gpu, counts.shape), "layerwise",
                               links=self.links, position=position)
        return split_pass(self.cost, counts, n, self.gpu, "cpu", position=position)

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        # its paged attention reads the rows visible at each step (policy.py: not a fixed-shape step)
        if self.mtp is None:
            return static_decode(self.cost, self.gpu, ids, position=position)
        acceptance, depth = self.mtp
        return speculative_decode(self.cost, self.gpu, ids, acceptance, self._draft_s, (False, False), depth,
                                  rerun=False, position=position)


def top_of_batch(counts: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """[L, E] bool: each layer's gpu.sum() most-routed experts of one batch's counts [L, E], ties kept on the
    GPUs where they are (then to the lower id): the GPU set its dynamic update leaves after a layerwise prefill
    (kt_ep_wrapper's _update_gpu_experts_from_batch, select_top_experts_from_batch)."""
    L, E = counts.shape
    order = np.lexsort((np.broadcast_to(np.arange(E), (L, E)), ~gpu, -counts), axis=-1)  # [L, E] per layer: most
    keep = np.arange(E)[None, :] < gpu.sum(axis=1)[:, None]   # [L, E]   routes, then resident, then id
    out = np.zeros_like(gpu)
    np.put_along_axis(out, order, keep, axis=1)   # each layer's first gpu[l].sum() of its order
    return out


class KTransformersDynamic(KTransformers):
    """KTransformers with `--kt-enable-dynamic-expert-update`: its layerwise prefill (a forward of more than
    `--kt-gpu-prefill-token-threshold` tokens) streams every expert of a layer to the GPUs anyway, and the
    update keeps there each layer's most-routed experts of that batch (top_of_batch) for the forwards after
    it, at no upload of its own. Its docs: the update triggers only when a prefill reaches the threshold
    (doc/en/kt-kernel/experts-sched-Tutorial.md, 'Dynamic Expert Update Not Triggering'); short prefills
    and decode never move the set. Each session starts from the given GPU set again (the server's state
    between sessions is not modeled)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial = self.gpu.copy()
        self.updates = 0

    def reset(self) -> None:
        self.gpu, self.updates = self.initial.copy(), 0

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        f = super().prefill(counts, n, position)
        if self.layerwise(n):
            self.gpu = top_of_batch(counts, self.gpu)
            self.updates += 1
        return f


def with_gpu_set(cost: CostModel, gpu: np.ndarray) -> CostModel:
    """The cost model with `gpu` [L, E] as each layer's GPU-resident set (for expected-value timings). The
    MTP block keeps the plan's own hot set only with the plan's layers' (Ostinato); another system's draft
    is priced as an average layer of its set (CostModel.mtp_draft without a placement)."""
    other = copy.copy(cost)
    other.layers = [replace(l, hot=gpu[i]) for i, l in enumerate(cost.layers)]  # shares, so _q, unchanged
    if cost.mtp is not None and not all(np.array_equal(l.hot, gpu[i]) for i, l in enumerate(cost.layers)):
        other.mtp = replace(cost.mtp, hot=None, share=None)
    return other


def layerwise_prefill(cost: CostModel, gpu: np.ndarray, n: int) -> float:
    """Expected seconds of KTransformers' layerwise prefill of n tokens: every non-GPU expert of a layer
    streamed over all the GPUs' links, double-buffered against the layer's compute."""
    links, k = cost.hw.gpus.count, cost.cfg.num_experts_per_tok
    per = []
    for l in range(len(cost.layers)):
        touched = cost.distinct(l, n, True) + cost.distinct(l, n, False)
        per.append((cost.upload_time(float((~gpu[l]).sum()), links=links),
                    cost.attention_time(l, n) + cost.gpu_experts_time(touched, n * k)))
    return float(cost.forward_time(cost.pipelined(per), n, decode=False, eager=True))


def best_threshold(cost: CostModel, gpu: np.ndarray, kernel=None, largest: int = RECIPE_CHUNKED_PREFILL) -> int:
    """The prefill threshold set well: the smallest size (powers of two and their midpoints) from which its
    layerwise prefill is expected to beat its CPU path, by this cost model with kt-kernel's rates, up to `largest`
    (a forward's most tokens, --chunked-prefill-size); largest + 1 when it wins at none: no forward switches."""
    c = with_gpu_set(kt_cost(cost, kernel), gpu)
    sizes = sorted({m for p in range(7, largest.bit_length()) for m in (1 << p, 3 << (p - 1)) if m <= largest})
    return next((n for n in sizes if layerwise_prefill(c, gpu, n) < c.split_forward(n)), largest + 1)
