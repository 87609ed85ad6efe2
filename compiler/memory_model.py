"""Exact memory model: the bytes every device holds under a placement, by kind.

Every formula is written out here so that a plan's numbers can be re-derived by hand:
- dense weights as the runtime holds them (runtime/model/loading.py; the allocation test checks the
  two agree): FP8 matrices as stored with their block scales (`fp8`: 1 B per element, computed in
  bf16), or dequantized to the plan's dense format (`bf16`: 2 B, `float32`: 4 B), the embedding, the
  LM head and the compressors' projections as stored (bf16; the last two multiplied in float32), integer
  tables as int64, everything else (norms, mHC, sinks, the compressors' position biases, router) in
  float32, as the reference computes them;
- routed experts at MXFP4 bytes including scales (13,369,344 B each for V4-Flash);
- KV cache per session (docs/model.md section 4), rows in the dense format's dtype: every layer a sliding ring of
  `sliding_window` rows of head_dim; compressed layers one row per `ratio` tokens; CSA also
  indexer keys (index_head_dim per 4 tokens); plus the compressors' fp32 partial-window state;
- decode-graph buffers (1-token workspace plus one context of static KV state), upload staging (two
  buffers of upload_group experts per GPU, and when the plan shards uploads, policy.shard_threshold, two of
  upload_group 1/G slices more: slice_bytes), prefill workspace and allocator headroom (formulas below);
- host rows of routed experts (host_expert_bytes): every cold expert's, and with re-placement between
  turns (policy.adapt idle, runtime/engine/adapter.py) every hot expert's of the model's layers too: a
  swap moves an expert into the slot of the one it evicts, so every hot pool keeps its size, but the
  evicted expert is computed and uploaded from its host row and a re-promoted one copied from it, so
  with GPUs those rows are pinned copies like the cold ones (runtime/engine/loader.py).
Legend: C prefill chunk tokens, N context tokens, S sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.formats import MXFP4_GROUP
from ostinato.checkpoint.tensor_specs import TensorSpec, global_specs, layer_specs, mtp_block_specs

# dense format -> bytes per element of the compute dtype (activations and KV rows; FP8 matrices too,
# unless the format keeps them as stored)
DENSE_FORMATS = {"fp8": 2, "bf16": 2, "float32": 4}
STATE_BYTES = 4       # fp32 compressor state (kv and gate logits of the incomplete windows)
ACT_BYTES = 4         # fp32 activations in the workspace bound (conservative)
ATTENTION_QUERY_BLOCK = 512   # prefill attention is computed in query blocks of this many tokens
# cuBLAS keeps a workspace per (handle, stream) it runs on, allocated by PyTorch's caching allocator on
# the stream's first matmul: 32 MiB on sm_90 and later (PyTorch's default, ":4096:8"; the cuBLAS docs'
# recommendation for Hopper), 8.1 MiB before; counted at the larger. The engine runs matmuls on two
# streams per GPU: the default one (dynamic prefill) and its capture stream (every step's warm-up and
# graphs, engine/streams.py); the cold routes' and upload streams only copy.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
CUBLAS_STREAMS = 2


def held_bytes(spec: TensorSpec, dense_format: str) -> int:
    """Bytes a device holds for one checkpoint tensor (routed experts are always packed MXFP4)."""
    elements = math.prod(spec.shape)
    if (spec.role in ("routed_expert", "embed", "head") or spec.held_as_stored
            or (dense_format == "fp8" and spec.dtype.startswith("F8"))):
        return spec.nbytes
    if spec.dtype == "F8_E4M3":
        return elements * DENSE_FORMATS[dense_format]
    if spec.dtype == "F8_E8M0":
        return 0  # folded into the dequantized matrix
    if spec.dtype.startswith(("I", "U")):
        return elements * 8  # index tables are held as int64
    return elements * 4


def layer_dense_bytes(cfg: ModelConfig, layer: int, dense_format: str) -> int:
    return sum(held_bytes(s, dense_format) for s in layer_specs(cfg, layer, with_experts=False))


def global_bytes(cfg: ModelConfig, role: str, dense_format: str) -> int:
    return sum(held_bytes(s, dense_format) for s in global_specs(cfg) if s.role == role)


def _compressor_bytes(rows: int, row_width: int, ratio: int, width: int, buffered: int, fmt: str,
                      row_ids: bool) -> int:
    """One compressor's entries (`rows` of `row_width`, plus an int64 id each in the decode state) and
    its float32 state: `buffered` projections [C = width x (2 if overlapped)] of kv and gate, and for
    CSA (ratio 4, overlapped) the previous window's first halves [ratio, width] of kv and gate."""
    overlap = ratio == 4
    state = buffered * (2 if overlap else 1) * width * 2 + (ratio * width * 2 if overlap else 0)
    return rows * (row_width * DENSE_FORMATS[fmt] + (8 if row_ids else 0)) + state * STATE_BYTES


def _layer_cache_bytes(cfg: ModelConfig, layer: int, context: int, fmt: str, static: bool) -> int:
    hd, W = cfg.head_dim, cfg.sliding_window
    # the ring: the dynamic cache keeps W-1 rows (the current token is the W-th); the static one W rows
    # plus two int64 position vectors and its position
    total = (W * hd * DENSE_FORMATS[fmt] + 2 * W * 8 + 8) if static else (W - 1) * hd * DENSE_FORMATS[fmt]
    ratio = cfg.compress_ratio(layer)
    if ratio:
        rows = math.ceil(context / ratio)
        buffered = ratio if static else ratio - 1  # a full window slot ring, or the incomplete window's rows
        total += _compressor_bytes(rows, hd, ratio, hd, buffered, fmt, static)
        if ratio == 4:  # CSA: the indexer's keys, by its own compressor
            total += _compressor_bytes(rows, cfg.index_head_dim, ratio, cfg.index_head_dim, buffered, fmt, static)
    return total


def kv_cache_bytes(cfg: ModelConfig, layer: int, context: int, dense_format: str) -> int:
    """One session's cache for `layer` filled to `context` tokens (runtime/model/kv_cache.py)."""
    return _layer_cache_bytes(cfg, layer, context, dense_format, static=False)


def snapshot_bytes(cfg: ModelConfig, layer: int, dense_format: str) -> int:
    """What one session snapshot (turn boundary, for truncate; runtime/model/session.py) keeps of
    `layer`: the ring and the compressors' incomplete windows, whatever the context."""
    return _layer_cache_bytes(cfg, layer, 0, dense_format, static=False)


def decode_state_bytes(cfg: ModelConfig, layer: int, context: int, dense_format: str) -> int:
    """The decode step's static copy of one context's state for `layer` (runtime/model/static_decode/state.py)."""
    return _layer_cache_bytes(cfg, layer, context, dense_format, static=True)


def workspace_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Upper bound of the activations alive during one layer's forward over `tokens` tokens.

    Sum of: the mHC residual in and out (2 x C x hc x D), q and the attention output (2 x C x H x hd),
    attention logits for one query block against window + selected/compressed keys
    (min(C, 512) x H x (window + index_topk)), the grouped output intermediate (C x groups x o_lora),
    and the experts' gate/up activations (C x k x 2I) plus the shared expert's (C x 2I); all fp32.
    """
    C, D, H, hd = tokens, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    keys = cfg.sliding_window + cfg.index_topk
    elements = (2 * C * cfg.hc_mult * D + 2 * C * H * hd + min(C, ATTENTION_QUERY_BLOCK) * H * keys
                + C * cfg.o_groups * cfg.o_lora_rank
                + C * (cfg.num_experts_per_tok + 1) * 2 * cfg.moe_intermediate_size)
    return elements * ACT_BYTES


@dataclass(frozen=True)
class MemoryPolicy:
    """The knobs of the memory model; all recorded in the plan."""
    context: int                 # planned context per session (tokens)
    sessions: int = 1            # sessions whose KV cache stays resident
    prefill_chunk: int = 4096    # largest prefill chunk (tokens) the workspace is sized for
    upload_group: int = 16       # experts per upload staging buffer (two buffers: double buffering)
    upload_shards: int = 1       # GPUs a sharded upload spreads over (policy.shard_threshold set: every GPU
                                 # holds two more buffers of upload_group 1/upload_shards slices); 1: none
    snapshots: int = 64          # turn-boundary snapshots a session keeps (the oldest are dropped)
    max_bucket: int = 0          # largest short-prefill step (tokens) reserved for; 0: none
    headroom_fraction: float = 0.05  # allocator fragmentation reserve, of usable bytes
    dense_format: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("context", "sessions", "prefill_chunk", "upload_group", "upload_shards", "snapshots"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_bucket < 0:
            raise ValueError(f"max_bucket must be >= 0, got {self.max_bucket}")
        if self.dense_format not in DENSE_FORMATS:
            raise ValueError(f"dense_format must be one of {sorted(DENSE_FORMATS)}, got {self.dense_format!r}")
        if not 0 <= self.headroom_fraction < 0.5:
            raise ValueError(f"headroom_fraction must be in [0, 0.5), got {self.headroom_fraction}")


def host_expert_bytes(cold: int, hot: int, expert_bytes: int, adapt: str, shard_major_copy: bool = False
                      ) -> dict[str, int]:
    """The host's rows of routed experts, for `cold` cold and `hot` hot experts of the model's layers (the
    MTP block's hot experts never move) under policy.adapt's mode `adapt`: the cold ones' (the CPU kernel's
    and the uploads' source), and when re-placing ("idle") the hot ones' (what an eviction computes and
    uploads from and a re-promotion copies from). Pinned copies with GPUs, the checkpoint's mapped pages on
    a CPU run: held once either way. A plan that shards its uploads and holds the shard-major copy
    (`shard_major_copy`: policy.shard_major_copy, where the host has room for it) holds every pinned row's
    down matrix once more (runtime/engine/shard_rows.py): a 1/G slice of w2 is strided in the row, and with
    the copy each GPU's is one contiguous run of page-locked bytes; w1, w3 and w2 are equal in bytes, so that
    is a third of each row."""
    rows = {"cold_experts": cold * expert_bytes}
    if adapt == "idle":
        rows["hot_expert_rows"] = hot * expert_bytes
    if shard_major_copy:
        rows["shard_major_down"] = shard_major_down_bytes(rows)
    return rows


def shard_major_down_bytes(rows: dict[str, int]) -> int:
    """The shard-major copy's bytes for the host's rows of experts `rows` (host_expert_bytes' cold_experts and
    hot_expert_rows, every one pinned with GPUs): their down matrices, a third of each row."""
    return sum(rows.get(k, 0) for k in ("cold_experts", "hot_expert_rows")) // 3


def layer_resident_bytes(cfg: ModelConfig, layer: int, policy: MemoryPolicy) -> dict[str, int]:
    """Bytes a GPU holds for one of its layers, before hot experts."""
    return {"dense_weights": layer_dense_bytes(cfg, layer, policy.dense_format),
            "kv_cache": policy.sessions * kv_cache_bytes(cfg, layer, policy.context, policy.dense_format),
            "kv_snapshots": policy.sessions * policy.snapshots * snapshot_bytes(cfg, layer, policy.dense_format),
            # the decode step's static copy of one context's KV state (runtime/model/static_decode:
            # loaded from the decoding session, stored back after), and with several sessions one more
            # per session decoding in the batched steps (runtime/engine/batch_runner.py); a bound on the
            # activations of the largest step (1 token, or a token per session) its graph keeps in its pool
            "decode_state": decode_states(policy.sessions) * decode_state_bytes(cfg, layer, policy.context,
                                                                                policy.dense_format),
            "decode_graph": workspace_bytes(cfg, policy.sessions)}


def decode_states(sessions: int) -> int:
    """Static decode states a GPU holds per layer: the solo decode step's, and when several sessions may run
    at once (ostinato-serve --parallel, up to policy.sessions) a slot per session for the batched steps."""
    return 1 + (sessions if sessions > 1 else 0)


def mtp_resident_bytes(cfg: ModelConfig, policy: MemoryPolicy, k: int = 0) -> dict[str, int]:
    """Bytes the GPU holding the head holds for MTP block k before its hot experts: its dense part (its
    decoder layer's, e_proj, h_proj, its norms and mHC head) and one session's cache filled to the planned
    context, as a layer's (index num_hidden_layers + k: its attention kind); and `speculative_steps`,
    what the fixed-shape steps add for speculation (speculative_steps_bytes). No snapshots: the engine's
    drafter (runtime/engine/drafter.py) restarts on an empty cache where a session is cut; its dynamic
    forwards' activations are a layer's, within the workspace bound."""
    dense = sum(held_bytes(s, policy.dense_format) for s in mtp_block_specs(cfg, k, with_experts=False))
    return {"dense_weights": dense,
            "kv_cache": policy.sessions * kv_cache_bytes(cfg, cfg.n_layers + k, policy.context, policy.dense_format),
            "speculative_steps": speculative_steps_bytes(cfg, policy, k)}


def speculative_steps_bytes(cfg: ModelConfig, policy: MemoryPolicy, k: int = 0) -> int:
    """The static buffers speculation adds on the head's GPU (runtime/engine/step_runner.py): the MTP block's
    static state (a layer's decode state) and its steps' inputs and outputs for 1 and 2 pairs (streams,
    token ids, embeddings, offsets, routes, a [V] logits row each); the 2-token verify step's logits of
    both tokens; every step's last-layer streams out, for the decode step, the verify step and the
    buckets (powers of two up to max_bucket: 2 x max_bucket - 1 token rows with the decode step's); and
    what a rejected verify is undone from (rollback_bytes, every layer's; counted here, on the head's GPU,
    though each layer's lives on its own: a few KB per layer)."""
    N, D, V, top = cfg.hc_mult, cfg.hidden_size, cfg.vocab_size, cfg.num_experts_per_tok
    pairs = 1 + 2  # the steps of 1 and of 2 pairs
    draft_io = pairs * (N * D * 4 + D * 4 + 8 + 8 + top * (8 + 4)) + 2 * V * 4
    rows = 2 * policy.max_bucket - 1 if policy.max_bucket >= 2 else 1 + 2
    return (decode_state_bytes(cfg, cfg.n_layers + k, policy.context, policy.dense_format) + draft_io
            + 2 * V * 4 + rows * N * D * 4
            + sum(rollback_bytes(cfg, layer, policy.dense_format) for layer in range(cfg.n_layers)))


def rollback_bytes(cfg: ModelConfig, layer: int, dense_format: str, tokens: int = 2) -> int:
    """What undoing a step of `tokens` tokens keeps of `layer` (runtime/model/static_decode/rollback.py): its
    window slots (rows, positions, offsets) and per compressor its window buffer's slots (kv and gate
    [n, C] float32, offsets) and, for CSA, the previous window's first halves (kv and gate [m, width])."""
    n = min(tokens, cfg.sliding_window)
    total = n * (cfg.head_dim * DENSE_FORMATS[dense_format] + 8 + 8)
    ratio = cfg.compress_ratio(layer)
    if ratio:
        overlap, c = ratio == 4, min(tokens, ratio)
        for width in (cfg.head_dim, cfg.index_head_dim) if overlap else (cfg.head_dim,):
            C = width * (2 if overlap else 1)
            total += c * (2 * C * STATE_BYTES + 8) + (2 * ratio * width * STATE_BYTES if overlap else 0)
    return total


def gpu_fixed_bytes(cfg: ModelConfig, policy: MemoryPolicy, usable: int, expert_bytes: int, first: bool,
                    last: bool, cuda: bool = True) -> dict[str, int]:
    """Per-GPU bytes independent of which layers it runs (`cuda`: a real GPU, with cuBLAS workspaces)."""
    # the single-link upload's two buffers of whole experts, and where uploads are sharded
    # (runtime/engine/sharded_upload.py) two of slices: an expert's six tensors all scale with its intermediate
    # axis, so a slice of 1/G of it (whole MXFP4 blocks, slice_bytes) is 1/G of its bytes
    fixed = {"upload_staging": 2 * policy.upload_group * (expert_bytes + slice_bytes(expert_bytes,
                                                                                        policy.upload_shards)),
             "workspace": workspace_bytes(cfg, policy.prefill_chunk),
             "headroom": int(usable * policy.headroom_fraction)}
    if cuda:
        fixed["cublas_workspaces"] = CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES
    if policy.max_bucket:
        # the prefill buckets' graphs share one memory pool, sized by the largest step's activations;
        # plus the cold routes' device-side result rows (kernels/cold_task.py ColdStaging) and the
        # steps' residual streams in and out (all bucket sizes together: under 2 x the largest)
        B, D = policy.max_bucket, cfg.hidden_size
        fixed["prefill_graphs"] = workspace_bytes(cfg, B) + B * D * 4 + 2 * (2 * B * cfg.hc_mult * D * 4)
    if first:  # token embeddings are looked up where the first layer runs
        fixed["embedding"] = global_bytes(cfg, "embed", policy.dense_format)
    if last:  # the LM head, final norm and hc head run after the last layer
        fixed["head"] = sum(global_bytes(cfg, r, policy.dense_format) for r in ("head", "final_norm", "hc_head"))
    return fixed


def slice_bytes(expert_bytes: int, shards: int) -> int:
    """Bytes of one GPU's slice of an expert when `shards` GPUs share each upload (0: uploads are not sharded)."""
    if shards <= 1:
        return 0
    if expert_bytes % shards:
        raise ValueError(f"an expert of {expert_bytes:,d} bytes does not cut into {shards} equal slices")
    return expert_bytes // shards


def shardable(cfg: ModelConfig, gpus: int, cpu_only: bool) -> bool:
    """Whether uploads can be sharded over `gpus` GPUs: 2 or more real ones (a cpu-only spec's "links" are
    copies in host memory), each slice of the intermediate axis whole MXFP4 blocks (w2's rows are cut in them:
    runtime/engine/sharded_upload.py slice_width)."""
    return not cpu_only and gpus >= 2 and cfg.moe_intermediate_size % (gpus * MXFP4_GROUP) == 0
