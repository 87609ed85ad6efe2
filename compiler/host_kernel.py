"""A CPU expert kernel's speed on a host, scaled by one rule from a measurement on another machine.

The rule (the same for Ostinato's kernel and every baseline's, so no system gets a ratio measured on 2
cores applied unchanged to 32):

    rate(t) = min(computing_cores x per_core(t), expert_read_bandwidth)     bytes of expert weights / s
    time(distinct experts, routes) = distinct x expert_bytes / rate(routes / distinct)

- per_core(t): bytes of expert weights a kernel gets through per second per computing thread at t tokens
  per expert, measured in whole-layer calls side by side (python -m ostinato.bench.kernel_side_by_side),
  interpolated in log(t) between the measured points. It falls as t grows: past one token a kernel is
  compute-bound. Below the first point it keeps the first value; past the last it falls as 1 / t (the
  last point's FLOP rate, held: the time per expert grows with its tokens).
- computing_cores: the host's cores less those the system keeps for itself (kt-kernel: its queue thread).
- expert_read_bandwidth: what a kernel can read of packed experts with every core: the host's calibrated
  figure (ostinato-calibrate) where it has one, else EXPERT_READ_FRACTION of its streaming read bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

# The share of a host's streaming read bandwidth (STREAM-like, the spec's host.bandwidth) that a CPU expert
# kernel reads at 1 token per expert with every core. Published: kt-kernel's MXFP4 kernel at decode, 182 of
# 226 GB/s STREAM on 2x EPYC 7452 (kvcache-ai/ktransformers PR #2175); measured here: Ostinato's, 0.83-0.84
# of the read bandwidth on 2-core Zen 4 (python -m ostinato.bench.cpu_experts, docs/benchmarks.md).
EXPERT_READ_FRACTION = 0.8


@dataclass(frozen=True)
class KernelRates:
    """One kernel's measured per-core speed at a few tokens per expert."""
    name: str
    tokens: tuple[float, ...]         # tokens per expert of the measurements, ascending
    per_core: tuple[float, ...]       # bytes/s of expert weights per computing thread at each
    reserved_cores: int = 0           # cores the system keeps off the computation (kt-kernel: its queue thread)
    source: str = ""

    def __post_init__(self):
        if (len(self.tokens) != len(self.per_core) or not self.tokens or list(self.tokens) != sorted(set(self.tokens))
                or min(self.tokens) <= 0 or min(self.per_core) <= 0):
            raise ValueError(f"kernel rates of {self.name!r}: need ascending positive tokens per expert and one "
                             f"positive per-core rate each (got {len(self.tokens)} tokens, {len(self.per_core)} rates)")

    def per_core_at(self, tokens_per_expert: float) -> float:
        """per_core interpolated in log(tokens per expert); the first value below the first point, the last
        point's FLOP rate past the last (see the module docstring)."""
        x = math.log(max(tokens_per_expert, 1e-9))
        xs = self._log_tokens
        if x <= xs[0]:
            return self.per_core[0]
        for x0, x1, r0, r1 in zip(xs, xs[1:], self.per_core, self.per_core[1:]):
            if x <= x1:
                return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
        return self.per_core[-1] * self.tokens[-1] / tokens_per_expert

    @cached_property
    def _log_tokens(self) -> tuple[float, ...]:
        """log of each measured token count (per_core_at's abscissae; computed once: the rates are frozen)."""
        return tuple(math.log(t) for t in self.tokens)

    def rate(self, tokens_per_expert: float, cores: int, read_bandwidth: float) -> float:
        """Bytes/s of expert weights on a host of `cores` cores that reads experts at `read_bandwidth`."""
        return min(max(1, cores - self.reserved_cores) * self.per_core_at(tokens_per_expert), read_bandwidth)


def expert_read_bandwidth(host) -> float:
    """What a CPU expert kernel can read with every core of the host (see the module docstring)."""
    return host.expert_read_bandwidth or EXPERT_READ_FRACTION * host.bandwidth


def numa_read_share(sockets: int, pools: int) -> float:
    """The share of a box's streaming read (all its sockets' memory, each read by its own socket's threads) that a
    CPU kernel of `pools` thread pools reads on a box of `sockets` sockets (NUMA nodes): min(pools, sockets) /
    sockets. A kernel reads all of it only when every socket has a pool reading its own memory: kt-kernel keeps one
    pool per NUMA node, each with its share of every expert in that node's memory (its docs: --kt-threadpool-count
    set to the NUMA node count; its log's "Creating AMX_MOE_TP 0 at numa 0" / "1 at numa 1"). One pool across the
    sockets reads the others' memory remotely: a program that reads a two-socket server without NUMA placement gets
    about half of what NUMA-aware code gets (D. Lemire, "How much memory bandwidth do large Amazon instances
    offer?", 2024-01-18: about 130 GB/s on a two-socket Ice Lake server, doubled by NUMA-aware code)."""
    if sockets < 1 or pools < 1:
        raise ValueError(f"NUMA rule: sockets {sockets} and pools {pools} must be at least 1")
    return min(pools, sockets) / sockets


def rates_of_spec(host) -> KernelRates | None:
    """The Ostinato kernel's per-core rates a hardware spec carries (host.expert_kernel), or None."""
    k = host.expert_kernel
    if k is None:
        return None
    return KernelRates("ostinato", tuple(k.tokens_per_expert), tuple(k.per_core), 0, k.source)


def kernel_time(rates: KernelRates, host, distinct: float, routes: float, expert_bytes: int) -> float:
    """Seconds for `distinct` experts and their `routes` on the host, by the rule above."""
    if distinct <= 0:
        return 0.0
    rate = rates.rate(max(routes / distinct, 1.0), host.cores, expert_read_bandwidth(host))
    return distinct * expert_bytes / rate
