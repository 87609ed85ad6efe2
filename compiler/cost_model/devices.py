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
  per-core rate at the layer's tokens per expert times the host's cores, capped by the host's expert
  read bandwidth (the spec's host.expert_kernel; a calibrated host, or a spec without it, falls back
  to the same max() of bytes and FLOPs at the host's rates).
Hidden states move between GPUs over the link once per GPU boundary. On a cpu-only spec the
"GPU" and the host are the same cores, so their parts add up instead of overlapping.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from ..host_kernel import KernelRates, kernel_time

if TYPE_CHECKING:
    from .model import CostModel

EXPERT_FLOPS_PER_TOKEN_FACTOR = 2 * 3   # 3 matmuls (gate, up, down), 2 FLOP per multiply-add


def host_expert_rates(host) -> tuple[float, float]:
    """(bytes/s, FLOP/s) of the CPU expert kernel: calibrated on the host when the spec has them
    (ostinato-calibrate), else the spec's DRAM bandwidth and matmul rate."""
    return (host.expert_read_bandwidth or host.bandwidth, host.expert_flops or host.matmul_flops)


def is_calibrated(host) -> bool:
    return host.expert_read_bandwidth is not None and host.expert_flops is not None


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
    def gpu_experts_time(self, distinct: float, routes: float) -> float:
        """Experts computed on a GPU; on a cpu-only spec the "GPU" is the host, whose hot pools run through
        the same CPU kernel as its cold experts, so they are priced alike."""
        if self.hw.cpu_only and self.host_kernel is not None:
            return kernel_time(self.host_kernel, self.hw.host, distinct, routes, self.expert_bytes)
        g = self.hw.gpus
        return self._experts_time(distinct, routes, g.bandwidth, g.matmul_flops)

    def host_experts_time(self, distinct: float, routes: float) -> float:
        """The host's expert kernel over `distinct` experts and their `routes` (host_kernel.py's rule with
        this model's kernel rates; another system's with with_host_kernel)."""
        if self.host_kernel is not None:
            return kernel_time(self.host_kernel, self.hw.host, distinct, routes, self.expert_bytes)
        return self._experts_time(distinct, routes, *host_expert_rates(self.hw.host))

    def cpu_experts_time(self, n: int, distinct: float, routes: float) -> float:
        """Routes computed by the host's expert kernels, plus the layer's hand-off to the host task and n
        tokens' activations over the link both ways."""
        if routes <= 0:
            return 0.0
        link = self.hw.link
        act = n * self.cfg.hidden_size * 4
        return (self.host_experts_time(distinct, routes) + self.hw.host.handoff_s
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
