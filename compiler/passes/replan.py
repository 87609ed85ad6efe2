"""replan: the memory pass reserved the graph pool for the largest bucket the cost model might keep, and the
sharded upload's slices wherever uploads can be sharded; when it kept smaller buckets, or sharding does not pay
(no policy.shard_threshold), the plan is placed again without what it does not use (more room for hot experts)
and buckets at most as large. Once: the new placement only lowers the prefill times."""

from __future__ import annotations

from .build import Build


def replan(b: Build) -> str | None:
    """-> why the placement passes run again (compile.py's re-plan loop), or None: the reserves were right."""
    why = []
    chosen = max(b.buckets, default=0)
    if chosen < b.bucket_reserve:
        b.bucket_reserve = chosen
        why.append(f"(bucket reserve {b.bucket_reserve} tokens)")
    if b.slice_reserve and b.shard_threshold is None:
        b.slice_reserve = False
        why.append("(no slice staging: sharded uploads do not pay)")
    return " ".join(why) or None
