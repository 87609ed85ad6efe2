"""The MTP block's draft at a fixed shape (static twin of ../mtp.py): P pairs, the last one's draft logits.

    step = StaticMtpStep(model, max_context, pairs=1)     # after a rejection or a plain decode step
    two = StaticMtpStep(model, max_context, pairs=2, state=step.state)   # after a kept draft
    step.load(cache, position); step.set_pairs(streams, next_ids); step.run()   # step.logits [V]
    step.store(cache)

A speculative decode step drafts from one pair (the pending token after a rejection) or two (the kept
draft's pair as well), so two steps share one MTP block state (`MtpState`: its layer's static buffers,
static_decode/state.py, and a position tensor). Like StaticStep it has no host reads and fixed shapes,
so a CUDA graph captures it (engine/decode_graphs.py sees one segment on the head's device:
`segments`, `run_segment`, `hand_off`, `rewind`, `check_room`, `note_step`). Positions are the
drafter's (engine/drafter.py: they count from where its cache started).

Legend: P pairs, N hc_mult streams, D hidden, V vocab, k experts per token.
"""

from __future__ import annotations

import torch

from ..fp8_matrix import linear
from ..fused import using
from ..kv_cache import LayerCache
from ..model import Model, decoder_block
from ..norms import rms_norm
from .attention import attention_step
from .moe import moe_step
from .segments import Segment
from .state import LayerState, check_context


class MtpState:
    """The MTP block's static buffers and position; `synced`: the position at which its dynamic cache last
    agreed with them (None: warm-up runs left them stale)."""

    def __init__(self, model: Model, max_context: int, k: int = 0):
        self.max_context = max_context
        dev = model.layer_devices[-1]
        self.positions = [torch.zeros(1, dtype=torch.long, device=dev)]  # [1]
        self.layer = LayerState(model.weights.mtp[k].block, max_context, model.dtype, dev, self.positions[0])
        self.position, self.synced = 0, None

    def load(self, cache: LayerCache, position: int) -> None:
        check_context(position, self.max_context, "the MTP block's load(cache)")
        self.layer.load(cache, position)
        self.positions[0].fill_(position)
        self.position = self.synced = position

    def store(self, cache: LayerCache) -> None:
        """Write what the steps added into `cache`, the one last loaded (not advanced since)."""
        if self.synced is None:
            raise ValueError("store(cache): the MTP buffers were not loaded since their warm-up runs")
        self.layer.store(cache, self.position)
        self.synced = self.position


class StaticMtpStep:
    def __init__(self, model: Model, max_context: int, pairs: int = 1, state: MtpState | None = None, k: int = 0):
        cfg = model.config
        self.model, self.k, self.tokens = model, k, pairs
        dev = model.layer_devices[-1]
        self.segments = [Segment(dev, cfg.n_layers + k, cfg.n_layers + k + 1)]  # one, by the head
        self.state = state or MtpState(model, max_context, k)
        N, D, top = cfg.hc_mult, cfg.hidden_size, cfg.num_experts_per_tok
        self.streams = torch.zeros(pairs, N, D, device=dev)             # [P, N, D] the main model's, in
        self.next_ids = torch.zeros(pairs, dtype=torch.long, device=dev)  # [P] the token after each, in
        self.embedded = torch.zeros(pairs, D, device=dev)  # [P, D] float32: their embeddings, in
        self.offsets = torch.arange(pairs, device=dev)                  # [P]
        self.expert_ids = torch.zeros(pairs, top, dtype=torch.long, device=dev)  # [P, k] routes, out
        self.expert_weights = torch.zeros(pairs, top, device=dev)
        self.logits = torch.zeros(cfg.vocab_size, device=dev)           # [V] the last pair's draft, out

    @property
    def max_context(self) -> int:
        return self.state.max_context

    # Host side.
    def set_pairs(self, streams: torch.Tensor, next_ids) -> None:
        """The next run's P pairs: the main model's streams [P, N, D] and the token after each [P]. The
        embedding rows are gathered here, on the host's side of the graph: the embedding lives with the
        first layer, and a graph on the head's GPU cannot read another GPU."""
        ids = torch.as_tensor(next_ids, dtype=torch.long).reshape(-1)
        embed = self.model.weights.embed
        self.streams.copy_(streams)
        self.next_ids.copy_(ids)
        self.embedded.copy_(embed.index_select(0, ids.to(embed.device)).float())

    def check_room(self, steps: int = 1) -> None:
        check_context(self.state.position + steps * self.tokens, self.max_context,
                      f"{steps} MTP step(s) of {self.tokens} pair(s) at position {self.state.position}")

    def rewind(self) -> None:
        """Position 0, for warm-up runs; the state must be loaded before it is stored again."""
        self.state.positions[0].zero_()
        self.state.position, self.state.synced = 0, None

    def note_step(self) -> None:
        self.state.position += self.tokens

    def hand_off(self, i: int) -> None:
        """One segment: nothing to hand on."""

    def run(self) -> torch.Tensor:
        self.check_room()
        self.run_segment(0)
        self.note_step()
        return self.logits

    def route_ids(self) -> torch.Tensor:
        """The last run's expert ids on the CPU, [1, P, k] (one layer)."""
        return self.expert_ids.cpu()[None]

    # Device side: capturable.
    @torch.no_grad()
    def run_segment(self, i: int = 0) -> None:
        m, cfg = self.model, self.model.config
        mw = m.weights.mtp[self.k]
        lw, ls, eps = mw.block, self.state.layer, cfg.rms_norm_eps
        dev = self.segments[0].device
        with using(m.dense_ops):
            e = rms_norm(self.embedded, mw.enorm, eps)  # [P, D]
            h = rms_norm(self.streams, mw.hnorm, eps)  # [P, N, D]
            hp = linear(h.reshape(-1, h.shape[-1]).to(m.dtype), mw.h_proj).float().view(h.shape)
            x = linear(e.to(m.dtype), mw.e_proj).float().unsqueeze(1) + hp  # [P, N, D] float32 residual
            positions = self.state.positions[0] + self.offsets  # [P]
            rope = m.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
            x = decoder_block(lw, x, m.hc_settings(),
                              lambda y: attention_step(lw.attn, ls, y, positions, rope, eps),
                              lambda y: moe_step(lw.moe, lw.index, y, self.next_ids, m.executor, self.expert_ids,
                                                 self.expert_weights))
            self.logits.copy_(m.head(x[-1:], mw.hc_head, mw.norm)[0])
        self.state.positions[0].add_(self.tokens)
