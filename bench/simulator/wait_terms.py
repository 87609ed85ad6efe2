"""Where a wait after a tool output goes: a turn's wait (its prefill and its first decode step, replay.py) split
into the cost model's priced terms, for Ostinato and for KTransformers at its best at the same turns.

Each term comes from the cost model's public methods that the policy itself calls (policy.py: split_pass,
upload_pass, sharded_pass, bucket_pass, static_decode), summed over layers. Where two parts run concurrently
(a layer's GPU and host sides, an upload beside the previous layer's compute, op dispatch beside the device) the
wait pays the longer one, so that side's terms are counted and the other's are not (the critical path): the
terms of a forward add up to its priced seconds, and Itemized checks that they do for every forward it prices.

The verdict (verdict_table) takes Ostinato's turns whose wait lies in a band around its 90th percentile (the
p85-p95 waits of the turns after each session's first, as replay.summarize counts them) and states each term's
mean over those turns for both systems, and its share of the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ostinato.buckets import bucket_pieces
from ostinato.compiler.cost_model import CostModel

from .ktransformers import KTransformers
from .ostinato_policy import Ostinato
from .policy import Forward, Policy, _split_sums, chunk_starts
from .replay import SessionTime, simulate, summarize
from .trace import TraceSampler

DENSE = "attention, router and dense weights before the experts (indexer's matmul included)"
INDEXER = "CSA indexer's scores past its matmul (fused on GPUs, torch's tensors on a host)"
GPU = "experts on the GPUs (shared, hot; uploaded or sliced cold ones)"
# one term for the cold experts however the system moves them, so that two ways of doing the same work compare
COLD = "cold experts: on the CPU, or their weights over the links"
HANDOFF = "hand-off to the host task"
EXCHANGE = "activations over the links (split routes; the shards' exchange)"
OVERHEAD = "head, GPU-boundary hops, graph launches"
DISPATCH = "op dispatch past the device's work"
TERMS = (DENSE, INDEXER, GPU, COLD, HANDOFF, EXCHANGE, OVERHEAD, DISPATCH)
BAND = (85.0, 95.0)   # the percentiles of Ostinato's waits around its p90 whose turns the verdict reads
TOLERANCE = 1e-9      # relative: the terms' sum against the priced seconds (float sums in another order)

Terms = dict[str, float]


def add(*parts: Terms) -> Terms:
    out: Terms = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


def total(terms: Terms) -> float:
    return float(sum(terms.values()))


def concurrent(cost: CostModel, a: Terms, b: Terms) -> Terms:
    """Two parts run at once (cost.overlap): the longer one's terms (a on a tie, as np.maximum), or both where they
    share the same cores (a cpu-only spec)."""
    if cost.hw.cpu_only:
        return add(a, b)
    return a if total(a) >= total(b) else b


# ----- a layer's pieces ------------------------------------------------------------------------------------------
def dense_terms(cost: CostModel, layer: int, n: int, position: int, step_context: int | None = None) -> Terms:
    """cost.before_experts_time on the layer's GPU, its indexer's score tensors apart: those are bytes of their own
    passes, added after the rest (cost_model.indexer_time), so they split off exactly."""
    seconds = float(cost.before_experts_time(layer, n, position, step_context=step_context))
    rows = step_context if step_context is not None else position + n   # what the dense part reads (its docstring)
    scratch = float(cost.indexer_scratch_bytes(layer, n, rows, step_context is not None)) / cost.hw.gpus.bandwidth
    return {DENSE: seconds - scratch, INDEXER: scratch}


def host_side_terms(cost: CostModel, n: int, distinct: float, routes: float, threads: int | None = None) -> Terms:
    """cost.cpu_experts_time on a pool of `threads` (None: every core): the host kernel, n tokens' activations over
    the link both ways, and the rest of it, the hand-off to the host task (what the spec resolves for the pool)."""
    seconds = cost.cpu_experts_time(n, distinct, routes, threads)
    if routes <= 0:
        return {}
    experts = cost.host_experts_time(distinct, routes, threads)
    link, act = cost.hw.link, n * cost.cfg.hidden_size * 4
    moved = 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth
    return {COLD: experts, EXCHANGE: moved, HANDOFF: seconds - experts - moved}


def forward_terms(cost: CostModel, device: Terms, n: int, decode: bool, eager: bool, ops_per_layer: int | None = None
                  ) -> Terms:
    """cost.forward_time of a forward whose layers' terms are `device`: its overheads, and the op dispatch where it
    runs eagerly (added on a cpu-only spec; on GPUs only what the host's dispatch takes past the device's work)."""
    over = float(cost.forward_overheads(n, decode))
    out = add(device, {OVERHEAD: over})
    if eager:
        host, busy = float(cost.dispatch_time(n, ops_per_layer)), total(device) + over
        if cost.hw.cpu_only:
            out = add(out, {DISPATCH: host})
        elif host > busy:
            out = add(out, {DISPATCH: host - busy})
    return out


def pipelined_terms(cost: CostModel, per: list[tuple[Terms, Terms]]) -> Terms:
    """cost.pipelined of layers' (upload, compute) terms: the first upload exposed, then each layer's compute beside
    the next layer's upload."""
    out = dict(per[0][0])
    for l, (_, compute) in enumerate(per):
        upload = per[l + 1][0] if l + 1 < len(per) else {}
        out = add(out, concurrent(cost, compute, upload))
    return out


# ----- the policies' passes (policy.py), term by term --------------------------------------------------------------
def split_terms(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, position: int) -> Terms:
    """policy.split_pass (eager)."""
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)
    layers: Terms = {}
    for l in range(counts.shape[0]):
        g = {GPU: cost.shared_expert_time(l, n) + cost.gpu_experts_time(hot_d[l], hot_r[l])}
        layers = add(layers, dense_terms(cost, l, n, position),
                     concurrent(cost, g, host_side_terms(cost, n, cold_d[l], cold_r[l])))
    return forward_terms(cost, layers, n, False, True)


def upload_terms(cost: CostModel, counts: np.ndarray, n: int, upload: np.ndarray, links: int, position: int) -> Terms:
    """policy.upload_pass (eager): `upload[l]` experts over `links` links, every route on the GPU."""
    k = cost.cfg.num_experts_per_tok
    touched, uploads = (counts > 0).sum(axis=1).tolist(), upload.sum(axis=1).tolist()
    per = []
    for l in range(counts.shape[0]):
        g = cost.shared_expert_time(l, n) + cost.gpu_experts_time(float(touched[l]), float(n * k))
        per.append(({COLD: cost.upload_time(float(uploads[l]), links=links)},
                    add(dense_terms(cost, l, n, position), {GPU: g})))
    return forward_terms(cost, pipelined_terms(cost, per), n, False, True)


def sharded_terms(cost: CostModel, counts: np.ndarray, n: int, hot: np.ndarray, position: int) -> Terms:
    """policy.sharded_pass (cost.sharded_layer with the trace's counts): the slices' weights and the exchange's
    host -> device bytes share the links; out + back on the layer's critical path."""
    G = cost.shards
    x, partial = cost.exchange_bytes(n)
    out_s, back_s = cost.exchange_time(n)
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, hot)
    per = []
    for l in range(counts.shape[0]):
        both = cost.upload_time(cold_d[l], (G - 1) * (x + partial), links=G)
        weights = cost.upload_time(cold_d[l], links=G)
        piece = cost.gpu_experts_time(cold_d[l] / G, cold_r[l] / G)
        home = cost.shared_expert_time(l, n) + cost.gpu_experts_time(hot_d[l], hot_r[l])
        side = {GPU: home + piece} if home + piece >= out_s + piece else {EXCHANGE: out_s, GPU: piece}
        per.append(({COLD: weights, EXCHANGE: both - weights},
                    add(dense_terms(cost, l, n, position), side, {EXCHANGE: back_s})))
    return forward_terms(cost, pipelined_terms(cost, per), n, False, True)


def bucket_terms(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, buckets: list[int], position: int
                 ) -> Terms:
    """policy.bucket_pass: fixed-shape steps, each reading its buffers' rows (cost.step_context)."""
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)
    out: Terms = {}
    at = position
    for T in bucket_pieces(n, buckets):
        share, context, step = T / n, cost.step_context(T, at), {}
        for l in range(counts.shape[0]):
            hot_routes, cold_routes = share * hot_r[l], share * cold_r[l]
            hot_reads = min(hot_routes, hot_d[l]) if cost.hw.cpu_only else hot_routes
            g = {GPU: cost.shared_expert_time(l, T) + cost.gpu_experts_time(hot_reads, hot_routes)}
            h = host_side_terms(cost, T, min(cold_routes, cold_d[l]), cold_routes)
            step = add(step, dense_terms(cost, l, T, at, context), concurrent(cost, g, h))
        out = add(out, forward_terms(cost, step, T, True, cost.decode_is_eager(), cost.step_ops_per_layer(T)))
        at += T
    return out


def decode_step_terms(cost: CostModel, gpu: np.ndarray, ids: np.ndarray, position: int, fixed_shape: bool,
                      eager: bool | None = None) -> Terms:
    """policy.static_decode's first step (ids [L, k], the step's routes) after `position` tokens."""
    k = ids.shape[1]
    hits = gpu[np.arange(ids.shape[0])[:, None], ids].sum(axis=1)   # [L]
    context = cost.step_context(1, position) if fixed_shape else None
    layers: Terms = {}
    threads = cost.decode_pool_threads   # a decode-sized call's pool, as static_decode prices it
    for l in range(ids.shape[0]):
        h = int(hits[l])
        g = {GPU: cost.shared_expert_time(l, 1) + cost.gpu_experts_time(h, h, threads)}
        layers = add(layers, dense_terms(cost, l, 1, position, context),
                     concurrent(cost, g, host_side_terms(cost, 1, k - h, k - h, threads)))
    ops = cost.step_ops_per_layer(1) if eager is None else None
    return forward_terms(cost, layers, 1, True, cost.decode_is_eager() if eager is None else eager, ops)


def prefill_terms(p: Policy, counts: np.ndarray, n: int, position: int, prompt: int | None = None) -> Terms:
    """The terms of p.prefill(counts, n, position), a chunk of a prompt of `prompt` tokens (None: n), by the branch
    the policy takes."""
    c = p.cost
    if isinstance(p, Ostinato):
        mode = p.mode(n if prompt is None else prompt)
        if mode == "bucket":
            return bucket_terms(c, counts, n, p.hot, p.buckets, position)
        if mode == "sharded":
            return sharded_terms(c, counts, n, p.hot, position)
        if mode == "upload":
            return upload_terms(c, counts, n, (counts > 0) & ~p.hot, 1, position)
        return split_terms(c, counts, n, p.hot, position)
    if isinstance(p, KTransformers):
        if p.layerwise(n):
            return upload_terms(c, counts, n, np.broadcast_to(~p.gpu, counts.shape), p.links, position)
        return split_terms(c, counts, n, p.gpu, position)
    raise TypeError(f"{p.name}: its prefill is not itemized (Ostinato and KTransformers are)")


def decode_terms(p: Policy, ids: np.ndarray, position: int) -> Terms:
    """The terms of the first of p.decode(ids, position)'s steps (ids [T, L, k])."""
    if isinstance(p, Ostinato) and p.mtp_acceptance is None:
        return decode_step_terms(p.cost, p.hot, ids[0], position, True, None if p.decode_graphs else True)
    if isinstance(p, KTransformers) and p.mtp is None:
        return decode_step_terms(p.cost, p.gpu, ids[0], position, False)
    raise TypeError(f"{p.name}: its decode is not itemized (plain decode of Ostinato and KTransformers is)")


# ----- a replay that keeps each turn's terms -------------------------------------------------------------------
def _check(p: Policy, terms: Terms, seconds: float, what: str) -> None:
    if abs(total(terms) - seconds) > TOLERANCE * max(1.0, abs(seconds)):
        raise AssertionError(f"{p.name}: the {what}'s terms add up to {total(terms)!r} s, the policy priced "
                             f"{seconds!r} s (wait_terms.py no longer follows policy.py)")


class Itemized(Policy):
    """A policy that prices as `inner` does and keeps, per session and turn, the terms of the turn's wait: its
    prefill forwards and its first decode step (replay.py's wait_s). Each forward's terms are checked against the
    seconds the policy priced."""

    def __init__(self, inner: Policy):
        super().__init__(inner.cost)
        self.inner, self.name = inner, inner.name
        self.reuses_prefix, self.max_running = inner.reuses_prefix, inner.max_running
        self.turns: list[list[Terms]] = []   # per session, per turn

    def reset(self) -> None:
        self.inner.reset()
        self.turns.append([{}])

    def end_turn(self, idle_s: float) -> None:
        self.inner.end_turn(idle_s)
        self.turns[-1].append({})

    def resident(self):
        return self.inner.resident()

    def prefill(self, counts: np.ndarray, n: int, position: int = 0) -> Forward:
        f = self.inner.prefill(counts, n, position)
        terms = prefill_terms(self.inner, counts, n, position)
        _check(self, terms, f.seconds, f"{n}-token prefill at {position}")
        self.turns[-1][-1] = add(self.turns[-1][-1], terms)
        return f

    @property
    def prefill_chunk(self) -> int:
        return self.inner.prefill_chunk

    def prefill_prompt(self, passes: list[tuple[np.ndarray, int]], position: int = 0) -> Forward:
        f = self.inner.prefill_prompt(passes, position)
        prompt = sum(n for _, n in passes)
        terms = add(*(prefill_terms(self.inner, counts, n, at, prompt)
                      for (counts, n), at in zip(passes, chunk_starts(passes, position))))
        _check(self, terms, f.seconds, f"{prompt}-token prompt at {position}")
        self.turns[-1][-1] = add(self.turns[-1][-1], terms)
        return f

    def decode(self, ids: np.ndarray, position: int = 0):
        steps, f = self.inner.decode(ids, position)
        terms = decode_terms(self.inner, ids, position)
        _check(self, terms, float(steps[0]), f"decode step at {position}")
        self.turns[-1][-1] = add(self.turns[-1][-1], terms)
        return steps, f


GOAL = 0.8   # issue #57: Ostinato's p90 wait at most 0.8x KTransformers' at its best


@dataclass(frozen=True)
class ModeGroup:
    """The band's turns that Ostinato ran one way (its prefill's Forward.mode: bucket, split, upload, sharded)."""
    mode: str
    turns: int
    ours_wait_s: float
    theirs_wait_s: float
    ours: Terms                     # Ostinato's mean terms on those turns


@dataclass(frozen=True)
class Breakdown:
    """Mean terms of the turns in Ostinato's p90 band, for it and the baseline at the same turns."""
    workload: str
    turns: int                      # turns in the band
    band_s: tuple[float, float]     # Ostinato's waits at BAND's percentiles
    ours: Terms = field(default_factory=dict)
    theirs: Terms = field(default_factory=dict)
    ours_wait_s: float = 0.0        # the mean priced wait of those turns (replay.py), which the terms add up to
    theirs_wait_s: float = 0.0
    p90_ratio: float = float("nan")   # Ostinato's p90 wait over the baseline's (each of its own waits: the headline's)
    by_mode: tuple[ModeGroup, ...] = ()

    def difference(self) -> Terms:
        return {t: self.ours.get(t, 0.0) - self.theirs.get(t, 0.0) for t in TERMS}

    def largest(self) -> str:
        """The term that adds the most to Ostinato's wait over the baseline's."""
        d = self.difference()
        return max(d, key=d.get)


def band_turns(runs: list[SessionTime], band: tuple[float, float] = BAND) -> tuple[list[tuple[int, int]], tuple]:
    """(session, turn) of the turns after each session's first whose wait lies within the band's percentiles of
    those turns' waits, and the two waits."""
    waits = [(s, t, turn.wait_s) for s, st in enumerate(runs) for t, turn in enumerate(st.turns) if t > 0]
    if not waits:
        raise ValueError("no turn after a session's first to read a p90 band from")
    values = np.array([w for *_, w in waits])
    lo, hi = (float(np.percentile(values, q)) for q in band)
    return [(s, t) for s, t, w in waits if lo <= w <= hi], (lo, hi)


def breakdown(workload: str, sessions, ours: Policy, theirs: Policy, sampler: TraceSampler,
              band: tuple[float, float] = BAND) -> Breakdown:
    """Replay `sessions` with the two policies itemized (the same routing as the tables' replay with an equal
    sampler: it does not depend on the policies) and read the terms of Ostinato's band turns."""
    a, b = Itemized(ours), Itemized(theirs)
    runs = simulate(sessions, [a, b], sampler)
    picked, (lo, hi) = band_turns(runs[a.name], band)

    def mean(p: Itemized, turns) -> Terms:
        return {t: float(np.mean([p.turns[s][i].get(t, 0.0) for s, i in turns])) for t in TERMS}

    def wait(name: str, turns) -> float:
        return float(np.mean([runs[name][s].turns[i].wait_s for s, i in turns]))
    modes: dict[str, list] = {}
    for s, i in picked:
        modes.setdefault(runs[a.name][s].turns[i].prefill.mode, []).append((s, i))
    by_mode = tuple(ModeGroup(m, len(ts), wait(a.name, ts), wait(b.name, ts), mean(a, ts))
                  for m, ts in sorted(modes.items()))
    ratio = summarize(runs[a.name]).p90_wait_s / summarize(runs[b.name]).p90_wait_s
    return Breakdown(workload, len(picked), (lo, hi), mean(a, picked), mean(b, picked), wait(a.name, picked),
                     wait(b.name, picked), ratio, by_mode)


def verdict_table(found: list[Breakdown], baseline: str) -> str:
    """Markdown: per workload, each term's mean ms over the band's turns for both systems, their difference and its
    share of the wait's difference; then per workload the sentences that name the largest term and, per way
    Ostinato ran those turns, its largest term against the baseline's whole wait (what the goal needs removed)."""
    lines = [f"| workload | term | Ostinato ms | {baseline} ms | difference ms | share of the difference |",
             "|---|---|---|---|---|---|"]
    sentences = []
    for b in found:
        d, gap = b.difference(), b.ours_wait_s - b.theirs_wait_s
        for t in TERMS:
            if b.ours.get(t, 0.0) == 0.0 and b.theirs.get(t, 0.0) == 0.0:
                continue
            share = f"{d[t] / gap:+.0%}" if gap else "-"
            lines.append(f"| {b.workload} | {t} | {1e3 * b.ours.get(t, 0.0):.1f} | {1e3 * b.theirs.get(t, 0.0):.1f} | "
                         f"{1e3 * d[t]:+.1f} | {share} |")
        lines.append(f"| {b.workload} | **the wait** ({b.turns} turns: Ostinato's p{BAND[0]:.0f}-p{BAND[1]:.0f} "
                     f"waits, {b.band_s[0]:.3f}-{b.band_s[1]:.3f} s) | **{1e3 * b.ours_wait_s:.1f}** | "
                     f"**{1e3 * b.theirs_wait_s:.1f}** | {1e3 * gap:+.1f} | {b.ours_wait_s / b.theirs_wait_s:.2f}x |")
        big = b.largest()
        met = "met" if b.p90_ratio <= GOAL else "not met"
        text = (f"**{b.workload}**: p90 wait {b.p90_ratio:.2f}x the baseline's (goal {GOAL}x: {met}). At the band's "
                f"turns the largest term of the difference is {big} ({1e3 * d[big]:+.1f} ms)")
        ways = []
        for p in b.by_mode:
            top = max(p.ours, key=p.ours.get)
            ways.append(f"{p.turns} {p.mode} (Ostinato {1e3 * p.ours_wait_s:.0f} ms, baseline "
                        f"{1e3 * p.theirs_wait_s:.0f} ms; Ostinato's largest term, {top}, alone "
                        f"{1e3 * p.ours[top]:.0f} ms = {p.ours[top] / p.theirs_wait_s:.2f}x the baseline's wait)")
        sentences.append(text + "; Ostinato ran them " + ", ".join(ways) + ".")
    return "\n".join(lines) + "\n\n" + "\n\n".join(sentences)
