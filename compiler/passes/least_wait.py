"""A plan's choices priced on workloads: the value the cost model chooses at each workload's typical
position, and where those differ, the one of least predicted prefill time over all of them.

Workloads (`--workload`, by default both shipped ones: plans/workloads/agent_turns.csv, benchmark agents on
20k-token contexts, and agent_scale.csv, coding agents at TraceLab's scale, 120k-token contexts with recorded
tool and human waits). The compiler prices three choices on them, each workload weighing the same whatever
its number of calls (a workload's mean over its calls after each session's first, summed over workloads):
- the split-route/upload-once threshold (the cost_model pass): the cost model's crossover, priced at each
  workload's median cached prefix (its calls' attention reads that many positions); where those differ, the
  one of least predicted prefill time over both workloads' appends;
- the prefill buckets (the buckets pass): the cost model's choice (CostModel.choose_buckets) at each
  workload's median cached prefix, the same way;
- the re-placement budget (policy.adapt.max_bytes; the read_workloads and policy passes): the link's bytes in
  the median idle period the workloads record (ostinato/adaptation.py idle_budget_s; agent_turns.csv records
  none, so agent_scale.csv's).
Ties go to the workload given first, so a plan is a function of its inputs. The plan names each workload with
the sha256 of its file (provenance.workloads) and says in its notes which choice came from which workload
and what each workload's typical call is predicted to wait (the policy pass). `--workload none`: the choices
at the plan's context alone, the budget at adaptation.IDLE_S.
"""

from __future__ import annotations

import numpy as np

from .build import Build

PRICED_GROUPS = 8  # least_wait prices a workload's appends in this many groups of equal count


def least_wait(b: Build, candidates: list[tuple[str, object]], prefill, differs, alone):
    """One choice priced on the workloads -> (value, which workloads it comes from). `candidates`: (workload
    name, the value the cost model chooses at its median cached prefix); where they differ, the value of least
    predicted prefill time `prefill(workload, value, n)` summed over the workloads, each a mean over its calls'
    appends n (at its median cached prefix). Only the n that some value runs differently from another
    (`differs(value, n)`: upload-once, or as bucket steps) are priced, the others adding the same to every value;
    in PRICED_GROUPS groups of equal count, each priced at its middle append (a prefill's price is smooth in n:
    a few points rank the values, where every distinct n would cost a compile seconds). Ties: the earlier
    candidate. No workload: `alone()`, at the plan's context."""
    if not candidates:
        return alone(), "the plan's context (no workload)"
    values = []
    for _, v in candidates:
        if v not in values:
            values.append(v)
    if len(values) == 1:
        return values[0], " and ".join(name for name, _ in candidates)
    score = {i: 0.0 for i in range(len(values))}
    for w in b.workloads:
        sizes = [n for n in np.sort(w.appended).tolist() if n and any(differs(v, n) != differs(values[0], n)
                                                                      for v in values[1:])]
        for group in np.array_split(np.array(sizes, dtype=np.int64), min(PRICED_GROUPS, len(sizes))) if sizes else []:
            n = int(group[(len(group) - 1) // 2])
            for i, v in enumerate(values):
                score[i] += len(group) * prefill(w, v, n) / len(w.appended)
    best = min(score, key=lambda i: (score[i], i))
    return values[best], " and ".join(name for name, v in candidates if v == values[best]) + \
        f" (least predicted prefill of {', '.join(f'{name} {_said(v)}' for name, v in candidates)})"


def _said(value) -> str:
    """A candidate as the notes write it: a threshold's tokens, buckets' sizes."""
    return "split-route at any size" if value is None else f"{value:,d}" if isinstance(value, int) else \
        f"buckets {list(value)}"
