"""replan: the memory pass reserved the graph pool for the largest bucket the cost model might keep; when it
kept smaller ones, the plan is placed again with that reserve (more room for hot experts) and buckets at most
as large. Once: the new placement only lowers the prefill times."""

from __future__ import annotations

from .build import Build


def replan(b: Build) -> str | None:
    """-> why the placement passes run again (compile.py's re-plan loop), or None: the reserve was right."""
    chosen = max(b.buckets, default=0)
    if chosen >= b.bucket_reserve:
        return None
    b.bucket_reserve = chosen
    return f"(bucket reserve {b.bucket_reserve} tokens)"
