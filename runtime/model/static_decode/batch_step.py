"""Several sessions' decode tokens in one fixed-shape step: one token per slot, each slot its own state.

    slots = [StaticStep(model, 4096) for _ in range(4)]   # a T = 1 step each, with its own DecodeState
    for slot, session in zip(slots, sessions): slot.load(session.cache)
    batch = BatchStep(slots)
    batch.set_tokens([t0, t1, t2, t3]); batch.run()       # batch.all_logits [4, V]: row b is slot b's next logits

A StaticStep of T = B tokens whose tokens belong to B sessions instead of one: everything that does not read
a session's own cache runs once over the B tokens (the embedding, mHC, the norms, routing, the routed and
shared experts: every weight read once per step, the cold routes of all B tokens in one expert task; the
head), and attention runs per slot, on that slot's buffers at its own position (attention_step with T = 1:
the solo decode step's ops). Row b of every batched op is a function of row b alone, so each session's
logits are its solo step's up to the last bits of products whose kernel depends on the row count (greedy
tokens equal, as across the prefill buckets; tests/test_batch_decode.py).

Like StaticStep it has fixed shapes, reads no device value on the host and touches only segment i's buffers
in run_segment(i) (every slot's position tensor of segment i advances by one), so the engine compiles it on
the CPU as it compiles the decode step (engine/cpu_step.py) and a graph runner could capture it.
`within(context)` reads every slot's compressed rows up to `context` tokens' (the largest position of the
batch decides: exact for every slot below it).

Legend: B sessions (one token each), N hc_mult streams, D hidden, V vocab, k experts per token.
"""

from __future__ import annotations

import torch

from ..model import decoder_block
from .attention import attention_step
from .moe import moe_step
from .state import check_context
from .step import StaticStep


class BatchStep(StaticStep):
    """The decode step of B slots: T = 1 StaticSteps of one model and max_context, each with its own state."""

    def __init__(self, slots: list[StaticStep]):
        if not slots or any(s.tokens != 1 for s in slots):
            raise ValueError("a batch step takes one or more T = 1 steps (its slots)")
        first = slots[0]
        if (any(s.model is not first.model or s.segments != first.segments or s.max_context != first.max_context
                for s in slots) or len({id(s.state) for s in slots}) != len(slots)):
            raise ValueError("a batch step's slots are steps of one model, segments and max_context, each with "
                             "its own state")
        gpus = [i for i, seg in enumerate(first.segments) for _ in range(seg.first_layer, seg.end_layer)]
        # the base class's buffers at T = B (token, streams, routes, every token's logits); its `state` is
        # slot 0's, which it never reads: every state access below goes through the slots
        super().__init__(first.model, first.max_context, gpus, tokens=len(slots), state=first.state,
                         streams=True, all_logits=True)
        self.slots = slots
        self.slot_layers = [s.state.layers for s in slots]  # [B][L] the buffers each slot's attention reads

    def within(self, context: int) -> BatchStep:
        view = super().within(context)
        view.slot_layers = [[ls.within(context) for ls in s.state.layers] for s in self.slots]
        return view

    @property
    def position(self) -> int:
        """The furthest slot's tokens (what `within` must hold)."""
        return max(s.state.position for s in self.slots)

    def check_room(self, steps: int = 1) -> None:
        for b, s in enumerate(self.slots):
            check_context(s.state.position + steps, self.context, f"slot {b}: {steps} step(s) at position "
                                                                  f"{s.state.position}")

    def note_step(self) -> None:
        for s in self.slots:
            s.state.position += 1

    def rewind(self) -> None:
        for s in self.slots:
            s.rewind()

    def _run_segment(self, i: int) -> None:
        seg, token = self.segments[i], self.token_in[i]  # [B]
        positions = torch.cat([s.state.positions[i] for s in self.slots])  # [B]: each slot's own
        streams = self._embed() if i == 0 else self.streams_in[i]  # [B, N, D] float32
        for layer in range(seg.first_layer, seg.end_layer):
            streams = self._layer(layer, streams, token, positions, i)
        if i + 1 < len(self.segments):
            self.streams_out[i].copy_(streams)
        else:
            self.streams.copy_(streams)
            self.all_logits.copy_(self.model.head(streams))  # [B, V]
        for s in self.slots:
            s.state.positions[i].add_(1)

    def _layer(self, layer: int, streams: torch.Tensor, token: torch.Tensor, positions: torch.Tensor,
               seg: int) -> torch.Tensor:
        m, lw = self.model, self.model.weights.layers[layer]
        dev, eps = self.segments[seg].device, self.model.config.rms_norm_eps
        rope = m.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
        row = layer - self.segments[seg].first_layer

        def attn(x: torch.Tensor) -> torch.Tensor:  # x [B, D] -> [B, D]: row b on slot b's cache
            return torch.cat([attention_step(lw.attn, layers[layer], x[b:b + 1], positions[b:b + 1], rope, eps)
                              for b, layers in enumerate(self.slot_layers)])

        return decoder_block(
            lw, streams, m.hc_settings(), attn,
            lambda x: moe_step(lw.moe, layer, x, token, m.executor, self.expert_ids[seg][row],
                               self.expert_weights[seg][row]))

