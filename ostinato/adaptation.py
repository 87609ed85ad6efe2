"""Re-placement during tool time: which cold experts a session promotes and which hot ones it evicts.

The plan's hot set is chosen once, from a routing profile; an agent session stays on one task for many
turns, and its routing may drift from the profile's. After each turn the engine blends the session's
own routes (decayed: `decay` per turn) with the plan's choice and swaps, per layer, cold experts for hot
ones where the blend says the swap raises the layer's share of routes on hot experts by at least
`min_gain`, most gain first, within `max_experts` uploads (and `max_bytes`) per idle period. A swap is
one for one in the layer's hot pool: no new memory. The compiler sizes `max_bytes` for the idle periods
the plan's workloads record (idle_budget_s: agent_scale.csv's tool latencies and human waits), else for
an assumed IDLE_S.

Blend, per layer (shares of the layer's routes, [E]):
    b = (1 - prior) * session / session.sum() + prior * planned / planned.sum()
where `planned` is 1 on the plan's hot set (the profile's choice; the plan keeps no per-expert counts)
and 0 elsewhere. Gain of promoting c over evicting h: b[c] - b[h]. The engine (runtime/engine/adapter.py)
and the simulator (bench/simulator) both call `choose_swaps`.

Legend: L layers, E experts per layer.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from .validation import Bytes, Count, Record, Share


class AdaptPolicy(Record):
    mode: Literal["off", "idle"]   # idle: re-place between turns, while the agent's tool runs
    max_experts: Count             # experts uploaded per idle period, all layers together
    max_bytes: Bytes               # bytes uploaded per idle period (binds when smaller than max_experts')
    decay: Share                   # the session's route counts are multiplied by this after each turn
    prior: Share                   # weight of the plan's hot set in the blend (1: never swap for the session)
    min_gain: Share                # least rise of a layer's expected hot share a swap must bring


# The compiler's defaults (ostinato-compile --adapt): design choices, stated here, not fitted to a result.
IDLE_S = 1.0          # tool time assumed between two turns where no workload the plan is priced on records one
                      # (agent_turns.csv records none; agent_scale.csv does: idle_budget_s); an agent's tool call
                      # (a test run, a search, an API call) takes seconds, so one second of the link is a floor
IDLE_QUANTILE = 0.5   # with recorded idle periods, the budget is the link's bytes in their median: half the idle
                      # periods end after the swaps' uploads have landed. An upload still running when the next call
                      # comes costs little (its evicted expert is computed cold until it lands) but starts no new
                      # swap, so a budget fitted to the longest periods would leave most of them half used
BUDGET_SHARE = 0.25   # at most a quarter of the plan's hot experts change in one idle period
DECAY = 0.5           # a turn's routes weigh half as much at the next turn's end
PRIOR = 0.5           # the plan's choice and the session's own routes weigh alike
MIN_GAIN = 0.002      # a swap must move at least 0.2% of its layer's expected routes onto hot experts


def default_policy(mode: str, hot_experts: int, expert_bytes: int, h2d_bandwidth: float,
                   idle_s: float = IDLE_S) -> AdaptPolicy:
    """The plan's policy.adapt: `mode` (off / idle), a quarter of its `hot_experts` and `idle_s` of the link
    per idle period (at least one expert), the blend above."""
    return AdaptPolicy(mode=mode, max_experts=max(1, int(hot_experts * BUDGET_SHARE)),
                       max_bytes=max(expert_bytes, int(h2d_bandwidth * idle_s)), decay=DECAY, prior=PRIOR,
                       min_gain=MIN_GAIN)


def idle_budget_s(recorded: dict[str, np.ndarray]) -> tuple[float, str]:
    """The idle seconds a plan's re-placement budget is sized for, and where they come from: the IDLE_QUANTILE
    of the idle periods the workloads record ({workload name: [I] seconds}; every workload weighs the same,
    whatever its number of periods: each period weighs 1 / its workload's count), else IDLE_S. The lower
    value where the quantile falls between two: deterministic, and one of the recorded periods."""
    recorded = {name: np.asarray(v, dtype=np.float64) for name, v in recorded.items() if len(v)}
    if not recorded:
        return IDLE_S, f"{IDLE_S:g} s assumed (no workload records its idle times)"
    values = np.concatenate(list(recorded.values()))
    weights = np.concatenate([np.full(len(v), 1.0 / len(v)) for v in recorded.values()])
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    at = int(np.searchsorted(cumulative, IDLE_QUANTILE * cumulative[-1] - 1e-12))
    idle = float(values[order][at])
    listed = list(recorded)
    names = listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1]
    return idle, (f"{idle:.3g} s: the median of the {len(values):,d} idle periods {names} "
                  f"record{'s' if len(recorded) == 1 else ''}")


class Swap(NamedTuple):
    layer: int
    promote: int   # a cold expert that becomes hot
    evict: int     # the hot expert whose pool slot it takes
    gain: float    # the layer's expected hot share gained (blend units)


def blend(session: np.ndarray, planned: np.ndarray, prior: float) -> np.ndarray:
    """[L, E] session counts and [L, E] planned hot mask -> [L, E] blended shares (see the module docstring)."""
    s = session.astype(np.float64)
    total = s.sum(axis=1, keepdims=True)
    own = np.divide(s, total, out=np.zeros_like(s), where=total > 0)
    p = planned.astype(np.float64)
    ptotal = p.sum(axis=1, keepdims=True)
    plan = np.divide(p, ptotal, out=np.zeros_like(p), where=ptotal > 0)
    return (1.0 - prior) * own + prior * plan


def choose_swaps(hot: np.ndarray, session: np.ndarray, planned: np.ndarray, policy: AdaptPolicy,
                 expert_bytes: int) -> list[Swap]:
    """The swaps of one idle period: hot [L, E] bool (the placement now), session [L, E] decayed route counts,
    planned [L, E] bool (the plan's hot set). Per layer the best cold experts are paired with the worst hot
    ones while each pair gains at least min_gain; then the pairs of all layers, most gain first, up to the
    budget (max_experts, max_bytes // expert_bytes)."""
    if policy.mode == "off":
        return []
    b = blend(session, planned, policy.prior)
    pairs: list[Swap] = []
    for layer in range(hot.shape[0]):
        h = np.flatnonzero(hot[layer])
        c = np.flatnonzero(~hot[layer])
        if not len(h) or not len(c):
            continue
        cold_best = c[np.argsort(-b[layer, c], kind="stable")]
        hot_worst = h[np.argsort(b[layer, h], kind="stable")]
        for promote, evict in zip(cold_best, hot_worst):
            gain = float(b[layer, promote] - b[layer, evict])
            if gain < policy.min_gain or gain <= 0:
                break
            pairs.append(Swap(layer, int(promote), int(evict), gain))
    budget = min(policy.max_experts, policy.max_bytes // max(1, expert_bytes))
    pairs.sort(key=lambda s: (-s.gain, s.layer, s.promote))
    return pairs[:budget]
