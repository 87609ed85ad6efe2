"""How a short prefill splits into the plan's bucket steps: the one rule the compiler prices and the runtime runs."""

from __future__ import annotations

# A step's graphs are made by running it from position 0 this many times (warm-up runs, then the
# captured one), so a bucket of T tokens needs a context of at least CAPTURE_RUNS x T.
CAPTURE_RUNS = 3


def largest_bucket_for(context: int) -> int:
    """The largest bucket a context of `context` tokens can capture: CAPTURE_RUNS x T <= context."""
    return context // CAPTURE_RUNS


def bucket_rule_error(buckets: list[int], context: int) -> str | None:
    """What breaks the buckets rule, or None: ascending distinct powers of two from 2 up to
    largest_bucket_for(context). The plan schema checks it (ostinato/plan.py Policy)."""
    limit = largest_bucket_for(context)
    odd = [T for T in buckets if T < 2 or T & (T - 1)]
    if odd:
        return f"prefill bucket {odd[0]} is not a power of two >= 2"
    big = [T for T in buckets if T > limit]
    if big:
        return (f"prefill bucket {big[0]}: buckets are powers of two from 2 up to context / {CAPTURE_RUNS} "
                f"({limit}: a step's warm-up and capture take {CAPTURE_RUNS} of them)")
    if list(buckets) != sorted(set(buckets)):
        return f"prefill buckets {list(buckets)}: ascending, each once"
    return None


def bucket_pieces(n: int, buckets: list[int]) -> list[int]:
    """Token counts of the steps that prefill n tokens, largest first: greedy over `buckets` + [1] (the
    decode step), so with power-of-two buckets each size is used at most once (120 = 64 + 32 + 16 + 8)."""
    sizes, pieces = sorted(set(buckets) | {1}, reverse=True), []
    for size in sizes:
        while n >= size:
            pieces.append(size)
            n -= size
    return pieces


# CPU engines decode with steps for shorter contexts too (static_decode/step.py `within`): the step's
# attention and indexer read ceil(context / m) compressor rows, whatever the position, so a step sized to
# the plan's context reads mostly rows past the position. The contexts are the plan's divided by powers of
# DECODE_CONTEXT_FACTOR, down to DECODE_CONTEXT_SMALLEST: each costs a compile at load (cached by content),
# and a step of context C runs positions up to C, so the rows read are within DECODE_CONTEXT_FACTOR x the
# needed ones. Measured on the real-vocab preset (8,192 context), compiled engines side by side in one
# process: at ~600 tokens 11.53 ms a token with the 8,192-token step alone, 10.12 with the 2,048-token one;
# at ~300, 10.13 against 9.73 with the 512-token one (docs/benchmarks.md). Below 512 the rows a CSA layer
# reads (128) cost little next to the rest of the step, and every context size is another compile.
DECODE_CONTEXT_FACTOR = 4
DECODE_CONTEXT_SMALLEST = 512


def decode_contexts(max_context: int) -> list[int]:
    """The contexts of an engine's decode steps, ascending, the last the plan's: 8192 -> [512, 2048, 8192]."""
    contexts = [max_context]
    while contexts[-1] // DECODE_CONTEXT_FACTOR >= DECODE_CONTEXT_SMALLEST:
        contexts.append(contexts[-1] // DECODE_CONTEXT_FACTOR)
    return contexts[::-1]
