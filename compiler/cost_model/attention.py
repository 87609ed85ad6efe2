"""The dense part of a layer by position: attention (with its compressor and CSA indexer), mHC, norms, the router
and the shared expert, for a forward of n tokens at the session's position.

A forward of n tokens after `position` tokens already in the session (its cached
prefix) reads per layer, in elements of the KV rows' dtype (the dense format's, memory_model.DENSE_FORMATS):
the sliding window (sliding_window rows of head_dim); an HCA layer's compressed rows (one per 128 tokens,
every one scored by every query, masked past its own); a CSA layer's index keys (one per 4 tokens,
index_head_dim wide: the indexer scores every one, index_n_heads x index_head_dim multiply-adds per row
and query) and the rows it picks (index_topk per query, head_dim wide). Core attention is 4 x heads x
head_dim FLOP per key and query (q.k and p.v). Which rows exist depends on how the forward runs:
- a dynamic forward (eager prefill here; the baselines' paged attention, decode included) reads the rows
  visible after position + n tokens (complete windows: (position + n) // ratio); the runtime's CSA layer
  scores every row instead of gathering picks while rows x heads <= CSA_DENSE_MAX_RATIO x picks x head_dim
  (runtime/model/attention.py's own rule; another system's kernels are priced at the picks alone,
  with_csa_picks_only);
- a fixed-shape step (the decode step, bucket and verify steps: runtime/model/static_decode) reads and
  scores every row its buffers hold, ceil(context / ratio), masked past the position: the decode step of the
  smallest of buckets.decode_contexts that holds the position (compiled per context on the CPU, captured per
  context on GPUs), the 2-token step (verify, bucket of 2) likewise, every larger step (one per size) the plan's
  context (step_context).
`position` None (every method's default) is the end of the plan's context (context - n, at least 0): the
most a forward of n tokens costs within the plan, the bound the plan's predictions state. The session
simulator passes each turn's real position.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from ostinato.buckets import decode_contexts

from .indexer import fused_indexer_bytes, indexer_bytes

if TYPE_CHECKING:
    from .model import CostModel

# A dynamic forward's CSA layer scores every compressed row and masks the unpicked ones while rows x heads <=
# this x picks x head_dim, else gathers each query's picks: runtime/model/attention.py's CSA_DENSE_MAX_RATIO
# (the compiler may not import the runtime; tests/test_cost_model_position.py checks the two agree).
CSA_DENSE_MAX_RATIO = 1.0
KV_ELEMENT_BYTES = 2  # a KV row's element when the dense format is not known: bf16 (memory_model.DENSE_FORMATS)


class AttentionPricing:
    """CostModel's dense part by position (it sets cfg, hw, layers, context, kv_element_bytes, the shared
    expert's part of each layer _shared, csa_dense_max_ratio, indexer_materializes and indexer_fuses_on_gpu)."""

    def at(self, n: int, position: int | None) -> int:
        """The position a forward of n tokens starts at: `position` (tokens already in the session), or for
        None the end of the plan's context, context - n (at least 0)."""
        if position is None:
            return max(0, self.context - n)
        if position < 0:
            raise ValueError(f"position {position}: the tokens already in the session, >= 0")
        return int(position)

    def step_context(self, T: int, position: int | None = None) -> int:
        """The context whose rows a fixed-shape step of T tokens at `position` reads (runtime/engine/step_runner.py):
        the decode step (T = 1) and the 2-token step (a speculative verify, or the bucket of 2) of the smallest of
        buckets.decode_contexts that holds its tokens (compiled per context on the CPU, captured per context on
        GPUs); every other step (one per size) the plan's context."""
        if T <= 2:
            after = self.at(T, position) + T
            return next((c for c in decode_contexts(self.context) if after <= c), self.context)
        return self.context

    def attention_work(self, layer: int, n, rows_context, fixed_shape: bool = False):
        """(FLOPs, KV bytes) of the core attention and the CSA indexer's scoring of n queries of `layer` (an
        MTP index: its attention kind) when the rows of `rows_context` tokens exist (the module docstring):
        a dynamic forward's visible rows (position + n) or, `fixed_shape`, a step's buffers (step_context).
        Projections are not in it (dense_params). Elementwise over arrays of rows_context."""
        cfg = self.cfg
        H, hd, W = cfg.num_attention_heads, cfg.head_dim, cfg.sliding_window
        ratio = cfg.compress_ratio(layer)
        ctx = np.asarray(rows_context)
        rows = ((-(-ctx // ratio)) if fixed_shape else ctx // ratio) if ratio else np.zeros_like(ctx)
        keys, read, score = W + 0 * rows, W * hd + 0 * rows, 0 * rows   # per query; elements read; indexer FLOPs
        if ratio == 4:      # CSA: the indexer scores every row's index key, attention takes its picks
            picks = np.minimum(cfg.index_topk, rows)
            dense = (rows * H <= self.csa_dense_max_ratio * picks * hd) if not fixed_shape \
                else np.zeros_like(rows, bool)
            keys = keys + np.where(dense, rows, picks)
            read = read + np.where(dense, rows, np.minimum(rows, n * picks)) * hd + rows * cfg.index_head_dim
            score = 2 * cfg.index_n_heads * cfg.index_head_dim * rows
        elif ratio:         # HCA: every row, masked per query
            keys, read = keys + rows, read + rows * hd
        flops = n * (4 * H * hd * keys + score)
        out = (flops, read * self.kv_element_bytes)
        return out if ctx.ndim else (float(out[0]), float(out[1]))

    def _rows_context(self, n: int, position, step_context: int | None):
        """What attention_work reads: a step's context, else the visible rows after position + n."""
        if step_context is not None:
            return step_context
        return (self.at(n, None) if position is None else np.asarray(position)) + n

    def before_experts_time(self, layer: int, n: int, position=None, on_host: bool = False,
                            step_context: int | None = None):
        """Seconds of the layer's dense part that runs before its experts (attention with its compressor and
        indexer, mHC, norms, the router: every dense weight but the shared expert's) for n tokens after
        `position` on the layer's GPU (or on the host). `step_context`: a fixed-shape step's (step_context()),
        which reads its buffers' rows whatever the position; None: a dynamic forward's. `position` may be an
        array of positions (one step each): the seconds come back as an array."""
        l = self.layers[layer]
        shared_bytes, shared_params = self._shared[layer]
        return self._dense_time(layer, l.dense_bytes - shared_bytes, l.dense_params - shared_params, n,
                                self._rows_context(n, position, step_context), step_context is not None, on_host)

    def shared_expert_time(self, layer: int, n: int, on_host: bool = False) -> float:
        """Seconds of the layer's shared expert for n tokens: it needs the router's input only, so it runs beside
        the routed experts (0 when the dense format is not known: then it is in before_experts_time)."""
        g = self.hw.host if on_host else self.hw.gpus
        shared_bytes, shared_params = self._shared[layer]
        return max(shared_bytes / g.bandwidth, 2 * n * shared_params / g.matmul_flops)

    def attention_time(self, layer: int, n: int, position=None, on_host: bool = False,
                       step_context: int | None = None):
        """The layer's whole dense part, before_experts_time + shared_expert_time: what a system that runs a
        layer's dense part as one block prices (llama.cpp's layer placement runs whole layers on the host)."""
        return (self.before_experts_time(layer, n, position, on_host, step_context)
                + self.shared_expert_time(layer, n, on_host))

    def _dense_time(self, layer: int, dense_bytes: int, dense_params: int, n: int, rows_context,
                    fixed_shape: bool, on_host: bool = False, per_session: bool = False):
        """Dense weights (`dense_params` multiply-adds per token) and `layer`'s attention work (its index: its
        attention kind) over rows_context's rows: the longer of reading and computing. `per_session`: rows_context
        holds one entry per session of a batched step (n tokens each, against its own KV rows), so the sessions'
        attention work and indexer bytes add up while the dense weights are read once for all their tokens."""
        g = self.hw.host if on_host else self.hw.gpus
        att_flops, kv_bytes = self.attention_work(layer, n, rows_context, fixed_shape)
        # the indexer's intermediates are passes of their own after its matmul: added (indexer_time)
        scratch = self.indexer_scratch_bytes(layer, n, rows_context, fixed_shape, on_host)
        tokens = n
        if per_session:
            att_flops, kv_bytes, scratch = float(np.sum(att_flops)), float(np.sum(kv_bytes)), float(np.sum(scratch))
            tokens = n * len(rows_context)
        flops = 2 * tokens * dense_params + att_flops
        return np.maximum((dense_bytes + kv_bytes) / g.bandwidth, flops / g.matmul_flops) + scratch / g.bandwidth

    def indexer_scratch_bytes(self, layer: int, n, rows_context, fixed_shape: bool = False, on_host: bool = False):
        """Bytes of the CSA indexer's intermediates for n queries of `layer` over the rows attention_work scores
        (0 on a layer without an indexer): on a GPU the fused kernel's scores (fused_indexer_bytes, while
        indexer_fuses_on_gpu), on the host and a cpu-only spec torch's materialized tensors (indexer_bytes).
        Elementwise over arrays of rows_context."""
        ctx = np.asarray(rows_context)
        if self.cfg.compress_ratio(layer) != 4 or not self.indexer_materializes:
            return 0 * ctx
        rows = -(-ctx // 4) if fixed_shape else ctx // 4
        if self.indexer_fuses_on_gpu and not on_host and not self.hw.cpu_only:
            return fused_indexer_bytes(self.cfg.index_n_heads, self.cfg.index_head_dim, n, rows, KV_ELEMENT_BYTES)
        return indexer_bytes(self.cfg.index_n_heads, n, rows)

    def with_csa_picks_only(self) -> CostModel:
        """The same model for a system whose CSA attention takes each query's index_topk picks whatever the rows
        and whose indexer keeps its scores out of memory (a baseline's own kernels, not measured here: priced at
        the model's work, its FLOPs and the rows it reads), not the runtime's dense scoring of few rows
        (CSA_DENSE_MAX_RATIO) nor its materialized score tensors (indexer_bytes)."""
        other = copy.copy(self)
        other.csa_dense_max_ratio = 0.0
        other.indexer_materializes = False
        return other
