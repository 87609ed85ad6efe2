"""Decode: one session's fixed-shape step, and several sessions' tokens in one batched step.

Decode (one token): the same split as prefill with n = 1, plus one graph launch per GPU; layers run one
after another (a single sequence has no pipelining). Its attention reads the rows of the decode step of
step_context(1, position) (attention.py). Its host side runs the CPU expert pool at the model's decode threads
(pool_threads.py: every core unless a policy chose fewer), as does the batched step's.

Several sessions decoding at once (batched_decode_step; runtime/model/static_decode/batch_step.py): B sessions
decode one token each in one fixed-shape step. Everything that does not read a session's own cache runs once over
the B tokens (the dense weights, the shared expert, the head: read once per step, their FLOPs B times); attention
and the CSA indexer run per session, against its own KV rows at its own position; the hot routes go through the
decode kernel (one program per route slot: each token's hot routes read their experts, as in a bucket step), the
cold routes of all B tokens through one host task that reads each distinct cold expert once. The distinct experts
B tokens touch are distinct(layer, B, hot) with the same law as every batch here: tokens route independently of
each other, expert e in a token's set with probability q_e = min(1, top_k x share_e), so E[distinct] = sum_e
1 - (1 - q_e)^B. Sessions' tokens are less alike than one prompt's (their topics differ), and for given mean
shares sessions with laws of their own touch more distinct experts than that (prod_b (1 - q_be) <= (1 - mean_b
q_be)^B): a bound on the experts' side, not a figure of the sessions' routing. (The simulator's traces, top-k drawn
without replacement, touch a few percent more of the rarer experts than q_e says: tests/test_parallel_model.py.)
No constant is new: every term is a solo step's, summed or shared as above.
"""

from __future__ import annotations

import numpy as np


class DecodePricing:
    """CostModel's decode steps (from the layers' composition, attention by position and the forward)."""

    def decode_step(self, position: int | None = None, sessions: int = 1) -> float:
        """One decode step after `position` tokens: the fixed-shape step of step_context(1, position), its
        routes split. `sessions` > 1: that many sessions, each at `position`, decode one token each in one
        batched step (batched_decode_step); the step's seconds, for all of them."""
        if sessions != 1:
            if sessions < 1:
                raise ValueError(f"sessions {sessions}: the sessions decoding in the step, at least 1")
            return self.batched_decode_step([position] * sessions)
        context, threads = self.step_context(1, position), self.decode_pool_threads
        layers = sum(self.layer_seconds(*self.split_layer(l, 1, position, context, threads))
                     for l in range(len(self.layers)))
        return float(self.forward_time(layers, 1, decode=True, eager=self.decode_is_eager(),
                                       ops_per_layer=self.step_ops_per_layer(1)))

    # ----- several sessions decoding at once (module docstring) ---------------------------------
    def session_positions(self, positions) -> np.ndarray:
        """[B] each session's position (`at`: None is the end of the plan's context) for a batched step."""
        if len(positions) < 1:
            raise ValueError("positions: one per session of the batched step, at least one")
        return np.array([self.at(1, p) for p in positions], dtype=np.int64)

    def batched_before_experts_time(self, layer: int, positions, fixed_shape: bool = True,
                                    on_host: bool = False) -> float:
        """before_experts_time of a step of B sessions' tokens, one each, session b after positions[b]: the dense
        weights read once for the B tokens, each session's attention and indexer against its own KV rows, those of
        a fixed-shape step or, not `fixed_shape`, the rows visible to it. The runtime's batched step reads one
        decode context for the whole batch (runtime/engine/batch_runner.py): the one its furthest session needs."""
        l = self.layers[layer]
        shared_bytes, shared_params = self._shared[layer]
        at = self.session_positions(positions)
        context = max(self.step_context(1, int(p)) for p in at)
        rows = np.full(len(at), context) if fixed_shape else at + 1   # [B]
        return float(self._dense_time(layer, l.dense_bytes - shared_bytes, l.dense_params - shared_params, 1, rows,
                                      fixed_shape, on_host, per_session=True))

    def batched_attention_time(self, layer: int, positions, on_host: bool = False, fixed_shape: bool = False) -> float:
        """attention_time of a batched step: batched_before_experts_time plus the shared expert over the B tokens
        (a system that runs a layer's dense part as one block: llama.cpp's slots)."""
        return (self.batched_before_experts_time(layer, positions, fixed_shape, on_host)
                + self.shared_expert_time(layer, len(positions), on_host))

    def batched_split_layer(self, layer: int, positions, fixed_shape: bool = True,
                            grouped_hot: bool = False) -> tuple[float, float, float]:
        """(seconds before the experts, GPU seconds, CPU seconds) of a layer in a step of B sessions' tokens, one
        each: the shared expert over the B tokens; each token's hot routes read their experts on a GPU (the decode
        kernel's per-route programs, as bucket_layer prices them: B times one token's distinct hot experts), or,
        `grouped_hot` (a kernel that groups the step's routes by expert) and on a cpu-only spec, each distinct hot
        expert of the B tokens once; the cold routes of all B tokens in one host task over their distinct experts,
        the CPU expert pool at the decode threads (pool_threads.py)."""
        B, threads = len(positions), self.decode_pool_threads
        hot_routes = self.routes(layer, B, True)
        reads = self.distinct(layer, B, True) if grouped_hot or self.hw.cpu_only else B * self.distinct(layer, 1, True)
        gpu = self.shared_expert_time(layer, B) + self.gpu_experts_time(reads, hot_routes, threads)
        cpu = self.cpu_experts_time(B, self.distinct(layer, B, False), self.routes(layer, B, False), threads)
        return self.batched_before_experts_time(layer, positions, fixed_shape), gpu, cpu

    def batched_decode_step(self, positions, fixed_shape: bool = True, grouped_hot: bool = False,
                            eager: bool | None = None) -> float:
        """Seconds of one step in which B = len(positions) sessions decode one token each, session b after
        positions[b] tokens (None: the end of the plan's context): batched_split_layer's layers in the layer order,
        the B tokens' hidden states across the GPU boundaries, the head over B rows, one graph launch per GPU.
        `fixed_shape` False: each session's attention reads the rows visible to it (a baseline's paged attention);
        `eager`: the step is dispatched op by op at the dynamic forward's ops per layer (None: as decode_step is,
        replayed on GPUs). One session at its position costs exactly decode_step(position)."""
        at = self.session_positions(positions)
        B = len(at)
        if self.hw.cpu_only and B > 1:
            # the runtime's batched CPU step (runtime/engine/batch_runner.py: compiled like the decode step, eager
            # when that fails) runs one attention per session: its host cost per layer is not measured for B
            # sessions (COMPILED_STEP_OPS_PER_LAYER and bench/count_ops.py are the solo step's)
            raise ValueError(f"{B} sessions on the cpu-only spec {self.hw.name}: the batched CPU step's dispatch is "
                             "not counted; bench/parallel_sessions.py measures it")
        layers = sum(self.layer_seconds(*self.batched_split_layer(l, at, fixed_shape, grouped_hot))
                     for l in range(len(self.layers)))
        ops = self.step_ops_per_layer(1) if eager is None else None
        return float(self.forward_time(layers, B, decode=True, eager=self.decode_is_eager() if eager is None else eager,
                                       ops_per_layer=ops, head_tokens=B))
