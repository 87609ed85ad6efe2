"""Replay sessions turn by turn under several policies at once, on one shared routing trace.

Turn t (workload README): prefill `appended` tokens on top of the cached context, then decode
`generated` tokens. The wait after a tool output is that prefill plus the first decode step. All
policies see the same sampled routing of every pass (lockstep), so their differences are theirs.
A system without a prefix cache (Policy.reuses_prefix False) prefills the whole context every turn:
its extra tokens are routed by a second sampler, so the shared trace does not depend on which
systems run. Each system cuts a prefill into forwards of its own prefill chunk (Policy.prefill_chunk: the plan's
for Ostinato, SGLang's --chunked-prefill-size for KTransformers, llama.cpp's physical batch), the last one
shorter; the routing is drawn once per piece of ROUTING_GRAIN tokens (cut also at any system's chunk that is not
a multiple of it) and each forward gets the sum of its pieces, so every system routes the same tokens alike and
the draw does not depend on which systems run. The system prices the prompt from its forwards
(Policy.prefill_prompt: Ostinato runs every chunk in the mode of the whole prompt). Every forward is priced at
its position (Policy.prefill, Policy.decode): a turn's prefill after the context so far (0 for a system that
prefills it all again: its chunks one after another from there), its decode steps after the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.workload import SessionShape

from .policy import Forward, Policy, resident_hits
from .trace import TraceSampler


@dataclass(frozen=True)
class TurnTime:
    appended: int
    generated: int
    prefill: Forward
    decode: Forward              # all decode steps of the turn summed
    wait_s: float                # prefill + first decode step
    hot_routes: int = 0          # routes to the system's resident set (Policy.resident; 0 without one)
    routes: int = 0              # all routes of the turn (prefill and decode), when the system has a resident set

    @property
    def hot_share(self) -> float:
        return self.hot_routes / self.routes if self.routes else float("nan")

    @property
    def seconds(self) -> float:
        return self.prefill.seconds + self.decode.seconds


@dataclass(frozen=True)
class SessionTime:
    name: str
    turns: tuple[TurnTime, ...]

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.turns)


# The routing's draw unit: llama.cpp's physical batch (llamacpp.N_UBATCH), the smallest system's chunk; every
# system's chunk (512, 2,048, 4,096) is a multiple of it, so the pieces are the same whichever systems run.
ROUTING_GRAIN = 512


def chunks(n: int, chunk: int) -> list[int]:
    """A prefill of n tokens as the engines run it: forwards of `chunk` tokens, the last one shorter."""
    return [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])


def pieces(n: int, sizes: set[int]) -> list[int]:
    """n tokens cut at every multiple of each of `sizes` (ROUTING_GRAIN and every system's chunk): the pieces whose
    sums are each system's chunks."""
    cuts = sorted({c for size in sizes for c in range(size, n, size)} | {n}) if n else []
    return [int(t) for t in np.diff([0] + cuts)]


def chunk_counts(piece_counts: list[tuple[np.ndarray, int]], chunk: int) -> list[tuple[np.ndarray, int]]:
    """The forwards of `chunk` tokens (chunks()) made of consecutive pieces [(counts [L, E], tokens)] cut at its
    multiples among others: each forward's counts the sum of its pieces'."""
    out, at = [], 0
    for n in chunks(sum(t for _, t in piece_counts), chunk):
        take, t = [], 0
        while t < n:
            take.append(piece_counts[at][0])
            t += piece_counts[at][1]
            at += 1
        if t != n:
            raise ValueError(f"pieces of {[t for _, t in piece_counts]} tokens do not add up to chunks of {chunk}")
        out.append((take[0] if len(take) == 1 else np.sum(take, axis=0), n))
    return out


def chunked_prefill(p: Policy, passes: list[tuple[np.ndarray, int]], position: int = 0) -> Forward:
    """One prefill as p runs it over its chunks' routing counts (Policy.prefill_prompt): the first chunk after
    `position` tokens already in the session (0: a fresh one), each after the chunks before it."""
    return p.prefill_prompt(passes, position)


def simulate(sessions: list[SessionShape], policies: list[Policy], sampler: TraceSampler,
             chunk: int | None = None, idle_s: float = 0.0) -> dict[str, list[SessionTime]]:
    """`chunk`: every system's prefill chunk (default: each system's own, Policy.prefill_chunk); `idle_s`: the
    agent's tool time between two turns (Policy.end_turn). `sampler`: a TraceSampler (one routing law for every
    session) or a DriftSampler (trace.py: a law per session)."""
    return simulate_groups(sessions, [policies], sampler, chunk, idle_s)[0]


def simulate_groups(sessions: list[SessionShape], groups: list[list[Policy]], sampler: TraceSampler,
                    chunk: int | None = None, idle_s: float = 0.0) -> list[dict[str, list[SessionTime]]]:
    """simulate() of several groups of policies (names unique within a group) in one replay: each group's
    runs are what simulate() of it alone on an equal sampler gives, since the routing drawn does not depend
    on the policies; the trace is drawn once for all of them."""
    policies = list({id(p): p for g in groups for p in g}.values())   # a policy in two groups runs once
    runs = _simulate(sessions, policies, sampler, chunk, idle_s)
    return [{p.name: runs[id(p)] for p in g} for g in groups]


def _hits(gpu: np.ndarray | None, counts: np.ndarray | None = None, ids: np.ndarray | None = None) -> int:
    """Routes of a pass (counts [L, E] or ids [T, L, k]) to the resident set gpu [L, E]."""
    if gpu is None:
        return 0
    if counts is not None:
        return int(np.dot(counts.ravel(), gpu.ravel()))   # integers: exact, and no mask copied out
    return int(resident_hits(gpu, ids).sum())


def _drawn(sampler: TraceSampler, sizes: list[int]) -> list[tuple[np.ndarray, int]]:
    """[(counts [L, E], tokens)] of consecutive pieces of `sizes` tokens: TraceSampler.counts_of_pieces, or one
    counts() each of a sampler without it (any object with counts() and ids() routes a replay)."""
    many = getattr(sampler, "counts_of_pieces", None)
    return list(zip(many(sizes) if many is not None else [sampler.counts(n) for n in sizes], sizes))


def _simulate(sessions: list[SessionShape], policies: list[Policy], sampler: TraceSampler,
              chunk: int | None, idle_s: float = 0.0) -> dict[int, list[SessionTime]]:
    """Each policy's (by id) session times."""
    size = {id(p): chunk or p.prefill_chunk for p in policies}   # [policy] its forwards' tokens
    sizes = set(size.values()) | {ROUTING_GRAIN}
    out: dict[int, list[SessionTime]] = {id(p): [] for p in policies}
    empty = Forward(0.0)
    root = sampler
    per_session = getattr(root, "for_session", None)   # a DriftSampler: a routing law per session
    shared_again = root.fork(1)   # routing of the context that prefix-less systems prefill again
    for i, s in enumerate(sessions):
        sampler, again = root, shared_again
        if per_session is not None:
            sampler = per_session(i)
            if sampler is not root.base:   # drift: the session's own law, on its own streams
                again = sampler.fork(1)
        for p in policies:
            p.reset()
        turns: dict[int, list[TurnTime]] = {id(p): [] for p in policies}
        context = 0
        for t, turn in enumerate(s.turns):
            new = _drawn(sampler, pieces(turn.appended, sizes))
            ids = sampler.ids(turn.generated) if turn.generated else None
            whole = None
            for p in policies:
                passes, at = chunk_counts(new, size[id(p)]), context
                if not p.reuses_prefix and context:
                    whole = whole or _drawn(again, pieces(context + turn.appended, sizes))
                    passes, at = chunk_counts(whole, size[id(p)]), 0
                gpu = p.resident()
                hot = sum(_hits(gpu, counts=c) for c, _ in passes) if gpu is not None else 0
                pre = chunked_prefill(p, passes, at) if passes else empty
                gpu = p.resident()   # a system may re-place during its prefill (KTransformers' dynamic update)
                if gpu is not None and ids is not None:
                    hot += _hits(gpu, ids=ids)
                after = context + turn.appended   # the first generated token's position
                steps, dec = p.decode(ids, after) if ids is not None else (np.zeros(0), empty)
                wait = pre.seconds + (steps[0] if steps.size else 0.0)
                routes = (sum(n for _, n in passes) + turn.generated) * p.k * p.L if gpu is not None else 0
                turns[id(p)].append(TurnTime(turn.appended, turn.generated, pre, dec, wait, hot, routes))
                if t + 1 < len(s.turns):
                    p.end_turn(idle_s)
            context += turn.appended + turn.generated
        for p in policies:
            out[id(p)].append(SessionTime(s.name, tuple(turns[id(p)])))
    return out


@dataclass(frozen=True)
class Summary:
    median_wait_s: float
    p90_wait_s: float
    decode_tokens_per_s: float
    median_session_s: float
    total_s: float


def summarize(runs: list[SessionTime]) -> Summary:
    """Waits of the turns after each session's first (the first prefills the initial prompt, not a tool
    output); decode rate = generated tokens / decode time over all turns."""
    waits = np.array([t.wait_s for s in runs for t in s.turns[1:]])
    gen = sum(t.generated for s in runs for t in s.turns)
    dec = sum(t.decode.seconds for s in runs for t in s.turns)
    times = np.array([s.seconds for s in runs])
    return Summary(float(np.median(waits)), float(np.percentile(waits, 90)), gen / dec if dec else float("nan"),
                   float(np.median(times)), float(times.sum()))
