"""The CPU expert pool's threads for decode-sized calls: as many as it takes to read a step's cold experts at the
memory's rate, no more.

A call's host side (devices.py cpu_experts_time) is the kernel at the pool's threads T plus the layer's hand-off,
which grows with T (ostinato/host_sync.py: a bound, 4 x 163.5 ns an added thread):

    cold(T) = distinct x expert_bytes / min(T x per_core(tokens per expert), expert read) + handoff(T)

A prefill's call reads many experts at many tokens each: per_core falls as the tokens per expert grow, so it
takes every core to reach the memory's rate, and the hand-off is small beside its kernel time: it keeps every
core. A decode step's call reads a few experts (V4-Flash: at most 6 cold routes a layer, an expert or two of
~13 MB) at one token each: per_core is at its highest, the memory saturates at a fraction of the cores
(h200-x1: 243 GB/s / 13.7 GB/s a core, 18 threads), and every thread past that adds only synchronization (96
threads: ~60 us a layer, about the kernel's own time). So the plan picks the decode pool's threads:

    decode threads = argmin over T in 1..cores of  sum over layers of the 1-token step's host side at T

(its expected cold routes and distinct cold experts per layer, as decode_step prices them; on a cpu-only spec the
hot pools too: they run through the same kernel in the same step, engine/executor.py host_decode_step), the
smallest T among equals.

It is Ostinato's choice, not the hardware's: a model prices decode-sized calls at `decode_pool_threads`, None
(every core, every price as it was) until a policy sets it (with_decode_threads). Ostinato's compile sets it to
choose_decode_threads() (compiler/passes/cost_model.py), the plan carries it (policy.decode_cpu_threads) and the
runtime passes it to those calls (runtime/engine/executor.py pool_threads). Priced at it: decode_step,
batched_decode_step (a few sessions' tokens read a few more experts at one token each, so the memory saturates at
about the same threads), the MTP draft and the 2-token verify step. Prefill (split-route forwards, bucket steps)
keeps every core.
"""

from __future__ import annotations

import copy


class PoolThreads:
    """CostModel's expert pool threads for decode-sized calls (from device pricing's cpu_experts_time and
    gpu_experts_time at given threads)."""

    decode_pool_threads: int | None = None   # the pool's threads in decode-sized calls; None: every core

    def with_decode_threads(self, threads: int | None):
        """The same model with decode-sized calls priced on a pool of `threads` threads (None: every core)."""
        other = copy.copy(self)
        other.decode_pool_threads = None if threads is None else self.pool_threads_of(threads)
        return other

    def choose_decode_threads(self) -> int:
        """The pool's threads for decode-sized calls (module docstring): the fewest threads with the cheapest
        1-token host side."""
        costs = self.decode_host_seconds()
        return min(range(1, len(costs) + 1), key=lambda T: costs[T - 1])

    def decode_host_seconds(self) -> list[float]:
        """[cores] seconds of a 1-token step's host side on a pool of T = 1.. cores threads, summed over the layers:
        cold routes with their hand-off, and on a cpu-only spec the hot pools (the same kernel, the same pool)."""
        per_layer = [(self.distinct(l, 1, True), self.routes(l, 1, True),
                      self.distinct(l, 1, False), self.routes(l, 1, False)) for l in range(len(self.layers))]
        seconds = []
        for T in range(1, self.hw.host.cores + 1):
            total = 0.0
            for hot_d, hot_r, cold_d, cold_r in per_layer:
                total += self.cpu_experts_time(1, cold_d, cold_r, T)
                if self.hw.cpu_only:
                    total += self.gpu_experts_time(hot_d, hot_r, T)
            seconds.append(total)
        return seconds

    def decode_threads_reason(self) -> str:
        """One line for --explain: the model's decode threads and why, in its figures."""
        costs, cores = self.decode_host_seconds(), self.hw.host.cores
        T = self.decode_pool_threads or cores
        per_layer = lambda s: s / len(self.layers) * 1e6  # noqa: E731
        if T == cores:
            return (f"decode runs the CPU expert pool on all {cores} cores: its host side is cheapest there "
                    f"({per_layer(costs[T - 1]):.1f} us a layer)")
        return (f"decode runs the CPU expert pool on {T} of {cores} threads: its cold experts read at the memory's "
                f"rate by then, and more threads only add hand-off (host_sync.py); host side "
                f"{per_layer(costs[T - 1]):.1f} us a layer against {per_layer(costs[cores - 1]):.1f} us on all cores")
