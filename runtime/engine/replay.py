"""Replay an agent session on the engine and measure what the agent waits for, turn by turn.

The wait after a tool output is the prefill of the appended tokens plus the first decode step
(workload README). Each turn also reports its decode speed, the share of routes that hit the hot
set, and the distinct cold experts its prefill touched (summed over layers); the plan's prediction
for a prefill of that size sits beside the measurement.

Agent-scale sessions (plans/workloads/agent_scale.csv) start their measured turns at an agent's position:
a shape from SessionShape.starting_at carries the calls before as a cached prefix, prefilled once before
the first turn and not counted as one. Their idle times (idle_before_s: the tool's latency, or a human's
wait) are honoured before each call, scaled by `idle_scale` (0: none), because the engine acts on them:
the re-placement the previous turn started (policy.adapt) uploads while the agent's tool runs, and what
has not landed when the call comes is computed cold.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ostinato.plan import Plan
from ostinato.workload import SessionShape, TokenSource

from ..kernels.argmax import argmax
from .greedy import greedy_tokens
from .loader import Engine


@dataclass(frozen=True)
class TurnResult:
    turn: int
    appended: int
    generated: int
    mode: str
    wait_s: float
    decode_tokens_per_s: float | None
    hot_share: float
    distinct_cold: int
    predicted_wait_s: float | None
    drafted: int = 0                     # MTP drafts verified in the turn (speculative engines)
    accepted: int = 0
    swapped: int = 0                     # experts the re-placement after this turn started to swap (policy.adapt)
    idle_s: float = 0.0                  # seconds the replay sat idle before the call (idle_before_s x idle_scale)


def predicted_wait(plan: Plan, tokens: int) -> float | None:
    """The plan's predicted wait for a prefill of `tokens`, interpolated log-log in its table."""
    rows = sorted((r.tokens, r.wait_ms) for r in plan.predictions.prefill)
    if not rows or tokens <= 0:
        return None
    xs = np.log([r[0] for r in rows])
    ys = np.log([r[1] for r in rows])
    return float(math.exp(np.interp(math.log(tokens), xs, ys, left=None, right=None))) / 1e3


def replay(engine: Engine, shape: SessionShape, tokens: TokenSource, on_turn=None, idle_scale: float = 1.0,
           on_prefix=None, sleep=time.sleep) -> list[TurnResult]:
    """The session's turns, each measured (TurnResult); `on_turn(result)` as each ends. A shape's cached prefix
    (SessionShape.prefix) is prefilled first, `on_prefix(tokens, seconds)` told; each call's recorded idle time
    x `idle_scale` is slept (`sleep`) before it."""
    if idle_scale < 0:
        raise ValueError(f"idle_scale must be >= 0, got {idle_scale}")
    session = engine.new_session()
    counters = engine.executor.counters
    results, nxt = [], None
    if shape.prefix:  # its last token decoded, as the call before ended: the step for this context is built now
        start = time.perf_counter()
        ids = tokens.take(shape.prefix)
        if shape.prefix > 1:
            session.prefill(ids[:-1], last_only=True)
        nxt = argmax(session.decode(int(ids[-1])))
        if on_prefix is not None:
            on_prefix(shape.prefix, time.perf_counter() - start)
        if engine.adapter is not None:  # the call before the first replayed one has ended: its idle period begins
            engine.adapter.after_turn(session.routes)
    for i, turn in enumerate(shape.turns):
        idle = (turn.idle_before_s or 0.0) * idle_scale
        if idle > 0:  # the agent's tool (or its human): the uploads the last turn's re-placement started go on
            sleep(idle)
        before = counters.copy()
        drafts_before = session.drafted, session.accepted
        start = time.perf_counter()
        mode = "none"
        if turn.appended:
            mode = session.prefill_mode(turn.appended, last_only=True)
            logits = session.prefill(tokens.take(turn.appended), last_only=True)
            nxt = argmax(logits[-1])
        prefill = counters.minus(before)
        wait, speed = 0.0, None
        if nxt is not None and turn.generated:
            logits = session.decode(nxt)
            nxt = argmax(logits)
            wait = time.perf_counter() - start
            t0 = time.perf_counter()
            gen = greedy_tokens(session, nxt, turn.generated - 1)  # speculative when the plan says
            if turn.generated > 1:
                speed = (turn.generated - 1) / (time.perf_counter() - t0)
            nxt = gen[-1]
        else:
            wait = time.perf_counter() - start
        turn_counters = counters.minus(before)
        swaps = engine.adapter.after_turn(session.routes) if engine.adapter is not None else []
        result = TurnResult(shape.first + i, turn.appended, turn.generated, mode, wait, speed, turn_counters.hot_share,
                            prefill.distinct_cold, predicted_wait(engine.plan, turn.appended),
                            session.drafted - drafts_before[0], session.accepted - drafts_before[1], len(swaps),
                            idle)
        results.append(result)
        if on_turn is not None:
            on_turn(result)
    return results


HEADER = (f"{'turn':>4s} {'append':>6s} {'gen':>5s} {'mode':>6s} {'wait ms':>9s} {'pred ms':>9s} "
          f"{'dec tok/s':>9s} {'hot':>6s} {'cold experts':>12s} {'swaps':>5s}")


def format_turn(r: TurnResult) -> str:
    pred = f"{r.predicted_wait_s * 1e3:9.1f}" if r.predicted_wait_s is not None else f"{'-':>9s}"
    speed = f"{r.decode_tokens_per_s:9.1f}" if r.decode_tokens_per_s is not None else f"{'-':>9s}"
    return (f"{r.turn:4d} {r.appended:6d} {r.generated:5d} {r.mode:>6s} {r.wait_s * 1e3:9.1f} {pred} {speed} "
            f"{r.hot_share:6.1%} {r.distinct_cold:12d} {r.swapped:5d}")


def summary(results: list[TurnResult], plan: Plan, session_s: float) -> str:
    """The replay's closing lines; `session_s`: its wall time, idle periods included (said apart)."""
    later = [r for r in results if r.turn] or results  # call 0's prompt is the session's start, not a tool output
    waits = np.array([r.wait_s for r in later]) * 1e3
    predicted_waits = [r.predicted_wait_s * 1e3 for r in later if r.predicted_wait_s is not None]
    modeled = f" (plan predicts median {np.median(predicted_waits):.1f} ms)" if predicted_waits else ""
    speeds = [r.decode_tokens_per_s for r in results if r.decode_tokens_per_s]
    p = plan.predictions
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    predicted = f"plan predicts {p.decode_tokens_per_s:.1f}"
    if drafted:  # a speculative engine: its prediction assumes an acceptance; say what this replay saw
        s = p.speculative
        spec = "" if s.decode_tokens_per_s is None else \
            f" plain, {s.decode_tokens_per_s:.1f} with MTP speculation at {s.acceptance:.0%} acceptance"
        predicted += f"{spec}; {drafted} drafts, {accepted / drafted:.0%} accepted"
    return "\n".join([
        f"wait after tool output (turns after the first): median {np.median(waits):.1f} ms, "
        f"p90 {np.percentile(waits, 90):.1f} ms{modeled}",
        f"decode: median {np.median(speeds) if speeds else float('nan'):.1f} tokens/s ({predicted})",
        f"session time: {session_s:.2f} s over {len(results)} turns"
        + (f" ({idle:.2f} s of it idle, as the workload records)" if (idle := sum(r.idle_s for r in results)) else ""),
        f"distinct cold experts per prefill (summed over layers): median "
        f"{np.median([r.distinct_cold for r in later]):.0f} over the turns after the first",
        f"hot route share: plan (profiled) {p.hot_route_share:.1%}, measured "
        f"{np.mean([r.hot_share for r in results]):.1%} (mean over turns)"] + ([
            f"re-placement between turns (policy.adapt): {sum(r.swapped for r in results)} swaps started; "
            f"hot share of the first turn {results[0].hot_share:.1%}, of the last {results[-1].hot_share:.1%}"]
            if any(r.swapped for r in results) else []))
