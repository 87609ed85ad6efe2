"""What a policy answers for one forward pass, and the per-layer arithmetic the policies share.

Every time comes from the project's cost model (compiler/cost_model/) fed with a trace's explicit
counts: the simulator has no hardware model of its own. A layer runs in the cost model's order
(CostModel.layer_seconds): its dense part before the experts, then the GPU side (hot experts and the shared
expert) beside the host side (cold experts and their hand-off).
Every forward is priced at its `position`: the tokens already in the session before it (the replay passes
each turn's; 0, the default, is a fresh session). A dynamic forward's attention reads the rows visible then;
a fixed-shape step's (`fixed_shape`: Ostinato's decode, bucket and verify steps) the rows of its buffers
(CostModel.step_context).
Legend: T tokens (or decode steps), L layers, E experts, k routes per token.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ostinato.buckets import bucket_pieces
from ostinato.compiler.cost_model import EAGER_STEP_OPS_PER_LAYER, CostModel, speculative_step


@dataclass(frozen=True)
class Forward:
    """One forward pass (a prefill, or a run of decode steps summed): seconds and where they went.
    The parts are summed work, not wall time: concurrent parts overlap inside `seconds`."""
    seconds: float
    gpu_experts_s: float = 0.0
    cpu_experts_s: float = 0.0
    upload_s: float = 0.0
    mode: str = ""
    uploaded: int = 0            # experts that crossed the link


class Policy:
    """A system's rule for where each route runs. Subclasses cite the documented rule they follow."""
    name = "policy"
    reuses_prefix = True   # False: the server keeps no prefix cache, so every turn prefills the whole context
    max_running: int | None = None   # sessions decoding at once at most (None: no limit); more wait in a queue

    def __init__(self, cost: CostModel):
        self.cost = cost
        self.k = cost.cfg.num_experts_per_tok
        self.L = len(cost.layers)

    def reset(self) -> None:
        """A new session (caches start cold)."""

    @property
    def prefill_chunk(self) -> int:
        """The most tokens one prefill forward runs: a longer prompt runs as forwards of this many tokens, the last
        one shorter, each after the ones before it (replay.py). Here the plan's policy.prefill_chunk, as Ostinato's
        runtime/model/session.py cuts a prompt; a baseline states its own documented size beside its class."""
        return self.cost.prefill_chunk

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:   # counts [L, E]
        """One forward of n tokens routed as `counts` after `position` tokens already in the session."""
        raise NotImplementedError

    def prefill_prompt(self, passes: list[tuple[np.ndarray, int]], position: int = 0) -> Forward:
        """A prompt as the system runs it: its forwards `passes` [(counts [L, E], tokens)] of at most prefill_chunk
        tokens, the first after `position`, each after the ones before it, summed. Here each forward is priced
        alone (prefill), as a system that decides how to run a forward from that forward's own tokens does; one
        that decides once for the whole prompt overrides this (Ostinato)."""
        return summed([self.prefill(counts, n, at) for (counts, n), at in zip(passes, chunk_starts(passes, position))])

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:   # ids [T, L, k] -> [T]
        """Decode steps routed as `ids`, the first after `position` tokens already in the session, each one
        token further on."""
        raise NotImplementedError

    def running(self, sessions: int) -> int:
        """How many of `sessions` concurrent sessions decode together in one step; the rest wait in its queue
        (max_running: None, as many as there are)."""
        return sessions if self.max_running is None else min(sessions, self.max_running)

    def batched_step(self, sessions: int, position: int) -> float:
        """Expected seconds of one decode step in which `sessions` running sessions, all after `position` tokens,
        decode one token each, routed by expectation (CostModel.distinct: the distinct experts their tokens touch)."""
        raise NotImplementedError(f"{self.name}: decoding several sessions at once is not modeled")

    def resident(self) -> np.ndarray | None:
        """[L, E] bool: the experts resident on the GPUs now (the hot share of a turn is its routes to them);
        None for a system without a fixed resident set (a cache, whole layers)."""
        return None

    def end_turn(self, idle_s: float) -> None:
        """A turn ended and the agent's tool runs for `idle_s` seconds before the next one (re-placement)."""


def chunk_starts(passes: list[tuple[np.ndarray, int]], position: int = 0) -> list[int]:
    """The position of each forward of a prompt cut into `passes` [(counts, tokens)] that starts after `position`."""
    return [int(at) for at in position + np.cumsum([0] + [n for _, n in passes[:-1]])]


def summed(fs: list[Forward]) -> Forward:
    """A prompt's forwards as one Forward: seconds and parts added, the mode the last forward's."""
    if len(fs) == 1:
        return fs[0]
    return Forward(sum(f.seconds for f in fs), sum(f.gpu_experts_s for f in fs), sum(f.cpu_experts_s for f in fs),
                   sum(f.upload_s for f in fs), fs[-1].mode, sum(f.uploaded for f in fs))


# dense_seconds' memo per cost model object (a pure function of the model, which is not changed once built: see
# decode_table) and forward: a context prefilled again every turn runs its chunks at the same positions each turn
_DENSE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def dense_seconds(cost: CostModel, n: int, position: int, whole: bool = False, on_host: bool = False,
                  step_context: int | None = None) -> np.ndarray:
    """[L] cost.before_experts_time(l, n, position, on_host, step_context) of every layer l (`whole`:
    cost.attention_time, the shared expert's part too) for one forward at a single `position`, each entry the very
    value the call returns. A fixed-shape step's (`step_context`) reads its buffers' rows whatever the position.
    Read-only: remembered per cost model."""
    key = (whole, n, position if step_context is None else None, on_host, step_context)
    memo = _DENSE.setdefault(cost, {})
    if key not in memo:
        price = cost.attention_time if whole else cost.before_experts_time
        memo[key] = np.array([price(l, n, position, on_host, step_context) for l in range(len(cost.layers))])
        memo[key].flags.writeable = False
    return memo[key]


# _Prices' memo per cost model object (pure functions of the model, as dense_seconds')
_PRICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Prices:
    """A cost model's expert and upload prices remembered by their arguments: each value the very one the cost model
    returns. A context prefilled again every turn prices the same few (distinct, routes) pairs in every chunk and
    layer (a layerwise chunk's every route on the GPU, its uploads the same each layer). It holds no reference to
    the cost model (the memo's weak key)."""

    def __init__(self):
        self.gpu, self.host, self.link = {}, {}, {}

    @staticmethod
    def of(cost: CostModel) -> _Prices:
        prices = _PRICES.get(cost)
        if prices is None:
            prices = _PRICES[cost] = _Prices()
        return prices

    def gpu_experts(self, cost: CostModel, distinct: float, routes: float) -> float:
        key = (distinct, routes)
        if key not in self.gpu:
            self.gpu[key] = cost.gpu_experts_time(distinct, routes)
        return self.gpu[key]

    def cpu_experts(self, cost: CostModel, n: int, distinct: float, routes: float) -> float:
        key = (n, distinct, routes)
        if key not in self.host:
            self.host[key] = cost.cpu_experts_time(n, distinct, routes)
        return self.host[key]

    def upload(self, cost: CostModel, experts: float, links: int) -> float:
        key = (experts, links)
        if key not in self.link:
            self.link[key] = cost.upload_time(experts, links=links)
        return self.link[key]


def _split_sums(counts: np.ndarray, gpu: np.ndarray) -> tuple[list[float], ...]:
    """Per layer (as floats): distinct GPU experts touched, their routes, distinct host experts touched, theirs.
    All layers at once; the sums are of integer counts, so exact in any order."""
    touched = counts > 0
    return tuple((x.sum(axis=1).astype(float).tolist()) for x in (
        touched & gpu, np.where(gpu, counts, 0), touched & ~gpu, np.where(gpu, 0, counts)))


def split_pass(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, mode: str = "split",
               eager: bool = True, position: int = 0) -> Forward:
    """Routes to experts with gpu[l, e] run on the layer's GPU, the others on the host kernels,
    concurrently after the layer's dense part (cost.split_layer with the trace's counts instead of
    expectations), n tokens after `position`. `eager`: the system issues the forward's ops one by one from
    Python (cost.dispatch_time)."""
    total = g_sum = c_sum = 0.0
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)
    first, prices = dense_seconds(cost, n, position), _Prices.of(cost)
    for l in range(counts.shape[0]):
        g = prices.gpu_experts(cost, hot_d[l], hot_r[l])
        h = prices.cpu_experts(cost, n, cold_d[l], cold_r[l])
        total += float(cost.layer_seconds(first[l], cost.shared_expert_time(l, n) + g, h))
        g_sum, c_sum = g_sum + g, c_sum + h
    return Forward(float(cost.forward_time(total, n, False, eager)), g_sum, c_sum, 0.0, mode)


def upload_pass(cost: CostModel, counts: np.ndarray, n: int, upload: np.ndarray, mode: str,
                eager: bool = True, links: int = 1, position: int = 0) -> Forward:
    """Each layer's `upload[l]` experts cross the link once (over `links` GPUs' links at once),
    double-buffered against the previous layer's compute, and every route runs on the GPU after the layer's
    dense part (cost.upload_prefill with explicit counts), n tokens after `position`."""
    per, g_sum, u_sum = [], 0.0, 0.0
    k = cost.cfg.num_experts_per_tok
    touched, uploads = (counts > 0).sum(axis=1).tolist(), upload.sum(axis=1).tolist()  # per layer, all at once
    dense, prices = dense_seconds(cost, n, position, whole=True), _Prices.of(cost)
    for l in range(counts.shape[0]):
        g = prices.gpu_experts(cost, float(touched[l]), float(n * k))
        u = prices.upload(cost, float(uploads[l]), links)
        per.append((u, float(dense[l]) + g))
        g_sum, u_sum = g_sum + g, u_sum + u
    return Forward(float(cost.forward_time(cost.pipelined(per), n, False, eager)), g_sum, 0.0, u_sum, mode,
                   int(upload.sum()))


def sharded_pass(cost: CostModel, counts: np.ndarray, n: int, hot: np.ndarray, position: int = 0) -> Forward:
    """An upload-once prefill sharded over every GPU's link (cost.sharded_layer with the trace's counts): each GPU
    uploads and computes a 1/G slice of the layer's distinct cold experts, the hot routes run on the layer's GPU,
    the activations go out and the partials come back through the host; n tokens after `position`."""
    per, g_sum, u_sum = [], 0.0, 0.0
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, hot)
    for l in range(counts.shape[0]):
        up, compute = cost.sharded_layer(l, n, (hot_d[l], hot_r[l]), (cold_d[l], cold_r[l]), position)
        per.append((up, compute))
        g_sum, u_sum = g_sum + compute, u_sum + up
    return Forward(float(cost.forward_time(cost.pipelined(per), n, False, True)), g_sum, 0.0, u_sum, "sharded",
                   int(((counts > 0) & ~hot).sum()))


def bucket_pass(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, buckets: list[int],
                position: int = 0) -> Forward:
    """A short prefill as fixed-shape bucket steps (cost.bucket_step with the trace's counts), the first after
    `position`, each after the ones before it: each step of T tokens gets T / n of every expert's routes; on a
    GPU each hot route reads its expert (the step's per-route launch), the host's cold part is split-route's;
    attention reads the step's rows (cost.step_context); replayed graphs (eager on a cpu-only spec)."""
    total = g_sum = c_sum = 0.0
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)   # the same for every step
    at = position
    for T in bucket_pieces(n, buckets):
        share, step, context = T / n, 0.0, cost.step_context(T, at)
        first = dense_seconds(cost, T, at, step_context=context)
        for l in range(counts.shape[0]):
            hot_routes, cold_routes = share * hot_r[l], share * cold_r[l]
            hot_reads = min(hot_routes, hot_d[l]) if cost.hw.cpu_only else hot_routes
            g = cost.gpu_experts_time(hot_reads, hot_routes)
            h = cost.cpu_experts_time(T, min(cold_routes, cold_d[l]), cold_routes)
            step += float(cost.layer_seconds(first[l], cost.shared_expert_time(l, T) + g, h))
            g_sum, c_sum = g_sum + g, c_sum + h
        total += float(cost.forward_time(step, T, True, cost.decode_is_eager(), cost.step_ops_per_layer(T)))
        at += T
    return Forward(total, g_sum, c_sum, 0.0, "bucket")


# decode_table's memo per cost model object: a pure function of the model, which is not changed once built
# (with_host_kernel and the like return copies), so each policy's table is computed once, not per decode
_DECODE_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decode_table(cost: CostModel, k: int) -> np.ndarray:
    """[L, k+1] seconds of one decode step's layer after its dense part (before_experts_time, which depends on
    the position: first_parts) when h of its k routes hit GPU-resident experts: the GPU side (h hot routes and
    the shared expert) beside the host side (k - h cold routes). Read-only: remembered per cost model."""
    tables = _DECODE_TABLES.setdefault(cost, {})
    if k not in tables:
        tables[k] = _decode_table(cost, k)
        tables[k].flags.writeable = False
    return tables[k]


def _decode_table(cost: CostModel, k: int) -> np.ndarray:
    """[L, k+1] a decode layer's experts with h of its k routes hot, the expert pool at the model's threads for
    decode-sized calls (cost.decode_pool_threads: Ostinato's plan's choice; None, every core, for the baselines)."""
    L, threads = len(cost.layers), cost.decode_pool_threads
    t = np.empty((L, k + 1))
    for l in range(L):
        for h in range(k + 1):
            t[l, h] = cost.overlap(cost.shared_expert_time(l, 1) + cost.gpu_experts_time(h, h, threads),
                                   cost.cpu_experts_time(1, k - h, k - h, threads))
    return t


def resident_hits(gpu: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[T, L, k] bool: whether each route of ids [T, L, k] goes to an expert of gpu [L, E] (np.take_along_axis of
    gpu[None] along the experts, as one flat take: layer l's expert e is gpu's flat entry l * E + e)."""
    L, E = gpu.shape
    return gpu.ravel().take(ids + (np.arange(L) * E)[:, None])


def first_parts(cost: CostModel, size: int, positions: np.ndarray, fixed_shape: bool) -> np.ndarray:
    """[T, L] seconds of each layer's dense part before its experts in a forward of `size` tokens after each of
    `positions` [T]: a fixed-shape step's (its buffers' rows, cost.step_context) or a dynamic one's (the rows
    visible then)."""
    L, positions = len(cost.layers), np.asarray(positions, dtype=np.int64)
    out = np.empty((positions.size, L))
    if fixed_shape:   # few distinct step contexts (one on GPUs)
        contexts = np.array([cost.step_context(size, int(p)) for p in positions])
        for c in np.unique(contexts):
            out[contexts == c] = [float(x) for x in dense_seconds(cost, size, None, step_context=int(c))]
        return out
    for l in range(L):
        out[:, l] = cost.before_experts_time(l, size, positions)
    return out


# run_first_parts' memo per cost model object: its last few runs of steps (every system on one cost model, Ostinato's
# variants and ablations, decodes a turn's steps at the same positions, one system after the other)
_RUN_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RUN_PARTS_KEPT = 8


def run_first_parts(cost: CostModel, size: int, start: int, steps: int, fixed_shape: bool) -> np.ndarray:
    """[steps, L] first_parts of `steps` consecutive forwards of `size` tokens, the first after `start` tokens, each
    one token further on. Read-only: remembered per cost model for its last _RUN_PARTS_KEPT runs."""
    key = (size, int(start), steps, fixed_shape)
    runs = _RUN_PARTS.setdefault(cost, {})
    if key not in runs:
        if len(runs) >= _RUN_PARTS_KEPT:
            del runs[next(iter(runs))]   # the oldest run
        runs[key] = first_parts(cost, size, start + np.arange(steps), fixed_shape)
        runs[key].flags.writeable = False
    return runs[key]


def static_decode(cost: CostModel, gpu: np.ndarray, ids: np.ndarray, eager: bool | None = None,
                  position: int = 0, fixed_shape: bool = False) -> tuple[np.ndarray, Forward]:
    """Decode steps with a fixed GPU-resident set, the first after `position` tokens: per step and layer, the
    routes that hit it; the step is a replayed graph (eager only on a cpu-only spec, or when `eager` says so).
    `fixed_shape`: the steps read their buffers' rows (Ostinato's decode step), else the rows visible."""
    T, k = ids.shape[0], ids.shape[2]
    hits = resident_hits(gpu, ids).sum(axis=2)                            # [T, L]
    first = run_first_parts(cost, 1, position, T, fixed_shape)            # [T, L]
    steps = first.sum(axis=1) + decode_table(cost, k)[np.arange(ids.shape[1])[None], hits].sum(axis=1)  # [T]
    # the plan's decode step, as decode_step prices it (dispatched only where it is eager: a cpu-only spec);
    # a step forced eager on GPUs dispatches the dynamic forward's ops
    ops = cost.step_ops_per_layer(1) if eager is None else None
    steps = cost.forward_time(steps, 1, True, cost.decode_is_eager() if eager is None else eager, ops)
    threads = cost.decode_pool_threads
    gtab = np.array([cost.gpu_experts_time(h, h, threads) for h in range(k + 1)])
    ctab = np.array([cost.cpu_experts_time(1, k - h, k - h, threads) for h in range(k + 1)])
    return steps, Forward(float(steps.sum()), float(gtab[hits].sum()), float(ctab[hits].sum()), 0.0, "decode")


def _group_ids(ids: np.ndarray, size: int) -> np.ndarray:
    """[T, L, size*k]: token t's routes with those of the size-1 tokens after it (wrapping around the turn:
    the trace's tokens are drawn independently, so any neighbours price a verify alike)."""
    T = ids.shape[0]
    return np.concatenate([ids[(np.arange(T) + j) % T] for j in range(size)], axis=2)


def verify_steps(cost: CostModel, gpu: np.ndarray, ids: np.ndarray, size: int, per_route: bool, eager: bool,
                 position: int = 0, fixed_shape: bool = False) -> tuple[np.ndarray, float, float]:
    """Seconds [T] of a verify forward of `size` tokens starting at each decode token (its routes and the next
    tokens'; the first after `position` tokens), and the summed GPU and host expert work. `per_route`: a bucket
    step (bucket_pass: each hot route reads its expert on a GPU); else split-route's reads (each distinct hot
    expert once, split_pass). Cold routes run on the host over their distinct experts. `eager`: dispatched op by
    op (an eager prefill). `fixed_shape`: attention reads the step's buffers' rows (first_parts)."""
    T, L, k = ids.shape
    grouped = np.sort(_group_ids(ids, size), axis=2)                     # [T, L, m]
    m = grouped.shape[2]
    hot = resident_hits(gpu, grouped)                                     # [T, L, m]
    first = np.ones_like(hot)
    first[:, :, 1:] = grouped[:, :, 1:] != grouped[:, :, :-1]            # first of its id in the group
    hot_r, hot_d = hot.sum(axis=2), (hot & first).sum(axis=2)             # [T, L]
    cold_r, cold_d = m - hot_r, (~hot & first).sum(axis=2)
    reads = hot_d if (cost.hw.cpu_only or not per_route) else hot_r
    threads = cost.decode_pool_threads if size <= 2 else None   # a 2-token verify is a decode-sized call
    gtab = np.array([[cost.gpu_experts_time(d, r, threads) for r in range(m + 1)] for d in range(m + 1)])
    ctab = np.array([[cost.cpu_experts_time(size, d, r, threads) for r in range(m + 1)] for d in range(m + 1)])
    att = run_first_parts(cost, size, position, T, fixed_shape)          # [T, L]
    shared = np.array([cost.shared_expert_time(l, size) for l in range(L)])  # [L]
    g, c = gtab[reads, hot_r], ctab[cold_d, cold_r]                       # [T, L]
    layers = att + ((shared[None] + g + c) if cost.hw.cpu_only else np.maximum(shared[None] + g, c))
    ops = EAGER_STEP_OPS_PER_LAYER if per_route else None  # a fixed-shape step's own ops, when eager
    steps = cost.forward_time(layers.sum(axis=1), size, not eager, eager if eager else cost.decode_is_eager(), ops)
    return np.asarray(steps, dtype=float), float(g.sum()), float(c.sum())


def speculative_decode(cost: CostModel, gpu: np.ndarray, ids: np.ndarray, acceptance: float, draft_s: float,
                       verify: tuple[bool, bool], depth: int = 1, rerun: bool = True, eager: bool | None = None,
                       position: int = 0, fixed_shape: bool = False) -> tuple[np.ndarray, Forward]:
    """Decode steps with MTP speculation (cost_model.speculative_step) on a fixed GPU-resident set: a step at
    token t drafts `depth` tokens (draft_s each), verifies depth + 1 tokens (t's routes and the next ones':
    verify_steps with `verify` = (per_route, eager)) and, with `rerun`, runs t alone again on a rejection
    (static_decode's step). Each token is charged its expected share, step / tokens per step, so a turn's
    decode is its tokens over the speculative rate; the first entry of the returned seconds is a whole step
    (the wait after a tool output waits for it). Deterministic: acceptance is priced by expectation. The first
    token comes after `position` tokens; `fixed_shape`: the steps read their buffers' rows (Ostinato's)."""
    plain, pf = static_decode(cost, gpu, ids, eager, position, fixed_shape)
    v, vg, vc = verify_steps(cost, gpu, ids, depth + 1, *verify, position=position, fixed_shape=fixed_shape)
    first = speculative_step(acceptance, draft_s, float(v[0]), float(plain[0]), depth, rerun)
    again = (1.0 - float(acceptance)) if rerun else 0.0                   # speculative_step's re-run weight
    share = (first.draft_s + v + again * plain) / first.tokens            # [T]: each step over its tokens
    out = share.copy()
    out[0] = first.seconds
    return out, Forward(float(share.sum()), (vg + again * pf.gpu_experts_s) / first.tokens,
                        (vc + again * pf.cpu_experts_s) / first.tokens, 0.0, "speculative")
