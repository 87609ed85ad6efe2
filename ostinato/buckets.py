"""How a short prefill splits into the plan's bucket steps: the one rule the compiler prices and the runtime runs."""

from __future__ import annotations


def bucket_pieces(n: int, buckets: list[int]) -> list[int]:
    """Token counts of the steps that prefill n tokens, largest first: greedy over `buckets` + [1] (the
    decode step), so with power-of-two buckets each size is used at most once (120 = 64 + 32 + 16 + 8)."""
    sizes, pieces = sorted(set(buckets) | {1}, reverse=True), []
    for size in sizes:
        while n >= size:
            pieces.append(size)
            n -= size
    return pieces
