"""buckets: the prefill buckets (short prompts run as captured steps of these sizes): the given ones, else
the cost model's choice within the memory pass's graph-pool reserve, priced on the workloads
(least_wait.py). The rule they follow is the plan schema's (checked by the policy pass)."""

from __future__ import annotations

from .build import Build
from .least_wait import least_wait


def buckets(b: Build) -> None:
    o = b.options
    if o.prefill_buckets is not None:
        b.buckets, b.buckets_from = sorted(set(o.prefill_buckets)), "--prefill-buckets"
        return
    c, t, s = b.cost, b.threshold, b.shard_threshold
    choices = [(w.name, tuple(c.choose_buckets(t, o.context, b.bucket_reserve, w.median_cached, s)))
               for w in b.workloads]
    chosen, b.buckets_from = least_wait(
        b, choices, lambda w, v, n: c.prefill(n, t, list(v), w.median_cached, s),
        lambda v, n: n <= max(v, default=0), lambda: c.choose_buckets(t, o.context, b.bucket_reserve, None, s))
    b.buckets = list(chosen)
