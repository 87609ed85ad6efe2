"""Re-placement during tool time, modeled (issue #31): Ostinato moving its hot set toward a session's routing
while the agent's tool runs, against its fixed plan and KTransformers' dynamic expert update, on sessions
whose routing drifts from the profile as much as published (trace.DriftSampler) and on sessions that do not.

The rule is the engine's own: after each turn, ostinato.adaptation.choose_swaps over the session's decayed
route counts (the routes the trace says the turn's prefill and decode used) against the plan's hot set, one
for one in each layer's hot pool (no new memory); the swapped experts are resident from the next turn on.
The uploads of an idle period are capped by what the link moves in it: the hardware spec's link h2d
bandwidth x the idle time (one GPU's link: the conservative case; the engine may spread them over every
GPU's copy stream), and by the policy's own max_experts and max_bytes.

ASSUMPTION (the workload, plans/workloads/agent_turns.csv, has no tool durations): the agent's tool runs
IDLE_S seconds (ostinato/adaptation.py: the compiler's default budget too) between two turns, every turn
alike. 1 s is the order of a shell command of a coding agent (grep, sed, a file read, a short test run in a
container) and of an API call of a customer-service agent plus its framework's round trip; with the
defaults the budget binds on max_experts (1221 experts, 16.3 GB, 0.65 s over one 25 GB/s link) from about
0.65 s on, so any idle above that models the same.
"""

from __future__ import annotations

import numpy as np

from ostinato.adaptation import IDLE_S, AdaptPolicy, choose_swaps, default_policy
from ostinato.compiler.cost_model import CostModel
from ostinato.workload import SessionShape

from .ktransformers import KTransformers, KTransformersDynamic
from .ostinato_policy import Ostinato
from .policy import Forward, Policy
from .replay import SessionTime, simulate
from .trace import PUBLISHED_JACCARD, DriftSampler, calibrate_drift, counts_of, median_jaccard

FROM_TURN = 3      # the turns the tables summarize: from the fourth call of a session on (after 3 idle periods)
WITH = "Ostinato + re-placement during tool time"
WITHOUT = "Ostinato without re-placement (the plan's hot set all session)"
KT_FREQUENCY = "KTransformers + frequency GPU experts"
KT_DYNAMIC = "KTransformers + frequency GPU experts + dynamic expert update"


def default_adapt(hot: np.ndarray, bytes_per_s: float, idle_s: float = IDLE_S) -> AdaptPolicy:
    """The compiler's policy.adapt (ostinato.adaptation.default_policy, mode idle) for this hot set and link:
    at most a quarter of the plan's hot experts and what the link moves in the idle time per idle period, the
    session's counts halved each turn, blended half and half with the plan's hot set, a swap taken only for a
    gain of at least 0.2% of a layer's routes."""
    return default_policy("idle", int(hot.sum()), 1, bytes_per_s, idle_s)


class AdaptiveOstinato(Ostinato):
    """Ostinato whose hot set follows the session: after each turn, choose_swaps (ostinato/adaptation.py) over
    the session's decayed route counts, within the idle period's upload budget (min of the policy's max_bytes
    and the link's bytes in idle_s). `moves`: the experts swapped in each idle period of every session replayed."""

    def __init__(self, cost: CostModel, hot: np.ndarray, threshold: int | None, buckets: list[int],
                 adapt: AdaptPolicy, name: str = WITH, shard_threshold: int | None = None):
        super().__init__(cost, hot.copy(), threshold, buckets, name=name, shard_threshold=shard_threshold)
        self.planned = hot.copy()
        self.adapt = adapt
        self.link_bytes_per_s = cost.hw.link.h2d_bandwidth
        self.moves: list[int] = []   # experts swapped per idle period, every session replayed so far
        self.reset()

    def reset(self) -> None:
        self.hot = self.planned.copy()
        self.session = np.zeros(self.planned.shape)

    def prefill(self, counts: np.ndarray, n: int, position: int = 0, prompt: int | None = None) -> Forward:
        self.session += counts
        return super().prefill(counts, n, position, prompt)

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        self.session += counts_of(ids, self.planned.shape[1])
        return super().decode(ids, position)

    def budget(self, idle_s: float) -> AdaptPolicy:
        """The policy with max_bytes capped by what the link moves in idle_s."""
        return self.adapt.model_copy(update={"max_bytes": min(self.adapt.max_bytes,
                                                              int(self.link_bytes_per_s * idle_s))})

    def end_turn(self, idle_s: float) -> None:
        swaps = choose_swaps(self.hot, self.session, self.planned, self.budget(idle_s), self.cost.expert_bytes)
        hot = self.hot.copy()
        for s in swaps:
            hot[s.layer, s.promote], hot[s.layer, s.evict] = True, False
        self.hot = hot
        self.moves.append(len(swaps))
        self.session *= self.adapt.decay


def replacement_policies(world, adapt: AdaptPolicy | None = None, idle_s: float = IDLE_S) -> list[Policy]:
    """Ostinato with and without re-placement, KTransformers at its best (frequency GPU experts in the same
    GPU memory, its best threshold) without and with its dynamic expert update."""
    b = world.build
    adapt = adapt or default_adapt(world.hot, b.hardware.link.h2d_bandwidth, idle_s)
    kt_gpu, kt_threshold = world.kt_at_best
    kt = world.kernel("kt-kernel")
    # the tables' KTransformers at its best is this very system: shared, a replay of both prices it once
    frequency = world.kt_frequency if world.kt_frequency.name == KT_FREQUENCY else KTransformers(
        world.cost, kt_threshold, kt_gpu, kt, name=KT_FREQUENCY)
    return [AdaptiveOstinato(world.cost, world.hot, b.threshold, b.buckets, adapt, shard_threshold=b.shard_threshold),
            Ostinato(world.cost, world.hot, b.threshold, b.buckets, name=WITHOUT, shard_threshold=b.shard_threshold),
            frequency,
            KTransformersDynamic(world.cost, kt_threshold, kt_gpu, kt, name=KT_DYNAMIC)]


def later(runs: list[SessionTime], from_turn: int = FROM_TURN):
    return [t for s in runs for t in s.turns[from_turn:]]


def hot_share(runs: list[SessionTime], from_turn: int = FROM_TURN) -> float:
    turns = later(runs, from_turn)
    routes = sum(t.routes for t in turns)
    return sum(t.hot_routes for t in turns) / routes if routes else float("nan")


def median_wait(runs: list[SessionTime], from_turn: int = FROM_TURN) -> float:
    waits = [t.wait_s for t in later(runs, from_turn)]
    return float(np.median(waits)) if waits else float("nan")   # nan: sessions too short to have such turns


def p90_wait(runs: list[SessionTime], from_turn: int = FROM_TURN) -> float:
    waits = [t.wait_s for t in later(runs, from_turn)]
    return float(np.percentile(waits, 90)) if waits else float("nan")


def replay(world, sessions: list[SessionShape], weight: float, seed: int = 0, idle_s: float = IDLE_S,
           adapt: AdaptPolicy | None = None) -> tuple[dict[str, list[SessionTime]], list[Policy]]:
    """The replacement_policies' runs of `sessions` routed with drift `weight`; the policies (for their logs)."""
    policies = replacement_policies(world, adapt, idle_s)
    sampler = DriftSampler(world.shares, world.build.config.num_experts_per_tok, weight, seed)
    return simulate(sessions, policies, sampler, idle_s=idle_s), policies


def study(world, groups: dict[str, list[SessionShape]], seed: int = 0, idle_s: float = IDLE_S,
          adapt: AdaptPolicy | None = None, known: dict | None = None) -> dict:
    """Per workload and drift (as published, none): each system's runs, the experts moved per idle period and
    the sessions replayed; the calibrated weight and its overlap. `known`: workload -> (runs, moves) of the
    no-drift replay where another replay already made them (bench.workload_runs: the same trace)."""
    weight = calibrate_drift(world.shares, PUBLISHED_JACCARD, seed)
    out = {"_weight": weight, "_jaccard": median_jaccard(world.shares, weight, seed), "_idle_s": idle_s}
    for w, ss in groups.items():
        for drift, wt in (("as published", weight), ("none", 0.0)):
            if wt == 0 and known and w in known:
                runs, moves = known[w]
            else:
                runs, policies = replay(world, ss, wt, seed, idle_s, adapt)
                moves = list(policies[0].moves)
            out[(w, drift)] = (runs, moves, len(ss))
    return out


def tables(result: dict, hardware: str) -> tuple[str, str]:
    """The doc's tables (per workload and drift) and README's lines (the ratio of median waits per workload)."""
    text, lines = [], []
    for (w, drift), (runs, moves, sessions) in ((k, v) for k, v in result.items() if not isinstance(k, str)):
        base = median_wait(runs[WITHOUT])
        title = (f"#### re-placement, {w}: {sessions} sessions, {hardware}, session drift {drift}, turns >= "
                 f"{FROM_TURN} (modeled)")
        rows = [title, "", "| system | hot share of routes | median wait s | p90 wait s | wait / without | "
                "experts moved per idle period |", "|---|---|---|---|---|---|"]
        for name, r in runs.items():
            moved = f"{np.mean(moves):.0f}" if name == WITH and moves else "-"
            rows.append(f"| {name} | {hot_share(r):.1%} | {median_wait(r):.3f} | {p90_wait(r):.3f} | "
                        f"{median_wait(r) / base:.2f}x | {moved} |")
        text.append("\n".join(rows))
        on, off = runs[WITH], runs[WITHOUT]
        lines.append(f"| {w} | {drift} | {hot_share(off):.1%} -> {hot_share(on):.1%} | "
                     f"{median_wait(off):.3f} -> {median_wait(on):.3f} | {median_wait(off) / median_wait(on):.2f}x |")
    head = (f"Drift as published: each session routed by a law of its own, mixing weight {result['_weight']:.3f} "
            f"(median Jaccard {result['_jaccard']:.3f} of 5 sessions' top-500 hot sets; 0.08 published). Tool "
            f"time {result['_idle_s']:g} s between turns (an assumption: the workload has no tool durations).")
    readme = [f"| workload | session drift | hot share, turns >= {FROM_TURN}: without -> with re-placement | "
              "median wait s: without -> with | wait without / with |", "|---|---|---|---|---|"] + lines
    return head + "\n\n" + "\n\n".join(text), "\n".join(readme)
