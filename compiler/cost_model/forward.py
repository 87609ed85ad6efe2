"""A forward's wall time around its layers: GPU-boundary hops, the head, graph launches, and the host's dispatch.

Host dispatch: a forward run eagerly (every prefill; decode only on a cpu-only spec, since GPUs
replay the captured decode graph) issues its ops one by one from Python, EAGER_OPS_PER_LAYER per
layer and prefill chunk (the baselines' own counts where they differ), each costing the spec's
host.op_dispatch_s. With a GPU the host runs ahead of the device, so a forward takes the longer of
dispatch and device work; on the CPU they add up. A cpu-only plan's decode step compiled into one call
(policy.cpu_step "compiled", runtime/engine/cpu_step.py) is priced at COMPILED_STEP_OPS_PER_LAYER in the
same units instead: what its generated code, its opaque expert and head calls and its entry cost the host.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .model import CostModel

# aten ops the runtime dispatches per layer-forward (attention with compressor and indexer, mHC,
# routing, shared expert, the executor's bookkeeping); about the same for 1 or 128 tokens (180-230 on
# the tiny and small models; 580-750 before the mHC mixing, the norms and the rope became generated
# kernels and the CPU's hot pools went to the CPU kernel). tests/test_cost_model_dispatch.py recounts
# it; bench/count_ops.py reports it.
EAGER_OPS_PER_LAYER = 215
# ...and per layer of a fixed-shape step of 2 or more tokens (a bucket, the speculative verify step), run
# eagerly on a cpu-only spec: the general paths of its windows and compressors (the decode step has a
# shorter one). Measured: 272 per layer on the tiny plan against 194 for its decode step; recounted by
# tests/test_cost_model_dispatch.py, reported by bench/count_ops.py ("step2").
EAGER_STEP_OPS_PER_LAYER = 270
# ...and per layer of the decode step compiled into one call (policy.cpu_step "compiled"), in the same units:
# host.op_dispatch_s is measured as the eager step's time per aten op (small ops' compute included), so the
# compiled step's time per layer is the eager step's aten ops per layer x compiled / eager time, both steps
# measured side by side on the tiny plan by bench/cpu_step.py (its last line): eager 9.54 ms, compiled
# 1.83 ms a token (5 rounds, AMD EPYC, 2 threads; the step called past Dynamo's guards, by context size), so
# 194 x 1.83 / 9.54.
COMPILED_STEP_OPS_PER_LAYER = 37
# A PyTorch DSV4 forward without those two fusions: what the KTransformers-like baseline is priced with
# (our runtime's own count before them; KTransformers' real count is not measured here).
UNFUSED_EAGER_OPS_PER_LAYER = 600


class ForwardPricing:
    """CostModel's forward around its layers (it sets hw, layers, prefill_chunk, cpu_step and
    eager_ops_per_layer; the hops and the head are device pricing's)."""

    def forward_overheads(self, n: int, decode: bool, head_tokens: int = 1) -> float:
        """What a forward pass adds to its layers: GPU-boundary hops, the head (over `head_tokens` rows: a
        forward's last token, or every session's token of a batched decode step), decode graph launches."""
        launches = len(set(l.gpu for l in self.layers)) * self.hw.gpus.launch_overhead_s if decode else 0.0
        return self._hops(n) + self._head_time(head_tokens) + launches

    def dispatch_time(self, n: int, ops_per_layer: int | None = None) -> float:
        """Host seconds to issue an eager forward of n tokens op by op (one pass per prefill chunk), of
        `ops_per_layer` (default: the dynamic forward's) per layer."""
        chunks = max(1, -(-n // self.prefill_chunk))
        ops = self.eager_ops_per_layer if ops_per_layer is None else ops_per_layer
        return chunks * len(self.layers) * ops * self.hw.host.op_dispatch_s

    def with_eager_ops(self, ops_per_layer: int) -> CostModel:
        """The same model for a system that dispatches `ops_per_layer` ops per layer-forward."""
        other = copy.copy(self)
        other.eager_ops_per_layer = ops_per_layer
        return other

    def forward_time(self, device_s, n: int, decode: bool, eager: bool, ops_per_layer: int | None = None,
                     head_tokens: int = 1):
        """Wall time of a forward whose layers take device_s (a float, or an array of decode steps):
        its overheads added, and the host's op dispatch when it runs eagerly (see the module docstring)."""
        busy = device_s + self.forward_overheads(n, decode, head_tokens)
        if not eager:
            return busy
        host = self.dispatch_time(n, ops_per_layer)
        return busy + host if self.hw.cpu_only else np.maximum(busy, host)

    def decode_is_eager(self) -> bool:
        """GPUs replay the captured decode graph; a cpu-only spec runs the same step eagerly."""
        return self.hw.cpu_only

    def step_ops_per_layer(self, T: int) -> int | None:
        """Dispatch units per layer of a T-token fixed-shape step on a cpu-only spec (None: the dynamic
        forward's): the compiled decode step's, or an eager step's."""
        if T == 1:
            return COMPILED_STEP_OPS_PER_LAYER if self.cpu_step == "compiled" else None
        return EAGER_STEP_OPS_PER_LAYER
