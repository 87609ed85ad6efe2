"""What each of Ostinato's mechanisms buys, modeled: its plan with one mechanism removed at a time.

Every variant is the Ostinato policy on the same plan, hardware and routing traces, so a row's ratio to
the full system is that mechanism's share of the wait. Then one added: MTP speculative decoding (not in
the served default; ostinato_policy.MTP_ACCEPTANCE). The last replaces its CPU expert kernel by
kt-kernel's measured rates (kernels.py), when a measurement is given.
"""

from __future__ import annotations

import numpy as np

from .ostinato_policy import MTP_ACCEPTANCE, Ostinato
from .policy import Policy

FULL = "Ostinato (all mechanisms)"


def ablations(cost, hot: np.ndarray, threshold: int | None, buckets: list[int], kt_kernel=None,
              shard_threshold: int | None = None) -> list[Policy]:
    """The full policy first, then one variant per mechanism removed (`kt_kernel`: kt-kernel's KernelRates;
    `shard_threshold`: the plan's, uploads of longer prefills sharded over every GPU's link)."""
    none = np.zeros_like(hot)
    shard = {"shard_threshold": shard_threshold}
    kt = [] if kt_kernel is None else [Ostinato(cost.with_host_kernel(kt_kernel), hot, threshold, buckets,
                                                name="- its CPU kernel (kt-kernel's measured rates instead)", **shard)]
    sharded = [] if shard_threshold is None else [
        Ostinato(cost, hot, threshold, buckets, name="- sharded upload (every upload over its layer's one link)")]
    return [
        Ostinato(cost, hot, threshold, buckets, name=FULL, **shard),
        Ostinato(cost, none, threshold, buckets, name="- resident hot set (every routed expert cold)", **shard),
        Ostinato(cost, hot, 0, [], name="- split-route (every prefill uploads the cold experts it touches)",
                 shard_threshold=None if shard_threshold is None else 0),
        Ostinato(cost, hot, None, buckets, name="- upload-once (every prefill splits)"),
    ] + sharded + [
        Ostinato(cost, hot, threshold, buckets, decode_graphs=False,
                 name="- decode graphs (decode dispatched op by op)", **shard),
        Ostinato(cost, hot, threshold, [], name="- short-prefill graphs (no bucket steps)", **shard),
        Ostinato(cost, hot, threshold, buckets, mtp_acceptance=MTP_ACCEPTANCE,
                 name=f"+ MTP speculative decoding (depth 1, {MTP_ACCEPTANCE:.0%} acceptance)", **shard),
    ] + kt
