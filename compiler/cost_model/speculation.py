"""Speculative decoding with the MTP block (runtime/model/speculative.py), priced from the pieces of the other
modules (speculative_step).

A step drafts `depth` tokens with the MTP block (each draft: one more decoder layer,
its dense part on the GPU that holds the head, its routed experts hot or cold as the plan places them,
priced from its own route shares (its cold routes through the host task like any layer's; without a
placement, as an average layer's), plus e_proj/h_proj and the head), then verifies them in ONE forward
of depth + 1 tokens (the plan's own T-token pricing: a bucket step when T is a bucket; the expected
distinct experts of T tokens).
Each draft is accepted with probability a (independently). Ostinato's runtime (depth 1) rolls the
session back on a rejection and runs the pending token alone as a plain decode step:
    tokens per step = 1 + a,   seconds per step = draft + verify(T=2) + (1 - a) x decode(T=1).
An EAGLE-style verify (SGLang, KTransformers) keeps the accepted prefix and the verify's own pick, with
no re-run: tokens = 1 + a + ... + a^depth, seconds = depth x draft + verify(T=depth+1).
No constant is new: the acceptance is a parameter (0.9: KTransformers' published figure, PUBLISHED.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inputs import MtpCostInputs

MTP_ACCEPTANCE = 0.9  # draft acceptance until real weights say otherwise: KTransformers' published figure for
                      # V4-Flash's MTP block (PUBLISHED.md); plans predict speculation at it unless their
                      # recorded profile measured the block's own (compiler/passes/speculation.py,
                      # MIN_MEASURED_DRAFTS); the simulator always


@dataclass(frozen=True)
class SpeculativeStep:
    """One speculative step's expectation: tokens it yields and seconds it takes, and its parts."""
    tokens: float
    seconds: float
    draft_s: float       # all drafts of the step
    verify_s: float
    rerun_s: float       # the expected re-run after a rejection (0 for an EAGLE-style verify)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def speculative_step(acceptance: float, draft_s: float, verify_s: float, decode_s: float, depth: int = 1,
                     rerun: bool = True) -> SpeculativeStep:
    """The step's arithmetic (module docstring): `rerun` (Ostinato's runtime, depth 1 only) runs the pending
    token again alone (decode_s) when the draft is rejected; without it the verify's pick stands."""
    a = float(acceptance)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance {a}: a probability in [0, 1]")
    if depth < 1 or (rerun and depth != 1):
        raise ValueError(f"depth {depth}: at least 1, and exactly 1 with a re-run on rejection")
    tokens = sum(a ** i for i in range(depth + 1))
    again = (1.0 - a) * decode_s if rerun else 0.0
    return SpeculativeStep(tokens, depth * draft_s + verify_s + again, depth * draft_s, verify_s, again)


class SpeculationPricing:
    """CostModel's draft, verify and speculative decode (it sets mtp; the rest is the other modules')."""

    def mtp_draft(self) -> float:
        """One draft: the MTP block's forward of one token. Its decoder layer is priced like a layer (index
        num_hidden_layers: its attention kind, sliding-only for V4, so its position does not matter), dense part
        `self.mtp` (else the last layer's) on the GPU holding the head, so no hop, in the layer's order (its
        dense part but the shared expert, then the shared and hot experts beside the cold ones); its routed
        experts as placed (`self.mtp.hot`, its own shares: the hot ones on that GPU, the cold ones through the
        host task), else hot or cold in an average layer's proportion (the mean over the layers of their
        one-token split); then the main model's head, and one graph launch (op by op on a cpu-only spec, as its
        decode step)."""
        m = self.mtp or MtpCostInputs(self.layers[-1].gpu, self.layers[-1].dense_bytes, self.layers[-1].dense_params)
        index = len(self.layers)
        shared_bytes, shared_params = self._shared[index]
        first = float(self._dense_time(index, m.dense_bytes - shared_bytes, m.dense_params - shared_params, 1,
                                       self.step_context(1), True))
        shared, threads = self.shared_expert_time(index, 1), self.decode_pool_threads   # a decode-sized call's pool
        if m.hot is not None:
            q, k = np.minimum(1.0, self.cfg.num_experts_per_tok * m.share), self.cfg.num_experts_per_tok
            split = [(float(q[mask].sum()), float(k * m.share[mask].sum())) for mask in (m.hot, ~m.hot)]
            experts = [(self.gpu_experts_time(*split[0], threads), self.cpu_experts_time(1, *split[1], threads))]
        else:
            experts = [(self.gpu_experts_time(self.distinct(l, 1, True), self.routes(l, 1, True), threads),
                        self.cpu_experts_time(1, self.distinct(l, 1, False), self.routes(l, 1, False), threads))
                       for l in range(len(self.layers))]
        layer = float(np.mean([self.layer_seconds(first, shared + g, c) for g, c in experts]))
        busy = layer + self._head_time(1)
        if self.decode_is_eager():
            return busy + self.eager_ops_per_layer * self.hw.host.op_dispatch_s
        return busy + self.hw.gpus.launch_overhead_s

    def verify_step(self, T: int, position: int | None = None) -> float:
        """The verify forward of T tokens: a fixed-shape step of T tokens, which the engine makes whether or not
        T is a prefill bucket (runtime/engine/step_runner.py), captured on GPUs; a decode-sized call, its CPU
        expert pool at the decode threads (pool_threads.py)."""
        return self.bucket_step(T, position, self.decode_pool_threads)

    def graph_verify_step(self, T: int, position: int | None = None) -> float:
        """A verify forward of T tokens after `position` captured as a graph with split routes (an EAGLE-style
        server's decode graph: GPU experts read once per distinct expert, the rest on the host; its paged
        attention reads the rows visible, a dynamic forward's)."""
        layers = sum(self.layer_seconds(*self.split_layer(l, T, position)) for l in range(len(self.layers)))
        return float(self.forward_time(layers, T, decode=True, eager=self.decode_is_eager()))

    def speculative_decode(self, acceptance: float, position: int | None = None) -> tuple[float, SpeculativeStep]:
        """Expected decode tokens/s (without MTP, and the speculative step with it) of the runtime's depth-1
        speculative decoding after `position`: draft + verify(T=2) + (1 - a) x decode, 1 + a tokens."""
        decode = self.decode_step(position)
        step = speculative_step(acceptance, self.mtp_draft(), self.verify_step(2, position), decode)
        return 1.0 / decode, step
