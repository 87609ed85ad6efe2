"""llama.cpp's ways to run a MoE model larger than the GPUs, as its options document them.

Layer placement (`-ngl` with the default split): whole layers (dense + experts) on the GPUs as far as
they fit, the rest on the CPU (a cpu-only spec: every layer, with nothing to offload to).

CPU experts (`-ngl 99 --cpu-moe`, `--n-cpu-moe L` or `-ot exps=CPU`: the common recipe for MoE models larger than
the GPUs): every layer's dense part (attention, router, shared expert) on the GPUs, every routed
expert in host memory. `--n-cpu-moe N` with N < L keeps only the first N layers' experts on the host:
the last L - N layers' experts stay on the GPUs (the tuned form of the recipe: as many whole layers of
experts as the GPU memory left over holds). A layer's GPU and CPU splits run one after another (no overlap); batches
below 32 tokens compute the experts on the CPU, the activations crossing the link both ways.
Both: host-resident weights are copied to the GPU for an op whose batch is >= GGML_OP_OFFLOAD_MIN_BATCH (32)
tokens ("op offload"): the host layers' dense weights and the experts the batch uses; smaller batches compute
them on the CPU. The scheduler copies a split's inputs before running it, so upload and compute are serial
here. Its graphs are built and run in C, so no per-op Python dispatch is added (cost.dispatch_time applies to
PyTorch systems).

LRU expert cache (`--moe-cache-mib`): dense parts on the GPUs, experts on the host, a GPU cache of
experts (here: as many per layer as Ostinato's hot set, the same bytes), warm-started with that hot
set. Batches of <= 32 tokens read and fill it: hits computed on the GPU, misses inserted (least recently
used evicted). A miss is a host-resident expert, so below GGML_OP_OFFLOAD_MIN_BATCH (32) tokens it is
computed on the CPU, as every host-resident weight is (the op offload rule above), after the GPU's hits,
and its copy into the cache does not hold up the step; at 32 tokens it is uploaded. Passes of more than
32 tokens skip the cache (the paper, arXiv 2611.11533, abstract: "skips forward passes of more than 32
tokens"): op offload uploads every expert the pass uses, as without a cache, and nothing is inserted.

A prompt runs as forwards of the physical batch, `-ub` (N_UBATCH): llama-server hands llama_decode batches of up
to `-b` tokens (the logical batch, 2048 by default), and llama_decode splits each into ubatches of up to `-ub`
tokens, building and computing one graph per ubatch. So the ubatch is the forward: its tokens are the op's batch
op offload compares with GGML_OP_OFFLOAD_MIN_BATCH (ggml-cuda's get_op_batch_size: a MUL_MAT's ne[1], a
MUL_MAT_ID's ne[2], the graph's tokens), and every ubatch copies the host weights it uses again; `-b` only decides
how many ubatches one llama_decode call runs.

Every configuration reads llama.cpp's own weights: the DeepSeek-V4-Flash GGUF as ggml-org publishes it
(formats.py GGUF_MXFP4_MOE: the dense matrices and the head in Q8_0, not the plan's formats).
"""

from __future__ import annotations

import numpy as np

from ostinato.compiler.cost_model import CostModel

from .formats import GGUF_MXFP4_MOE, with_weights
from .policy import Forward, Policy, dense_seconds

OP_OFFLOAD_MIN_BATCH = 32     # GGML_OP_OFFLOAD_MIN_BATCH default
CACHE_FILL_MAX_BATCH = 32     # --moe-cache-mib: batches above this only read the cache
# The physical batch -ub and the logical batch -b by default: common/common.h's n_ubatch = 512 and n_batch = 2048
# (ggml-org/llama.cpp at 001d906a); the forward is the ubatch (module docstring).
N_UBATCH, N_BATCH = 512, 2048


def gguf_cost(cost: CostModel, kernel=None) -> CostModel:
    """The plan's cost model as llama.cpp runs it: its GGUF's weights, and ggml's measured kernel rates
    (KernelRates, kernels.py; None: the cost model's own)."""
    cost = with_weights(cost, GGUF_MXFP4_MOE).with_csa_picks_only()   # its attention: the model's work (cost_model/)
    cost = cost.with_decode_threads(None)   # its threads: -t, every core, not Ostinato's decode pool
    return cost.with_host_kernel(kernel) if kernel is not None else cost


class LayerPlacement(Policy):
    name = "llama.cpp layers"
    weights = GGUF_MXFP4_MOE.name
    prefill_chunk = N_UBATCH   # -ub: the most tokens of one forward

    def __init__(self, cost: CostModel, gpu_layers: int, kernel=None):
        """`kernel`: ggml's measured kernel rates (KernelRates, kernels.py; None: the cost model's own)."""
        super().__init__(gguf_cost(cost, kernel))
        self.gpu_layers = gpu_layers

    def _layer(self, l: int, n: int, touched: int, routes: float, position=0,
               slots: np.ndarray | None = None) -> tuple[float, float, float, float]:
        """(seconds, gpu experts s, host experts s, upload s) of layer l, n tokens after `position` (an array of
        positions: the seconds an array); `slots`: the n tokens are n slots' one each, slot i after slots[i]."""
        c = self.cost
        if l < self.gpu_layers:
            g = c.gpu_experts_time(touched, routes)
            return _dense(c, l, n, position, slots) + g, g, 0.0, 0.0
        if n >= OP_OFFLOAD_MIN_BATCH and not c.hw.cpu_only:  # op offload: weights cross, then the GPU computes
            u = c.upload_time(touched, extra_bytes=c.layers[l].dense_bytes)
            g = c.gpu_experts_time(touched, routes)
            return u + _dense(c, l, n, position, slots) + g, g, 0.0, u
        h = c.host_experts_time(touched, routes)
        return _dense(c, l, n, position, slots, on_host=True) + h, 0.0, h, 0.0

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        parts = np.array([self._layer(l, n, int((counts[l] > 0).sum()), float(counts[l].sum()), position)
                          for l in range(self.L)])
        mode = "offload" if n >= OP_OFFLOAD_MIN_BATCH and self.gpu_layers < self.L and not self.cost.hw.cpu_only \
            else "layers"
        up = int(sum((counts[l] > 0).sum() for l in range(self.gpu_layers, self.L))) if mode == "offload" else 0
        return Forward(parts[:, 0].sum() + self.cost.forward_overheads(n, False), *parts[:, 1:].sum(0), mode, up)

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        return _whole_layer_decode(self, ids, position)   # routing does not change the step

    def batched_step(self, sessions: int, position: int) -> float:
        return _slots_step(self, sessions, position)


class CpuExperts(Policy):
    name = "llama.cpp CPU experts"
    weights = GGUF_MXFP4_MOE.name
    prefill_chunk = N_UBATCH   # -ub: the most tokens of one forward

    def __init__(self, cost: CostModel, kernel=None, n_cpu_moe: int | None = None):
        """`kernel`: ggml's measured kernel rates (KernelRates, kernels.py; None: the cost model's own);
        `n_cpu_moe`: `--n-cpu-moe N`, the leading layers whose experts stay on the host (None: all)."""
        super().__init__(gguf_cost(cost, kernel))
        self.n_cpu_moe = self.L if n_cpu_moe is None else max(0, min(n_cpu_moe, self.L))
        if self.n_cpu_moe < self.L:
            self.name = f"llama.cpp --n-cpu-moe {self.n_cpu_moe}"

    def _layer(self, l: int, n: int, touched: int, routes: float, position=0,
               slots: np.ndarray | None = None) -> tuple[float, float, float, float]:
        """(seconds, gpu experts s, host experts s, upload s) of layer l, n tokens after `position` (an array of
        positions: the seconds an array): its dense part on the GPU, then its experts on the host, or (op
        offload) uploaded and computed on the GPU, or (a layer past --n-cpu-moe) computed where they live, on the
        GPU. `slots`: the n tokens are n slots' one each, slot i after slots[i]."""
        c = self.cost
        if l >= self.n_cpu_moe:
            g = c.gpu_experts_time(touched, routes)
            return _dense(c, l, n, position, slots) + g, g, 0.0, 0.0
        if n >= OP_OFFLOAD_MIN_BATCH:
            u, g = c.upload_time(touched), c.gpu_experts_time(touched, routes)
            return _dense(c, l, n, position, slots) + u + g, g, 0.0, u
        h = c.cpu_experts_time(n, touched, routes)
        return _dense(c, l, n, position, slots) + h, 0.0, h, 0.0

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        parts = np.array([self._layer(l, n, int((counts[l] > 0).sum()), float(counts[l].sum()), position)
                          for l in range(self.L)])
        mode = "offload" if n >= OP_OFFLOAD_MIN_BATCH else "cpu"
        up = int((counts[:self.n_cpu_moe] > 0).sum()) if mode == "offload" else 0
        return Forward(parts[:, 0].sum() + self.cost.forward_overheads(n, False), *parts[:, 1:].sum(0), mode, up)

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        return _whole_layer_decode(self, ids, position)   # every step: k experts per layer on the host

    def batched_step(self, sessions: int, position: int) -> float:
        return _slots_step(self, sessions, position)


def _dense(c: CostModel, l: int, n: int, position, slots: np.ndarray | None, on_host: bool = False):
    """Layer l's dense part: n tokens of one sequence after `position`, or n slots' one each (`slots`)."""
    if slots is None:
        if np.ndim(position) == 0:   # one forward: every layer's at once, remembered (policy.dense_seconds)
            return dense_seconds(c, n, position, whole=True, on_host=on_host)[l]
        return c.attention_time(l, n, position, on_host=on_host)
    return c.batched_attention_time(l, slots, on_host=on_host)


def _slots_step(p, sessions: int, position: int) -> float:
    """Expected seconds of one llama-server decode step with `sessions` slots decoding (`--parallel N`, continuous
    batching: every slot's next token in one llama_decode batch, tools/server/README.md), all after `position`:
    the weights read once for the batch (ggml's mul_mat_id computes each distinct expert of the batch once, over
    its rows), each slot's attention over the rows visible to it (p._layer with `slots`)."""
    c, slots = p.cost, np.full(sessions, position)
    total = 0.0
    for l in range(p.L):
        touched = c.distinct(l, sessions, True) + c.distinct(l, sessions, False)
        total += float(p._layer(l, sessions, touched, float(sessions * p.k), slots=slots)[0])
    return total + c.forward_overheads(sessions, decode=True, head_tokens=sessions)


def _whole_layer_decode(p, ids: np.ndarray, position: int) -> tuple[np.ndarray, Forward]:
    """Decode steps of a policy whose layer seconds (`p._layer`) do not depend on the routing, the first after
    `position` tokens: each step's attention reads the rows visible at its own position."""
    T = ids.shape[0]
    at = position + np.arange(T)                                     # [T]
    parts = [p._layer(l, 1, p.k, p.k, at) for l in range(p.L)]
    steps = sum(x[0] for x in parts) + p.cost.forward_overheads(1, decode=True)   # [T]
    g, h = sum(x[1] for x in parts), sum(x[2] for x in parts)
    return np.asarray(steps, dtype=float), Forward(float(np.sum(steps)), g * T, h * T, 0.0, "decode")


def layers_that_fit(layer_bytes: list[int], expert_bytes: int, n_experts: int, budgets: list[int]) -> int:
    """How many leading layers fit whole (dense + all experts) into the GPUs' budgets, filled in order."""
    g, left, n = 0, list(budgets), 0
    for size in (b + n_experts * expert_bytes for b in layer_bytes):
        while g < len(left) and left[g] < size:
            g += 1
        if g == len(left):
            break
        left[g] -= size
        n += 1
    return n


class LruCache(Policy):
    name = "llama.cpp LRU cache"
    weights = GGUF_MXFP4_MOE.name
    prefill_chunk = N_UBATCH   # -ub: the most tokens of one forward

    def __init__(self, cost: CostModel, warm: np.ndarray, capacity: np.ndarray | None = None, kernel=None):
        """`kernel`: ggml's measured kernel rates, which compute the misses on the CPU (KernelRates, kernels.py;
        None: the cost model's own)."""
        super().__init__(gguf_cost(cost, kernel))
        self.warm = warm                                         # [L, E] bool: the cache's starting content
        self.cap = capacity if capacity is not None else warm.sum(axis=1)   # [L]
        self.reset()

    def reset(self) -> None:
        self.cached = self.warm.copy()                           # [L, E]
        self.last = np.where(self.warm, 0, -1).astype(np.int64)  # [L, E] time of last fill/use
        self.clock = 1

    def _touch(self, used: np.ndarray) -> None:
        """Refresh hits and insert misses of a filling batch, then evict the least recently used (one at a
        time, ties to the lowest id)."""
        self.last[used] = self.clock
        self.cached |= used
        self.clock += 1
        over = self.cached.sum(axis=1) - self.cap
        rows = np.flatnonzero(over > 0)
        if not rows.size:
            return
        never = np.iinfo(np.int64).max
        age = np.where(self.cached[rows], self.last[rows], never)   # [R, E] the over-full rows' last uses
        left, r = over[rows], np.arange(rows.size)
        while r.size:
            victim = age[r].argmin(axis=1)
            age[r, victim] = never
            self.cached[rows[r], victim] = False
            left[r] -= 1
            r = r[left[r] > 0]

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        c = self.cost
        used = counts > 0
        fills = n <= CACHE_FILL_MAX_BATCH
        miss = used & ~self.cached if fills else used      # a bigger pass skips the cache: every used expert is
        on_cpu = n < OP_OFFLOAD_MIN_BATCH                   # host-resident; below op offload's batch the CPU computes
        total = g_sum = h_sum = u_sum = 0.0
        dense = dense_seconds(c, n, position, whole=True)
        for l in range(self.L):
            hits = used[l] & ~miss[l]
            g = c.gpu_experts_time(float(hits.sum()), float(counts[l][hits].sum()))
            if on_cpu:
                h, u = c.cpu_experts_time(n, float(miss[l].sum()), float(counts[l][miss[l]].sum())), 0.0
            else:
                h, u = 0.0, c.upload_time(float(miss[l].sum()))
                g = c.gpu_experts_time(float(used[l].sum()), float(counts[l].sum()))
            total += u + dense[l] + g + h
            g_sum, h_sum, u_sum = g_sum + g, h_sum + h, u_sum + u
        if fills:
            self._touch(used)
        mode = "fill" if fills else "skip"
        return Forward(total + c.forward_overheads(n, False), g_sum, h_sum, u_sum, mode, int(miss.sum()))

    def _decode_misses(self, ids: np.ndarray) -> np.ndarray:
        """[T, L] misses of each decode step whose ids [T, L, k] are distinct per layer; every step filling
        the cache like _touch does (the same hits, inserts and evictions), on index arrays rather than masks."""
        T, L, k = ids.shape
        rows = np.arange(L)[:, None]
        never = np.iinfo(np.int64).max
        age = np.where(self.cached, self.last, never)     # [L, E] last use of the cached experts, never: not cached
        count = self.cached.sum(axis=1)
        misses = np.empty((T, L), dtype=np.int64)
        for t in range(T):
            sel = ids[t]                                   # [L, k]
            misses[t] = m = k - (age[rows, sel] != never).sum(axis=1)
            self.last[rows, sel] = age[rows, sel] = self.clock
            self.clock += 1
            count += m
            left = count - self.cap
            r = np.flatnonzero(left > 0)
            count[r] = self.cap[r]
            while r.size:                                  # the least recently used, ties to the lowest id
                victim = age[r].argmin(axis=1)
                age[r, victim] = never
                left[r] -= 1
                r = r[left[r] > 0]
        self.cached = age != never
        return misses

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        """Each step's hits on the GPU, then its misses on the CPU (1 token: below op offload's batch), one layer
        after the other; the misses' copies into the cache run beside the CPU's work, off the step's path."""
        c, T, L, k = self.cost, *ids.shape
        at = position + np.arange(T)   # [T]: each step's attention reads the rows visible then
        base = sum(c.attention_time(l, 1, at) for l in range(L)) + c.forward_overheads(1, True)   # [T]
        rows = np.arange(L)[:, None]
        if T and (np.diff(np.sort(ids, axis=2), axis=2) == 0).any():   # repeated ids in a step: the general path
            misses = np.empty((T, L), dtype=np.int64)
            for t in range(T):
                used = np.zeros_like(self.cached)
                used[rows, ids[t]] = True
                misses[t] = (used & ~self.cached).sum(axis=1)
                self._touch(used)
        else:
            misses = self._decode_misses(ids)
        # seconds of a layer with m of its k routes missing: k - m experts on the GPU, m on the CPU (hand-off and
        # the token's activations both ways included)
        on_gpu = np.array([c.gpu_experts_time(k - m, k - m) for m in range(k + 1)])
        on_cpu = np.array([c.cpu_experts_time(1, m, m) for m in range(k + 1)])
        g, h = on_gpu[misses].sum(axis=1), on_cpu[misses].sum(axis=1)   # [T]
        steps = base + g + h
        return steps, Forward(float(steps.sum()), float(g.sum()), float(h.sum()), 0.0, "decode", int(misses.sum()))
