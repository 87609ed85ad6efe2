"""The whole model's decode step at a fixed shape: one token through every layer, no host reads.

    step = StaticDecodeStep(model, max_context=4096)
    step.load(session.cache)          # host: copy the dynamic cache in
    step.set_token(tok); step.run()   # step.logits [V] float32: the next token's logits
    step.store(session.cache)         # host: write back what the steps added

Every tensor shape is independent of the position and `run_segment(i)` reads no device data on the
host, so a CUDA graph can capture each segment once and replay it every token. Segments are the runs
of consecutive layers on one device (`model.layer_devices`); each reads its static input buffers
(residual streams, token id), writes the next segment's (copy_ across devices), advances its own
position tensor by 1 in place; the last one also writes the logits buffer. Segment 0 starts with the
embedding of the `token` buffer (on model.device; for graphs it should be the first layer's device).
The routes of every layer land in per-segment buffers (`routes()` reads them on the host).

On the CPU `run()` runs the segments eagerly; a graph runner would instead call `check_room()`,
replay the segments' graphs and `note_step()`.

Legend: N hc_mult streams, D hidden, V vocab, k experts per token, L layers.
"""

from __future__ import annotations

import torch

from ..model import Model, decoder_block
from .attention import attention_step
from .moe import moe_step
from .segments import Segment, pipeline_segments
from .state import DecodeState, check_context


class StaticDecodeStep:
    """One model's fixed-shape decode step for contexts up to max_context tokens (buffers sized for it)."""

    def __init__(self, model: Model, max_context: int):
        cfg = model.config
        self.model = model
        self.segments: list[Segment] = pipeline_segments(model.layer_devices)
        self.state = DecodeState(model.weights.layers, self.segments, max_context, model.dtype)
        self.loaded_at = 0  # host: position of the last load()
        N, D, k = cfg.hc_mult, cfg.hidden_size, cfg.num_experts_per_tok
        self.token = torch.zeros(1, dtype=torch.long, device=model.device)  # [1] input
        # Per segment: input buffers (segment 0's only used when the embedding lives elsewhere), routes.
        self.streams_in = [torch.zeros(1, N, D, device=s.device) for s in self.segments]  # [1, N, D] float32
        self.token_in = [torch.zeros(1, dtype=torch.long, device=s.device) for s in self.segments]  # [1]
        self.expert_ids = [torch.zeros(s.end_layer - s.first_layer, k, dtype=torch.long, device=s.device)
                           for s in self.segments]  # [layers of the segment, k]
        self.expert_weights = [torch.zeros(s.end_layer - s.first_layer, k, device=s.device)
                               for s in self.segments]
        self.logits = torch.zeros(cfg.vocab_size, device=self.segments[-1].device)  # [V] float32 output
        self._hc = (cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps, model.dtype)

    # Host side.

    @property
    def max_context(self) -> int:
        return self.state.max_context

    @property
    def position(self) -> int:
        """Tokens in the context after the steps taken (what the position tensors hold)."""
        return self.state.position

    @property
    def steps_taken(self) -> int:
        """Steps since the last load()."""
        return self.state.position - self.loaded_at

    def load(self, cache) -> None:
        """Copy a dynamic KvCache in (it stays valid; store() brings it up to date later)."""
        self.state.load(cache)
        self.loaded_at = cache.position

    def store(self, cache) -> None:
        """Write what the steps added into `cache`, the cache last loaded (or stored) and not advanced since."""
        self.state.store(cache)

    def set_token(self, token_id: int) -> None:
        self.token.fill_(token_id)

    def check_room(self) -> None:
        """Raise before a step that would go beyond max_context."""
        check_context(self.state.position + 1, self.max_context, f"decode step at position {self.state.position}")

    def note_step(self) -> None:
        """Host bookkeeping after all segments ran once."""
        self.state.position += 1

    def run(self) -> torch.Tensor:
        """One token (the `token` buffer) through the model, eagerly -> the `logits` buffer [V]."""
        self.check_room()
        for i in range(len(self.segments)):
            self.run_segment(i)
        self.note_step()
        return self.logits

    def route_ids(self) -> torch.Tensor:
        """The last step's expert ids, on the CPU: [L, k] int64 (what counters need every token)."""
        return torch.cat([t.cpu() for t in self.expert_ids])

    def routes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The last step's routes, on the CPU: (expert ids [L, k] int64, weights [L, k] float32)."""
        return self.route_ids(), torch.cat([t.cpu() for t in self.expert_weights])

    # Device side: capturable, no host reads, fixed shapes.

    @torch.no_grad()
    def run_segment(self, i: int) -> None:
        seg = self.segments[i]
        streams, token = self._segment_input(i)  # [1, N, D], [1]
        for layer in range(seg.first_layer, seg.end_layer):
            streams = self._layer(layer, streams, token, i)
        if i + 1 < len(self.segments):  # hand on to the next device
            self.streams_in[i + 1].copy_(streams)
            self.token_in[i + 1].copy_(token)
        else:
            self.logits.copy_(self.model.head(streams)[0])
        self.state.positions[i].add_(1)

    def _segment_input(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i > 0:
            return self.streams_in[i], self.token_in[i]
        cfg = self.model.config
        x = self.model.weights.embed.index_select(0, self.token).float()  # [1, D]
        streams = x.unsqueeze(1).expand(1, cfg.hc_mult, -1).contiguous()  # [1, N, D] float32 residual
        if self.token.device == self.streams_in[0].device:  # tensor devices: "cuda" is "cuda:0"
            return streams, self.token
        self.streams_in[0].copy_(streams)
        self.token_in[0].copy_(self.token)
        return self.streams_in[0], self.token_in[0]

    def _layer(self, layer: int, streams: torch.Tensor, token: torch.Tensor, seg: int) -> torch.Tensor:
        m, lw, ls = self.model, self.model.weights.layers[layer], self.state.layers[layer]
        dev, eps = self.segments[seg].device, self.model.config.rms_norm_eps
        rope = m.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
        row = layer - self.segments[seg].first_layer
        return decoder_block(
            lw, streams, self._hc,
            lambda x: attention_step(lw.attn, ls, x, rope, eps),
            lambda x: moe_step(lw.moe, layer, x, token, m.executor, self.expert_ids[seg][row],
                               self.expert_weights[seg][row]))
