"""Short prefills as bucket steps (runtime/engine/step_runner.py): a prompt of n <= the largest of
`buckets` tokens runs as exact-size steps of power-of-two sizes (120 = 64 + 32 + 16 + 8), each a
replayed graph per GPU like the decode step (eager on a cpu-only spec). Inside one, the hot routes
go through the decode kernel, one program per route slot, so each hot route reads its expert's
weights (no L2 reuse credited: conservative); cold routes are split-route's. Which sizes the plan
keeps is its policy's (plan_policy.py, choose_buckets).
"""

from __future__ import annotations

from ostinato.buckets import bucket_pieces


class BucketSteps:
    """CostModel's fixed-shape prefill steps (from device pricing, attention by position and the forward)."""

    def bucket_layer(self, layer: int, T: int, position: int | None = None,
                     threads: int | None = None) -> tuple[float, float, float]:
        """(seconds before the experts, GPU seconds, CPU seconds) of a layer in a T-token step after `position`:
        its attention reads the step's rows (step_context); hot routes each read their expert on a GPU (the
        decode kernel's per-route programs; the CPU kernel groups them), cold ones split-route, the CPU expert
        pool at `threads` (None: every core, a prefill's)."""
        hot_routes = self.routes(layer, T, True)
        reads = self.distinct(layer, T, True) if self.hw.cpu_only else hot_routes
        gpu = self.shared_expert_time(layer, T) + self.gpu_experts_time(reads, hot_routes, threads)
        first = self.before_experts_time(layer, T, position, step_context=self.step_context(T, position))
        return float(first), gpu, self.cpu_experts_time(T, self.distinct(layer, T, False), self.routes(layer, T, False),
                                                        threads)

    def bucket_step(self, T: int, position: int | None = None, threads: int | None = None) -> float:
        """One T-token step after `position`: replayed graphs on GPUs (on a cpu-only spec step_ops_per_layer(T):
        eager, EAGER_STEP_OPS_PER_LAYER a layer, for T >= 2), the head once; the CPU expert pool at `threads`
        (None: every core)."""
        layers = sum(self.layer_seconds(*self.bucket_layer(l, T, position, threads)) for l in range(len(self.layers)))
        return float(self.forward_time(layers, T, decode=True, eager=self.decode_is_eager(),
                                       ops_per_layer=self.step_ops_per_layer(T)))

    def bucket_prefill(self, n: int, buckets: list[int], position: int | None = None) -> float:
        """n tokens after `position` as the steps bucket_pieces picks from `buckets`, one after another."""
        at, total = self.at(n, position), 0.0
        for T in bucket_pieces(n, buckets):
            total += self.bucket_step(T, at)
            at += T
        return total
