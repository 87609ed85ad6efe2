"""The plan's predictions (written by the plan pass): decode speed, the wait and prefill mode of typical
turns, the hot share of routes by phase, priced by the cost model at one session position."""

from __future__ import annotations

from ostinato.plan import Predictions, PrefillPrediction

from ..profile import PHASES
from .build import Build

PREDICTED_TURNS = (8, 16, 64, 120, 512, 1500, 4096, 16384)


def rounded(x: float) -> float:
    """A predicted figure as the plan writes it: 6 significant digits."""
    return float(f"{x:.6g}")


def predictions_position(b: Build) -> int:
    """The session position the plan's headline predictions are priced at: the first workload's median cached
    prefix (a tool output arrives on a conversation that long; the cost model prices attention there), 0 when the
    plan is priced on no workload."""
    return b.workloads[0].median_cached if b.workloads else 0


def predictions(b: Build) -> Predictions:
    c, t, s, at = b.cost, b.threshold, b.shard_threshold, predictions_position(b)
    decode = c.decode_step(at)
    turns = []
    for n in PREDICTED_TURNS:
        split, upload = c.split_prefill(n, at), c.upload_prefill(n, at)
        sharded = c.sharded_prefill(n, at) if s is not None else None
        bucket = c.bucket_prefill(n, b.buckets, at) if b.buckets and n <= b.buckets[-1] else None
        mode = "bucket" if bucket is not None else c.eager_mode(n, t, s)
        wait = c.prefill(n, t, b.buckets, at, s) + c.decode_step(at + n)
        turns.append(PrefillPrediction(tokens=n, mode=mode, bucket_ms=None if bucket is None else rounded(bucket * 1e3),
                                       split_ms=rounded(split * 1e3), upload_ms=rounded(upload * 1e3),
                                       sharded_ms=None if sharded is None else rounded(sharded * 1e3),
                                       wait_ms=rounded(wait * 1e3)))
    shares = {}
    for phase in PHASES:
        counts = b.profile.phase_counts((phase,))
        total = int(counts.sum())
        covered = sum(int(counts[l][list(h)].sum()) for l, h in enumerate(b.placement.hot) if h)
        shares[phase] = rounded(covered / total) if total else None
    return Predictions(hot_route_share=rounded(c.hot_share()), hot_route_share_by_phase=shares,
                       decode_ms_per_token=rounded(decode * 1e3), decode_tokens_per_s=rounded(1.0 / decode),
                       wait_after_tool_output_120_tokens_ms=next(x.wait_ms for x in turns if x.tokens == 120),
                       prefill=turns, speculative=b.speculative)
