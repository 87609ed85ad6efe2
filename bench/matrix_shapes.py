"""What the matrix-product benches share (bf16_matmul.py, fp8_linear.py, fp8_prefill.py): the command line (which
[N, K] matrices, at which token counts, how many rounds and calls, on how many threads), their timing loop
(cold_call_seconds), and the integer lists the kernel benches sweep (int_list: fp8_linear.py, head_kernel.py)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

FLUSH_BYTES = 64 * 1024 * 1024  # written before every timed call: more than the caches hold


def parser(doc: str, shapes: str, tokens: str, rounds: int, calls: int) -> argparse.ArgumentParser:
    """The shared options, with these defaults; a bench adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=shapes, help="NxK matrices, comma-separated (default: %(default)s)")
    p.add_argument("--tokens", default=tokens, help="token counts (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--calls", type=int, default=calls, help="calls per variant per round")
    p.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
    return p


def int_list(text: str, what: str, low: int = 0, high: int | None = None) -> list[int]:
    """A comma-separated option's integers, each in low..high; else SystemExit naming --what."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{what}: comma-separated integers, not {text!r}") from None
    if not values or min(values) < low or (high is not None and max(values) > high):
        bound = f"from {low}" + (f" to {high}" if high is not None else "")
        raise SystemExit(f"--{what}: at least one value, each {bound}, not {text!r}")
    return values


def parse(p: argparse.ArgumentParser, argv=None, k_multiple: int = 1,
          max_tokens: int | None = None) -> tuple[argparse.Namespace, list[tuple[int, int]], list[int]]:
    """(options, [(N, K)], sorted token counts); refuses K not a multiple of `k_multiple` and token counts
    outside 1..max_tokens. Sets torch's threads when --threads is given."""
    a = p.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
        tokens = sorted({int(t) for t in a.tokens.split(",")})
    except ValueError:
        p.error(f"--shapes takes NxK,NxK... and --tokens T,T,... (got {a.shapes!r}, {a.tokens!r})")
    limit = f"1-{max_tokens}" if max_tokens else ">= 1"
    if (any(len(s) != 2 or min(s) < 1 or s[1] % k_multiple for s in shapes) or min(tokens) < 1
            or (max_tokens and max(tokens) > max_tokens)):
        p.error("--shapes: NxK with N, K >= 1" + (f", K a multiple of {k_multiple}" if k_multiple > 1 else "")
                + f"; --tokens: {limit} (got {a.shapes!r}, {a.tokens!r})")
    if a.threads:
        torch.set_num_threads(a.threads)
    return a, shapes, tokens


def cold_call_seconds(variants: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """{variant: the median over rounds of its mean seconds a call}. The variants alternate within each round
    (a machine's slow minute slows them all), and every call follows a write of FLUSH_BYTES, so it reads its
    matrix from memory as a model's forward does, not from the cache the previous call filled."""
    flush = torch.empty(FLUSH_BYTES // 4)
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            total = 0.0
            for _ in range(calls):
                flush.add_(1.0)
                start = time.perf_counter()
                fn()
                total += time.perf_counter() - start
            times[name].append(total / calls)
    return {name: statistics.median(v) for name, v in times.items()}
