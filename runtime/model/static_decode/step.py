"""The whole model's step at a fixed shape: T tokens through every layer, no host reads.

    step = StaticStep(model, max_context=4096)          # T = 1: the decode step
    step.load(session.cache)          # host: copy the dynamic cache in
    step.set_tokens([tok]); step.run()   # step.logits [V] float32: the next token's logits
    step.store(session.cache)         # host: write back what the steps added
    bucket = StaticStep(model, 4096, tokens=16, state=step.state)   # a prefill bucket on the same buffers

Every tensor shape is independent of the position and `run_segment(i)` reads no device data on the
host, so a CUDA graph can capture each segment once and replay it every step. Steps of several
token counts (the decode step and the short-prefill buckets, engine/step_runner.py) share one
`DecodeState`: a session's cache is loaded once and every step continues where the last one ended. Segments are the runs
of consecutive layers on one planned GPU (segments.py); `run_segment(i)` touches only segment i's
buffers (one device: a capture records one device's work, and RTX 4090s have no peer access): it
reads its input buffers (segment 0: the `token` buffer and the embedding, which must live on the
first layer's device), advances its own position tensor by 1 in place and writes its output buffer
(the last one: the logits buffer, the last token's logits). `hand_off(i)`, on the host between
segments, copies segment i's output and token into segment i+1's inputs. The routes of every layer
land in per-segment buffers (`routes()` reads them on the host).

`run()` runs segments and hand-offs eagerly; a graph runner (engine/decode_graphs.py) instead calls
`check_room()`, replays each segment's graph followed by its hand-off, and `note_step()`.

Legend: T tokens per step, N hc_mult streams, D hidden, V vocab, k experts per token, L layers.
"""

from __future__ import annotations

import copy

import torch

from ..fused import using
from ..model import Model, decoder_block
from .attention import attention_step
from .moe import moe_step
from .segments import Segment, pipeline_segments
from .state import DecodeState, check_context


class StaticStep:
    """One model's fixed-shape step of `tokens` tokens for contexts up to max_context tokens."""

    def __init__(self, model: Model, max_context: int, layer_gpus: list[int] | None = None, tokens: int = 1,
                 state: DecodeState | None = None, streams: bool = False, all_logits: bool = False):
        """`layer_gpus`: the plan's GPU of each layer, for the segments (default: by torch device);
        `state`: another step's buffers to share (same model and max_context), else new ones;
        `streams`: keep the tokens' last-layer residual streams (`streams` [T, N, D]: the MTP block drafts
        from them); `all_logits`: every token's logits (`all_logits` [T, V]: a speculative verify step's)."""
        if tokens < 1:
            raise ValueError(f"a static step takes at least 1 token, not {tokens}")
        cfg, T = model.config, tokens
        self.model = model
        self.segments: list[Segment] = pipeline_segments(model.layer_devices, layer_gpus)
        first, last = self.segments[0].device, self.segments[-1].device
        embed = model.weights.embed.device
        if (embed.type, embed.index or 0) != (first.type, first.index or 0):
            raise ValueError(f"static decode: the embedding is on {embed}, the first layer on {first}; load the "
                             f"model with device={first} (segment 0's graph cannot read another device)")
        if state is not None and state.max_context != max_context:
            raise ValueError(f"a shared state holds max_context={state.max_context}, not {max_context}")
        self.state = state or DecodeState(model.weights.layers, self.segments, max_context, model.dtype)
        self.context = max_context  # the contexts this step runs at (within(): fewer, reading fewer rows)
        self.layers = self.state.layers  # what the step reads and writes of each layer's buffers
        self.tokens = T
        N, D, k = cfg.hc_mult, cfg.hidden_size, cfg.num_experts_per_tok
        self.token = torch.zeros(T, dtype=torch.long, device=first)  # [T] input
        # Per segment: token ids and residual streams in (segment 0: `token` and the embedding), streams
        # out (the last one: `logits`), routes of its layers, the tokens' offsets from the position.
        self.token_in = [self.token] + [torch.zeros(T, dtype=torch.long, device=s.device)
                                        for s in self.segments[1:]]  # [T] each
        self.streams_in = [None] + [torch.zeros(T, N, D, device=s.device) for s in self.segments[1:]]  # [T, N, D]
        self.streams_out = [torch.zeros(T, N, D, device=s.device) for s in self.segments[:-1]] + [None]  # float32
        self.expert_ids = [torch.zeros(s.end_layer - s.first_layer, T, k, dtype=torch.long, device=s.device)
                           for s in self.segments]  # [layers of the segment, T, k]
        self.expert_weights = [torch.zeros(s.end_layer - s.first_layer, T, k, device=s.device)
                               for s in self.segments]
        self.offsets = [torch.arange(T, device=s.device) for s in self.segments]  # [T]
        self.every_logit = all_logits
        self.all_logits = torch.zeros(T if all_logits else 1, cfg.vocab_size, device=last)  # [T or 1, V] float32
        self.logits = self.all_logits[-1]  # [V]: the last token's logits (a view)
        self.streams = torch.zeros(T, N, D, device=last) if streams else None  # [T, N, D] float32

    def within(self, context: int) -> StaticStep:
        """This step for contexts up to `context` <= max_context tokens: every buffer shared (the state, the
        token, logits, routes and streams buffers), but the compressors' rows read only up to `context`
        tokens' (views), so attention and the indexer score R_b = ceil(context / m) rows instead of R.
        Exact: rows past the position are masked either way, and the indexer keeps the same visible picks
        (static_decode/indexer.py: k = min(index_topk, R_b) is still at least what is visible)."""
        if not 1 <= context <= self.max_context:
            raise ValueError(f"a step within {context} tokens of context: 1..max_context={self.max_context}")
        view = copy.copy(self)
        view.context, view.layers = context, [ls.within(context) for ls in self.state.layers]
        return view

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
        """Tokens stepped (by any step on this state) since the last load()."""
        return self.state.position - self.state.loaded_at

    def load(self, cache) -> None:
        """Copy a dynamic KvCache in (it stays valid; store() brings it up to date later)."""
        self.state.load(cache)

    def store(self, cache) -> None:
        """Write what the steps added into `cache`, the cache last loaded (or stored) and not advanced since."""
        self.state.store(cache)

    def set_tokens(self, token_ids) -> None:
        """The next step's T token ids (ints, or a tensor [T])."""
        if isinstance(token_ids, list) and self.token.device.type == "cpu" and len(token_ids) == self.tokens:
            self.token.numpy()[:] = token_ids  # one numpy write: ~40 us less a decode token than as_tensor + copy_
            return
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if ids.numel() != self.tokens:
            raise ValueError(f"this step takes {self.tokens} tokens, got {ids.numel()}")
        self.token.copy_(ids)

    def check_room(self, steps: int = 1) -> None:
        """Raise before `steps` steps that would go beyond this step's context (max_context, or within()'s)."""
        check_context(self.state.position + steps * self.tokens, self.context,
                      f"{steps} step(s) of {self.tokens} token(s) at position {self.state.position}")

    def rewind(self) -> None:
        """Position 0 without a cache, for warm-up runs (engine/decode_graphs.py): they write stale rows
        and slots, which the load() that must follow replaces or masks; store() refuses until then."""
        for pos in self.state.positions:
            pos.zero_()
        self.state.position = self.state.loaded_at = 0
        self.state.synced = None

    def note_step(self) -> None:
        """Host bookkeeping after all segments ran once."""
        self.state.position += self.tokens

    def run(self) -> torch.Tensor:
        """T tokens (the `token` buffer) through the model, eagerly -> the `logits` buffer [V] (the last one's)."""
        self.check_room()
        for i in range(len(self.segments)):
            self.run_segment(i)
            self.hand_off(i)
        self.note_step()
        return self.logits

    def hand_off(self, i: int) -> None:
        """Host side, after segment i: copy its output streams and token into segment i+1's input
        buffers (nothing after the last). Not part of a graph; across GPUs copy_ orders itself after
        both devices' current streams (and goes through the host without peer access)."""
        if i + 1 < len(self.segments):
            self.streams_in[i + 1].copy_(self.streams_out[i])
            self.token_in[i + 1].copy_(self.token_in[i])

    def route_ids(self) -> torch.Tensor:
        """The last step's expert ids, on the CPU: [L, T, k] int64 (what counters need every step). With one CPU
        segment, the step's own buffer (no op: read it before the next step), else a copy."""
        if len(self.expert_ids) == 1 and self.expert_ids[0].device.type == "cpu":
            return self.expert_ids[0]
        return torch.cat([t.cpu() for t in self.expert_ids])

    def routes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The last step's routes, on the CPU: (expert ids [L, T, k] int64, weights [L, T, k] float32)."""
        return self.route_ids(), torch.cat([t.cpu() for t in self.expert_weights])

    # Device side: capturable, no host reads, fixed shapes.

    @torch.no_grad()
    def run_segment(self, i: int) -> None:
        with using(self.model.dense_ops):  # the plan's norm and rope kernels (a host-side switch, not captured)
            self._run_segment(i)

    def _run_segment(self, i: int) -> None:
        seg, token = self.segments[i], self.token_in[i]  # [T]
        positions = self.state.positions[i] + self.offsets[i]  # [T]
        streams = self._embed() if i == 0 else self.streams_in[i]  # [T, N, D] float32
        for layer in range(seg.first_layer, seg.end_layer):
            streams = self._layer(layer, streams, token, positions, i)
        if i + 1 < len(self.segments):
            self.streams_out[i].copy_(streams)
        else:
            if self.streams is not None:
                self.streams.copy_(streams)
            self.all_logits.copy_(self.model.head(streams if self.every_logit else streams[-1:]))
        self.state.positions[i].add_(self.tokens)

    def _embed(self) -> torch.Tensor:
        """The `token` buffer's embeddings -> residual streams [T, N, D] float32."""
        x = self.model.weights.embed.index_select(0, self.token).float()  # [T, D]
        return x.unsqueeze(1).expand(self.tokens, self.model.config.hc_mult, -1).contiguous()  # [T, N, D]

    def _layer(self, layer: int, streams: torch.Tensor, token: torch.Tensor, positions: torch.Tensor,
               seg: int) -> torch.Tensor:
        m, lw, ls = self.model, self.model.weights.layers[layer], self.layers[layer]
        dev, eps = self.segments[seg].device, self.model.config.rms_norm_eps
        rope = m.ropes[dev]["main" if lw.kind == "sliding" else "compress"]
        row = layer - self.segments[seg].first_layer
        return decoder_block(
            lw, streams, m.hc_settings(),
            lambda x: attention_step(lw.attn, ls, x, positions, rope, eps),
            lambda x: moe_step(lw.moe, layer, x, token, m.executor, self.expert_ids[seg][row],
                               self.expert_weights[seg][row]))
