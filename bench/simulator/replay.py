"""Replay sessions turn by turn under several policies at once, on one shared routing trace.

Turn t (workload README): prefill `appended` tokens on top of the cached context, then decode
`generated` tokens. The wait after a tool output is that prefill plus the first decode step. All
policies see the same sampled routing of every pass (lockstep), so their differences are theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.workload import SessionShape

from .policy import Forward, Policy
from .trace import TraceSampler


@dataclass(frozen=True)
class TurnTime:
    appended: int
    generated: int
    prefill: Forward
    decode: Forward              # all decode steps of the turn summed
    wait_s: float                # prefill + first decode step

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


def simulate(sessions: list[SessionShape], policies: list[Policy], sampler: TraceSampler
             ) -> dict[str, list[SessionTime]]:
    out: dict[str, list[SessionTime]] = {p.name: [] for p in policies}
    empty = Forward(0.0)
    for s in sessions:
        for p in policies:
            p.reset()
        turns: dict[str, list[TurnTime]] = {p.name: [] for p in policies}
        for turn in s.turns:
            counts = sampler.counts(turn.appended) if turn.appended else None
            ids = sampler.ids(turn.generated) if turn.generated else None
            for p in policies:
                pre = p.prefill(counts, turn.appended) if counts is not None else empty
                steps, dec = p.decode(ids) if ids is not None else (np.zeros(0), empty)
                wait = pre.seconds + (steps[0] if steps.size else 0.0)
                turns[p.name].append(TurnTime(turn.appended, turn.generated, pre, dec, wait))
        for p in policies:
            out[p.name].append(SessionTime(s.name, tuple(turns[p.name])))
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
