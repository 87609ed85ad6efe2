"""Device pricing: what experts, copies and hops cost on the spec's GPUs, host and link.

Every system priced here (Ostinato and the baselines of bench/simulator/) computes on the same devices, so these
rates are shared; which device runs what, and in which order, is the composition's (layers.py) and each system's
policy. Per layer:
- routes: each token picks top_k experts; expert e is in a token's set with probability
  q_e = min(1, top_k * share_e) (share from the profile), so n tokens touch it with probability
  1 - (1 - q_e)^n and the expected distinct experts touched is the sum of those;
- an expert computed on a device costs max(its weight bytes / memory bandwidth, its routes'
  FLOPs / matmul rate): streaming the weights once bounds short batches, compute bounds long ones;
- an expert computed on the host costs what compiler/host_kernel.py's rule says: the kernel's measured
  per-core rate at the layer's tokens per expert times the expert pool's threads, capped by the host's
  expert read bandwidth (the spec's host.expert_kernel; a calibrated host, or a spec without it, falls back
  to the same max() of bytes and FLOPs at the host's all-core rates, scaled by threads / cores: those rates
  are all-core figures, and a share of the cores is priced at that share of them, which never credits a
  smaller pool with the memory's saturation below all cores: conservative for a small pool);
- the pool's threads are every core unless a caller says otherwise (decode-sized calls: pool_threads.py), and
  so is the per-layer hand-off to the host task: task_handoff_s grown to the pool's threads by
  ostinato/host_sync.py's bound (at every core, host.handoff_s).
Hidden states move between GPUs over the link once per GPU boundary. On a cpu-only spec the
"GPU" and the host are the same cores, so their parts add up instead of overlapping.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from ostinato.host_sync import barrier_growth_s

from ..host_kernel import KernelRates, expert_read_bandwidth

if TYPE_CHECKING:
    from .model import CostModel

EXPERT_FLOPS_PER_TOKEN_FACTOR = 2 * 3   # 3 matmuls (gate, up, down), 2 FLOP per multiply-add


def host_expert_rates(host) -> tuple[float, float]:
    """(bytes/s, FLOP/s) of the CPU expert kernel: calibrated on the host when the spec has them
    (ostinato-calibrate), else the spec's DRAM bandwidth and matmul rate."""
    return (host.expert_read_bandwidth or host.bandwidth, host.expert_flops or host.matmul_flops)


def is_calibrated(host) -> bool:
    return host.expert_read_bandwidth is not None and host.expert_flops is not None


def pool_kernel_time(rates: KernelRates, host, distinct: float, routes: float, expert_bytes: int,
                     threads: int) -> float:
    """host_kernel.kernel_time's rule with the pool's `threads` in place of the host's cores: `distinct` experts and
    their `routes` at min(threads x per_core(routes / distinct), the host's expert read). At threads = host.cores it
    is kernel_time."""
    if distinct <= 0:
        return 0.0
    rate = rates.rate(max(routes / distinct, 1.0), threads, expert_read_bandwidth(host))
    return distinct * expert_bytes / rate


class DevicePricing:
    """CostModel's device rates (it sets cfg, hw, layers, expert_bytes, head_bytes, expert_flops, host_kernel and
    the per-layer route probabilities _q)."""

    def distinct(self, layer: int, n: int, hot: bool) -> float:
        """Expected distinct hot (or cold) experts of `layer` touched by n tokens."""
        l, q = self.layers[layer], self._q[layer]
        mask = l.hot if hot else ~l.hot
        return float((1.0 - (1.0 - q[mask]) ** n).sum())

    def routes(self, layer: int, n: int, hot: bool) -> float:
        l = self.layers[layer]
        mask = l.hot if hot else ~l.hot
        return float(n * self.cfg.num_experts_per_tok * l.share[mask].sum())

    def _experts_time(self, distinct: float, routes: float, bandwidth: float, flops: float) -> float:
        return max(distinct * self.expert_bytes / bandwidth, routes * self.expert_flops / flops)

    # ----- explicit counts: the session simulator feeds sampled traces through these -------------
    def gpu_experts_time(self, distinct: float, routes: float, threads: int | None = None) -> float:
        """Experts computed on a GPU; on a cpu-only spec the "GPU" is the host, whose hot pools run through
        the same CPU kernel as its cold experts, so they are priced alike (at the pool's `threads`, None: every
        core; a GPU ignores it)."""
        if self.hw.cpu_only and self.host_kernel is not None:
            return self.host_experts_time(distinct, routes, threads)
        g = self.hw.gpus
        return self._experts_time(distinct, routes, g.bandwidth, g.matmul_flops)

    def pool_threads_of(self, threads: int | None) -> int:
        """The expert pool's threads a price is for: `threads`, checked against the host's cores (None: all)."""
        cores = self.hw.host.cores
        if threads is None:
            return cores
        if not 1 <= threads <= cores:
            raise ValueError(f"threads {threads}: the expert pool's threads on {self.hw.name}, 1 to its {cores} cores")
        return threads

    def host_experts_time(self, distinct: float, routes: float, threads: int | None = None) -> float:
        """The host's expert kernel over `distinct` experts and their `routes` on a pool of `threads` threads
        (None: every core): host_kernel.py's rule with this model's kernel rates (another system's with
        with_host_kernel), or the host's all-core rates scaled to the pool's share of the cores."""
        threads = self.pool_threads_of(threads)
        if self.host_kernel is not None:
            return pool_kernel_time(self.host_kernel, self.hw.host, distinct, routes, self.expert_bytes, threads)
        share = threads / self.hw.host.cores
        bandwidth, flops = host_expert_rates(self.hw.host)
        return self._experts_time(distinct, routes, bandwidth * share, flops * share)

    def handoff_time(self, threads: int | None = None) -> float:
        """A layer's hand-off to the host task with a pool of `threads` threads (None: every core, host.handoff_s):
        the measured task_handoff_s plus the pool's synchronizations grown to its threads (host_sync.py's bound)."""
        if threads is None:
            return self.hw.host.handoff_s
        return self.hw.host.task_handoff_s + barrier_growth_s(self.pool_threads_of(threads))

    def cpu_experts_time(self, n: int, distinct: float, routes: float, threads: int | None = None) -> float:
        """Routes computed by the host's expert kernels on a pool of `threads` threads (None: every core), plus
        the layer's hand-off to the host task at those threads and n tokens' activations over the link both
        ways."""
        if routes <= 0:
            return 0.0
        link = self.hw.link
        act = n * self.cfg.hidden_size * 4
        return (self.host_experts_time(distinct, routes, threads) + self.handoff_time(threads)
                + 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth)

    def upload_time(self, experts: float, extra_bytes: int = 0, links: int = 1) -> float:
        """`experts` expert weights (plus extra_bytes) crossing host -> device once, spread over `links` GPUs'
        links at once (a tensor-parallel system's shards), as fast as the host memory feeds them."""
        size = experts * self.expert_bytes + extra_bytes
        bandwidth = min(links * self.hw.link.h2d_bandwidth, self.hw.host.bandwidth)
        return size / bandwidth + (self.hw.link.latency_s if size > 0 else 0.0)

    def overlap(self, a: float, b: float) -> float:
        """Two concurrent parts: the longer one, unless they share the same cores (cpu-only)."""
        return a + b if self.hw.cpu_only else np.maximum(a, b)

    def _hops(self, n: int) -> float:
        """Hidden state crossing each GPU boundary (hc streams of hidden_size, fp32)."""
        crossings = len(set(l.gpu for l in self.layers)) - 1
        size = n * self.cfg.hc_mult * self.cfg.hidden_size * 4
        return crossings * (self.hw.link.latency_s + size / self.hw.link.h2d_bandwidth)

    def _head_time(self, n: int) -> float:
        g = self.hw.gpus
        return max(self.head_bytes / g.bandwidth, 2 * n * self.cfg.vocab_size * self.cfg.hidden_size / g.matmul_flops)

    def with_host_kernel(self, rates: KernelRates | None) -> CostModel:
        """The same model for a system whose CPU expert kernel runs at `rates` (host_kernel.py's rule)."""
        other = copy.copy(self)
        other.host_kernel = rates
        return other
