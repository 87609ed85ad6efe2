"""Cost model: predicted times of prefill (split-route and upload-once) and decode from the hardware spec.

The one model of the hardware in the project (the session simulator uses it too). Per layer:
- routes: each token picks top_k experts; expert e is in a token's set with probability
  q_e = min(1, top_k * share_e) (share from the profile), so n tokens touch it with probability
  1 - (1 - q_e)^n and the expected distinct experts touched is the sum of those;
- an expert computed on a device costs max(its weight bytes / memory bandwidth, its routes'
  FLOPs / matmul rate): streaming the weights once bounds short batches, compute bounds long ones;
- an expert computed on the host costs what compiler/host_kernel.py's rule says: the kernel's measured
  per-core rate at the layer's tokens per expert times the host's cores, capped by the host's expert
  read bandwidth (the spec's host.expert_kernel; a calibrated host, or a spec without it, falls back
  to the same max() of bytes and FLOPs at the host's rates);
- order of work in a layer (every system priced here): the dense part before the experts (attention with
  its compressor and indexer, mHC, norms, the router) runs first, since the routes come out of the router;
  then the GPU's hot experts with the shared expert and the host's cold experts (+ activations over the link
  both ways, + the per-layer task hand-off host.task_handoff_s) run concurrently:
      layer = attention + router + max(hot + shared expert, cold + hand-off)
  (split_layer; on a cpu-only spec the two sides share the cores and add up);
- split-route prefill: that layer with n tokens' expected routes;
- upload-once prefill: the distinct cold experts cross the link once, double-buffered against the
  GPU's compute of the layer: the layer takes the longer of upload and compute;
- sharded upload-once (runtime/engine/sharded_upload.py), on a spec of G >= 2 GPUs: each GPU uploads a 1/G
  slice of every distinct cold expert (along the intermediate axis) over its own link, all G links at once as
  fast as the host memory feeds them (upload_time's links), and computes its slice (1/G of the cold experts'
  bytes and FLOPs) double-buffered against the copies as the single-link upload is; the layer's hidden states
  x [n, D] (the compute dtype) go out to the G - 1 other GPUs and each one's float32 partial [n, D] comes back
  to the layer's GPU, added in GPU order (exchange_time). A spec has no peer-access field and the planned
  GPUs (GeForce cards) have none, so the exchange is priced through the host: x down the layer's GPU's link
  and up every other one's, the partials down theirs and up the layer's GPU's link one after another. The
  exchange's host -> device bytes, (G - 1) x n x D x (x's element + 4), share the links with the slices
  (added to the layer's upload); out and back are on the layer's critical path:
      layer = dense part before the experts + max(shared + hot + slice, out + slice) + back;
- decode (one token): the same split as prefill with n = 1, plus one graph launch per GPU; layers run one
  after another (a single sequence has no pipelining).

Attention by position: a forward of n tokens after `position` tokens already in the session (its cached
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
Hidden states move between GPUs over the link once per GPU boundary. On a cpu-only spec the
"GPU" and the host are the same cores, so their parts add up instead of overlapping.

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

Short prefills as bucket steps (runtime/engine/step_runner.py): a prompt of n <= the largest of
`buckets` tokens runs as exact-size steps of power-of-two sizes (120 = 64 + 32 + 16 + 8), each a
replayed graph per GPU like the decode step (eager on a cpu-only spec). Inside one, the hot routes
go through the decode kernel, one program per route slot, so each hot route reads its expert's
weights (no L2 reuse credited: conservative); cold routes are split-route's. `choose_buckets` keeps
the sizes for which every prompt up to the largest is predicted faster as steps than eagerly.

Host dispatch: a forward run eagerly (every prefill; decode only on a cpu-only spec, since GPUs
replay the captured decode graph) issues its ops one by one from Python, EAGER_OPS_PER_LAYER per
layer and prefill chunk (the baselines' own counts where they differ), each costing the spec's
host.op_dispatch_s. With a GPU the host runs ahead of the device, so a forward takes the longer of
dispatch and device work; on the CPU they add up. A cpu-only plan's decode step compiled into one call
(policy.cpu_step "compiled", runtime/engine/cpu_step.py) is priced at COMPILED_STEP_OPS_PER_LAYER in the
same units instead: what its generated code, its opaque expert and head calls and its entry cost the host.

Speculative decoding with the MTP block (runtime/model/speculative.py), priced from the pieces above
(speculative_step): a step drafts `depth` tokens with the MTP block (each draft: one more decoder layer,
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

import copy
from dataclasses import dataclass

import numpy as np

from ostinato.buckets import bucket_pieces, decode_contexts, largest_bucket_for
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.hardware import HardwareSpec

from .host_kernel import KernelRates, kernel_time, rates_of_spec
from .memory_model import DENSE_FORMATS, held_bytes, layer_dense_bytes

EXPERT_FLOPS_PER_TOKEN_FACTOR = 2 * 3   # 3 matmuls (gate, up, down), 2 FLOP per multiply-add
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
MTP_ACCEPTANCE = 0.9  # draft acceptance until real weights say otherwise: KTransformers' published figure for
                      # V4-Flash's MTP block (PUBLISHED.md); plans predict speculation at it unless their
                      # recorded profile measured the block's own (compiler/passes/speculation.py,
                      # MIN_MEASURED_DRAFTS); the simulator always
MAX_BUCKET = 256  # the largest prefill bucket the compiler considers (its graph pool: 172 MB on V4-Flash)
# A dynamic forward's CSA layer scores every compressed row and masks the unpicked ones while rows x heads <=
# this x picks x head_dim, else gathers each query's picks: runtime/model/attention.py's CSA_DENSE_MAX_RATIO
# (the compiler may not import the runtime; tests/test_cost_model_position.py checks the two agree).
CSA_DENSE_MAX_RATIO = 1.0
KV_ELEMENT_BYTES = 2  # a KV row's element when the dense format is not known: bf16 (memory_model.DENSE_FORMATS)
# The CSA indexer's selection (runtime/model/indexer.py `select`, and static_decode/indexer.py `select_fixed`)
# materializes its scores, float32 (4 bytes), as whole tensors one op after another, so besides its matmul's
# FLOPs it moves, per (query, compressed row, index head): the matmul's [T, HI, n] output written (4), relu
# read and written (8), the 1/sqrt(dI) scaling read and written (8), the head weighting read and written (8),
# the sum over heads read (4): 32 bytes;
INDEXER_BYTES_PER_QUERY_ROW_HEAD = 8 * 4
# ...and per (query, row): the [T, n] sum written (4), the future mask written (1 byte, bool), masked_fill
# reading both and writing (4 + 1 + 4), the top-k over rows reading the scores (4), its kept-mask read and
# written (4 + 1) and scanned by nonzero (count and write passes: 2 x 1): 25 bytes (the fixed-shape step's
# stable sort reads its 4 and writes value and index, 4 + 8, in place of the last three: priced alike).
INDEXER_BYTES_PER_QUERY_ROW = 4 + 1 + 9 + 4 + 5 + 2


def indexer_bytes(heads: int, n, rows):
    """Bytes the CSA indexer's intermediates move when n queries score `rows` index keys with `heads` heads (the
    counts above; the keys and queries themselves are the KV read, attention_work). Elementwise over arrays."""
    return n * rows * (heads * INDEXER_BYTES_PER_QUERY_ROW_HEAD + INDEXER_BYTES_PER_QUERY_ROW)


def indexer_time(heads: int, head_dim: int, n, rows, bandwidth: float, flops: float):
    """Seconds of the indexer's selection alone at a device's rates: its matmul's FLOPs (2 x heads x head_dim per
    query and row) plus its intermediates' bytes. Added, not max'ed: they are separate ops run one after
    another, the matmul bound by FLOPs and the elementwise passes by bytes, so neither hides the other
    (bench/indexer_cost.py measures index_scores' elementwise passes on top of its matmul)."""
    return 2 * heads * head_dim * n * rows / flops + indexer_bytes(heads, n, rows) / bandwidth



@dataclass(frozen=True)
class MtpCostInputs:
    """The MTP block's dense part (its decoder layer's dense weights, e_proj, h_proj, norms, mHC head):
    bytes read per forward and multiply-adds per token, on the GPU holding the head (mtp.py runs it on
    the last layer's device); its routed experts as placed, `hot` [E] bool with the route `share` [E]
    of its profile row (summing to 1); without them, priced as an average layer's (CostModel.mtp_draft)."""
    gpu: int
    dense_bytes: int
    dense_params: int
    hot: np.ndarray | None = None
    share: np.ndarray | None = None


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


@dataclass(frozen=True)
class LayerCostInputs:
    gpu: int
    dense_bytes: int              # weights read per forward on the GPU
    dense_params: int             # multiply-adds per token of the dense matmuls
    hot: np.ndarray               # [E] bool
    share: np.ndarray             # [E] float, route share of each expert (sums to 1)


def host_expert_rates(host) -> tuple[float, float]:
    """(bytes/s, FLOP/s) of the CPU expert kernel: calibrated on the host when the spec has them
    (ostinato-calibrate), else the spec's DRAM bandwidth and matmul rate."""
    return (host.expert_read_bandwidth or host.bandwidth, host.expert_flops or host.matmul_flops)


def is_calibrated(host) -> bool:
    return host.expert_read_bandwidth is not None and host.expert_flops is not None


def held_format(cfg: ModelConfig, layers: list[LayerCostInputs]) -> str | None:
    """The dense format (memory_model.DENSE_FORMATS) whose held bytes are every layer's dense_bytes, or None
    (inputs not made by the memory model: a test's hand-made layers, or a config that is no checkpoint's)."""
    if not isinstance(cfg, ModelConfig):
        return None
    for fmt in DENSE_FORMATS:
        if layers and all(layer_dense_bytes(cfg, i, fmt) == l.dense_bytes for i, l in enumerate(layers)):
            return fmt
    return None


def shared_expert_part(cfg: ModelConfig, layer: int, dense_format: str) -> tuple[int, int]:
    """(bytes held, multiply-adds per token) of `layer`'s shared expert in `dense_format`: the part of its
    dense weights that runs after the router, beside the routed experts."""
    shared = [s for s in layer_specs(cfg, layer, with_experts=False) if s.role == "shared_expert"]
    params = sum(int(np.prod(s.shape)) for s in shared if len(s.shape) == 2 and not s.is_scale)
    return sum(held_bytes(s, dense_format) for s in shared), params


class CostModel:
    def __init__(self, cfg: ModelConfig, hw: HardwareSpec, layers: list[LayerCostInputs], expert_bytes: int,
                 head_bytes: int, context: int, prefill_chunk: int = 4096, mtp: MtpCostInputs | None = None,
                 cpu_step: str = "compiled", dense_format: str | None = None):
        """`mtp`: the MTP block's dense part (None: priced as the last layer's dense part, see mtp_draft);
        `cpu_step`: the plan's policy.cpu_step (how a cpu-only spec runs its decode step); `dense_format`: how the
        plan holds dense weights and KV rows (None: the format whose held bytes are the layers' dense_bytes,
        held_format; when none is, the shared expert is priced inside the dense part before the experts, and KV
        rows at KV_ELEMENT_BYTES)."""
        self.cfg, self.hw, self.layers, self.mtp = cfg, hw, layers, mtp
        self.expert_bytes, self.head_bytes, self.context = expert_bytes, head_bytes, context
        self.prefill_chunk, self.cpu_step = prefill_chunk, cpu_step
        if dense_format is not None and dense_format not in DENSE_FORMATS:
            raise ValueError(f"dense_format {dense_format!r}: one of {list(DENSE_FORMATS)}")
        self.dense_format = dense_format or held_format(cfg, layers)
        self.kv_element_bytes = DENSE_FORMATS[self.dense_format] if self.dense_format else KV_ELEMENT_BYTES
        # per layer (and the MTP block, an MTP index): the shared expert's (bytes, multiply-adds per token)
        self._shared = ([shared_expert_part(cfg, i, self.dense_format) for i in range(len(layers) + 1)]
                        if self.dense_format else [(0, 0)] * (len(layers) + 1))
        # the CPU expert kernel's per-core rates (host_kernel.py); None: the max() of bytes and FLOPs at the
        # host's rates (a calibrated host measured them itself; a spec without expert_kernel estimates them)
        self.host_kernel: KernelRates | None = None if is_calibrated(hw.host) else rates_of_spec(hw.host)
        self.eager_ops_per_layer = EAGER_OPS_PER_LAYER
        self.csa_dense_max_ratio = CSA_DENSE_MAX_RATIO   # the runtime's rule (attention_work)
        self.indexer_materializes = True   # the runtime's indexer writes its score tensors (indexer_bytes)
        k = cfg.num_experts_per_tok
        self.expert_flops = EXPERT_FLOPS_PER_TOKEN_FACTOR * cfg.hidden_size * cfg.moe_intermediate_size
        self._q = [np.minimum(1.0, k * l.share) for l in layers]

    # ----- building blocks ----------------------------------------------------------------------
    def distinct(self, layer: int, n: int, hot: bool) -> float:
        """Expected distinct hot (or cold) experts of `layer` touched by n tokens."""
        l, q = self.layers[layer], self._q[layer]
        mask = l.hot if hot else ~l.hot
        return float((1.0 - (1.0 - q[mask]) ** n).sum())

    def routes(self, layer: int, n: int, hot: bool) -> float:
        l = self.layers[layer]
        mask = l.hot if hot else ~l.hot
        return float(n * self.cfg.num_experts_per_tok * l.share[mask].sum())

    def _experts_time(self, distinct: float, routes: float, bandwidth: float, flops: float) -> float:
        return max(distinct * self.expert_bytes / bandwidth, routes * self.expert_flops / flops)

    # ----- the dense part of a layer, by position (module docstring) ------------------------------
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
        scratch = self.indexer_scratch_bytes(layer, n, rows_context, fixed_shape)
        tokens = n
        if per_session:
            att_flops, kv_bytes, scratch = float(np.sum(att_flops)), float(np.sum(kv_bytes)), float(np.sum(scratch))
            tokens = n * len(rows_context)
        flops = 2 * tokens * dense_params + att_flops
        return np.maximum((dense_bytes + kv_bytes) / g.bandwidth, flops / g.matmul_flops) + scratch / g.bandwidth

    def indexer_scratch_bytes(self, layer: int, n, rows_context, fixed_shape: bool = False):
        """Bytes of the CSA indexer's intermediates (indexer_bytes) for n queries of `layer` over the rows
        attention_work scores (0 on a layer without an indexer). Elementwise over arrays of rows_context."""
        ctx = np.asarray(rows_context)
        if self.cfg.compress_ratio(layer) != 4 or not self.indexer_materializes:
            return 0 * ctx
        rows = -(-ctx // 4) if fixed_shape else ctx // 4
        return indexer_bytes(self.cfg.index_n_heads, n, rows)

    def _hops(self, n: int) -> float:
        """Hidden state crossing each GPU boundary (hc streams of hidden_size, fp32)."""
        crossings = len(set(l.gpu for l in self.layers)) - 1
        size = n * self.cfg.hc_mult * self.cfg.hidden_size * 4
        return crossings * (self.hw.link.latency_s + size / self.hw.link.h2d_bandwidth)

    def _head_time(self, n: int) -> float:
        g = self.hw.gpus
        return max(self.head_bytes / g.bandwidth, 2 * n * self.cfg.vocab_size * self.cfg.hidden_size / g.matmul_flops)

    # ----- explicit counts: the session simulator feeds sampled traces through these -------------
    def gpu_experts_time(self, distinct: float, routes: float) -> float:
        """Experts computed on a GPU; on a cpu-only spec the "GPU" is the host, whose hot pools run through
        the same CPU kernel as its cold experts, so they are priced alike."""
        if self.hw.cpu_only and self.host_kernel is not None:
            return kernel_time(self.host_kernel, self.hw.host, distinct, routes, self.expert_bytes)
        g = self.hw.gpus
        return self._experts_time(distinct, routes, g.bandwidth, g.matmul_flops)

    def host_experts_time(self, distinct: float, routes: float) -> float:
        """The host's expert kernel over `distinct` experts and their `routes` (host_kernel.py's rule with
        this model's kernel rates; another system's with with_host_kernel)."""
        if self.host_kernel is not None:
            return kernel_time(self.host_kernel, self.hw.host, distinct, routes, self.expert_bytes)
        return self._experts_time(distinct, routes, *host_expert_rates(self.hw.host))

    def cpu_experts_time(self, n: int, distinct: float, routes: float) -> float:
        """Routes computed by the host's expert kernels, plus the layer's hand-off to the host task and n
        tokens' activations over the link both ways."""
        if routes <= 0:
            return 0.0
        link = self.hw.link
        act = n * self.cfg.hidden_size * 4
        return (self.host_experts_time(distinct, routes) + self.hw.host.task_handoff_s
                + 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth)

    def upload_time(self, experts: float, extra_bytes: int = 0, links: int = 1) -> float:
        """`experts` expert weights (plus extra_bytes) crossing host -> device once, spread over `links` GPUs'
        links at once (a tensor-parallel system's shards), as fast as the host memory feeds them."""
        size = experts * self.expert_bytes + extra_bytes
        bandwidth = min(links * self.hw.link.h2d_bandwidth, self.hw.host.bandwidth)
        return size / bandwidth + (self.hw.link.latency_s if size > 0 else 0.0)

    def pipelined(self, per: list[tuple[float, float]]) -> float:
        """Layers of (upload, compute), double-buffered: layer l+1's upload overlaps layer l's compute;
        the first upload is exposed."""
        nxt = [per[l + 1][0] if l + 1 < len(per) else 0.0 for l in range(len(per))]
        return per[0][0] + sum(self.overlap(per[l][1], nxt[l]) for l in range(len(per)))

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

    def with_host_kernel(self, rates: KernelRates | None) -> CostModel:
        """The same model for a system whose CPU expert kernel runs at `rates` (host_kernel.py's rule)."""
        other = copy.copy(self)
        other.host_kernel = rates
        return other

    def with_csa_picks_only(self) -> CostModel:
        """The same model for a system whose CSA attention takes each query's index_topk picks whatever the rows
        and whose indexer keeps its scores out of memory (a baseline's own kernels, not measured here: priced at
        the model's work, its FLOPs and the rows it reads), not the runtime's dense scoring of few rows
        (CSA_DENSE_MAX_RATIO) nor its materialized score tensors (indexer_bytes)."""
        other = copy.copy(self)
        other.csa_dense_max_ratio = 0.0
        other.indexer_materializes = False
        return other

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

    # ----- per layer ----------------------------------------------------------------------------
    def layer_seconds(self, first, gpu, cpu):
        """A layer from its parts in the order the runtime runs them: `first` (the dense part before the experts:
        the routes come out of its router), then the GPU side (hot experts and the shared expert) and the host
        side (cold experts with their hand-off) concurrently, unless they share the same cores (cpu-only)."""
        return first + self.overlap(gpu, cpu)

    def split_layer(self, layer: int, n: int, position: int | None = None,
                    step_context: int | None = None) -> tuple[float, float, float]:
        """(seconds before the experts, GPU seconds, CPU seconds) of split-route for n tokens after `position`:
        the layer takes layer_seconds of them. `step_context`: a fixed-shape step's (before_experts_time)."""
        gpu = self.shared_expert_time(layer, n) + self.gpu_experts_time(self.distinct(layer, n, True),
                                                                        self.routes(layer, n, True))
        return (float(self.before_experts_time(layer, n, position, step_context=step_context)), gpu,
                self.cpu_experts_time(n, self.distinct(layer, n, False), self.routes(layer, n, False)))

    def upload_layer(self, layer: int, n: int, position: int | None = None) -> tuple[float, float]:
        """(upload seconds, GPU compute seconds) of upload-once for n tokens after `position`: every route runs on
        the GPU, after its layer's dense part."""
        cold = self.distinct(layer, n, False)
        if self.hw.cpu_only:  # one CPU kernel either way: each part at its own tokens per expert, as split-route
            experts = (self.gpu_experts_time(self.distinct(layer, n, True), self.routes(layer, n, True))
                       + self.gpu_experts_time(cold, self.routes(layer, n, False)))
        else:
            experts = self.gpu_experts_time(self.distinct(layer, n, True) + cold, n * self.cfg.num_experts_per_tok)
        return self.upload_time(cold), float(self.attention_time(layer, n, position)) + experts

    # ----- whole forward ------------------------------------------------------------------------
    def overlap(self, a: float, b: float) -> float:
        """Two concurrent parts: the longer one, unless they share the same cores (cpu-only)."""
        return a + b if self.hw.cpu_only else np.maximum(a, b)

    def split_prefill(self, n: int, position: int | None = None) -> float:
        layers = sum(self.layer_seconds(*self.split_layer(l, n, position)) for l in range(len(self.layers)))
        return float(self.forward_time(layers, n, decode=False, eager=True))

    def upload_prefill(self, n: int, position: int | None = None) -> float:
        per = [self.upload_layer(l, n, position) for l in range(len(self.layers))]
        return float(self.forward_time(self.pipelined(per), n, decode=False, eager=True))

    # ----- upload-once sharded over every GPU's link (module docstring) ------------------------------
    @property
    def shards(self) -> int:
        """GPUs a sharded upload spreads over: every GPU of the spec (1 on a cpu-only spec: its "links" are
        copies within host memory)."""
        return 1 if self.hw.cpu_only else self.hw.gpus.count

    def exchange_bytes(self, n: int) -> tuple[int, int]:
        """(x, partial): bytes of n tokens' hidden states in the compute dtype (the dense format's element) and
        of one GPU's float32 partial output, each [n, D]."""
        elements = n * self.cfg.hidden_size
        return elements * self.kv_element_bytes, elements * 4

    def exchange_time(self, n: int) -> tuple[float, float]:
        """(out, back) seconds of a sharded layer's activations through the host (no peer access): x down the
        layer's GPU's link and up the others' at once; the G - 1 partials down their own links at once and up
        the layer's GPU's link one after another."""
        G, link = self.shards, self.hw.link
        if G < 2:
            return 0.0, 0.0
        x, partial = self.exchange_bytes(n)
        out = 2 * link.latency_s + x / link.d2h_bandwidth + x / link.h2d_bandwidth
        back = 2 * link.latency_s + partial / link.d2h_bandwidth + (G - 1) * partial / link.h2d_bandwidth
        return out, back

    def sharded_upload_layer(self, layer: int, n: int, position: int | None = None) -> tuple[float, float]:
        """(upload seconds, compute seconds) of the sharded upload-once for n tokens after `position`: the slices
        over all G links (with the exchange's host -> device bytes), each GPU's slice of the cold experts beside
        the layer's GPU's hot and shared experts, the exchange out and back (module docstring)."""
        return self.sharded_layer(layer, n, (self.distinct(layer, n, True), self.routes(layer, n, True)),
                                  (self.distinct(layer, n, False), self.routes(layer, n, False)), position)

    def sharded_layer(self, layer: int, n: int, hot: tuple[float, float], cold: tuple[float, float],
                      position: int | None = None) -> tuple[float, float]:
        """sharded_upload_layer with explicit (distinct experts, routes) of the layer's `hot` and `cold` experts
        (the session simulator feeds sampled traces through it)."""
        G = self.shards
        if G < 2:
            raise ValueError(f"a sharded upload needs 2+ GPUs: {self.hw.name} has "
                             f"{'none (cpu-only)' if self.hw.cpu_only else G}")
        x, partial = self.exchange_bytes(n)
        upload = self.upload_time(cold[0], (G - 1) * (x + partial), links=G)
        piece = self.gpu_experts_time(cold[0] / G, cold[1] / G)  # each GPU's 1/G of every cold expert
        home = self.shared_expert_time(layer, n) + self.gpu_experts_time(*hot)
        out, back = self.exchange_time(n)
        first = float(self.before_experts_time(layer, n, position))
        return upload, first + max(home + piece, out + piece) + back

    def sharded_prefill(self, n: int, position: int | None = None) -> float:
        """Upload-once sharded over every GPU's link: sharded_upload_layer's layers double-buffered as the
        single-link upload's."""
        per = [self.sharded_upload_layer(l, n, position) for l in range(len(self.layers))]
        return float(self.forward_time(self.pipelined(per), n, decode=False, eager=True))

    def step_ops_per_layer(self, T: int) -> int | None:
        """Dispatch units per layer of a T-token fixed-shape step on a cpu-only spec (None: the dynamic
        forward's): the compiled decode step's, or an eager step's."""
        if T == 1:
            return COMPILED_STEP_OPS_PER_LAYER if self.cpu_step == "compiled" else None
        return EAGER_STEP_OPS_PER_LAYER

    def decode_step(self, position: int | None = None, sessions: int = 1) -> float:
        """One decode step after `position` tokens: the fixed-shape step of step_context(1, position), its
        routes split. `sessions` > 1: that many sessions, each at `position`, decode one token each in one
        batched step (batched_decode_step); the step's seconds, for all of them."""
        if sessions != 1:
            if sessions < 1:
                raise ValueError(f"sessions {sessions}: the sessions decoding in the step, at least 1")
            return self.batched_decode_step([position] * sessions)
        context = self.step_context(1, position)
        layers = sum(self.layer_seconds(*self.split_layer(l, 1, position, context)) for l in range(len(self.layers)))
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
        expert of the B tokens once; the cold routes of all B tokens in one host task over their distinct experts."""
        B = len(positions)
        hot_routes = self.routes(layer, B, True)
        reads = self.distinct(layer, B, True) if grouped_hot or self.hw.cpu_only else B * self.distinct(layer, 1, True)
        gpu = self.shared_expert_time(layer, B) + self.gpu_experts_time(reads, hot_routes)
        cpu = self.cpu_experts_time(B, self.distinct(layer, B, False), self.routes(layer, B, False))
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

    def eager_mode(self, n: int, threshold: int | None, shard_threshold: int | None = None) -> str:
        """How the dynamic model runs n tokens under the plan's thresholds (policy.prefill_threshold and
        policy.shard_threshold): split-route up to the first, upload-once above it, sharded above the second."""
        if threshold is None or n <= threshold:
            return "split"
        return "sharded" if shard_threshold is not None and n > shard_threshold else "upload"

    def eager_prefill(self, n: int, threshold: int | None, position: int | None = None,
                      shard_threshold: int | None = None) -> float:
        """The dynamic model's forward in eager_mode's choice."""
        mode = self.eager_mode(n, threshold, shard_threshold)
        if mode == "sharded":
            return self.sharded_prefill(n, position)
        return self.upload_prefill(n, position) if mode == "upload" else self.split_prefill(n, position)

    def prefill(self, n: int, threshold: int | None, buckets: list[int], position: int | None = None,
                shard_threshold: int | None = None) -> float:
        """The plan's choice: bucket steps up to the largest bucket (`buckets` ascending), then eager_prefill."""
        if buckets and 0 < n <= buckets[-1]:
            return self.bucket_prefill(n, buckets, position)
        return self.eager_prefill(n, threshold, position, shard_threshold)

    # ----- short prefills as bucket steps -------------------------------------------------------
    def bucket_layer(self, layer: int, T: int, position: int | None = None) -> tuple[float, float, float]:
        """(seconds before the experts, GPU seconds, CPU seconds) of a layer in a T-token step after `position`:
        its attention reads the step's rows (step_context); hot routes each read their expert on a GPU (the
        decode kernel's per-route programs; the CPU kernel groups them), cold ones split-route."""
        hot_routes = self.routes(layer, T, True)
        reads = self.distinct(layer, T, True) if self.hw.cpu_only else hot_routes
        gpu = self.shared_expert_time(layer, T) + self.gpu_experts_time(reads, hot_routes)
        first = self.before_experts_time(layer, T, position, step_context=self.step_context(T, position))
        return float(first), gpu, self.cpu_experts_time(T, self.distinct(layer, T, False), self.routes(layer, T, False))

    def bucket_step(self, T: int, position: int | None = None) -> float:
        """One T-token step after `position`: replayed graphs on GPUs (on a cpu-only spec step_ops_per_layer(T):
        eager, EAGER_STEP_OPS_PER_LAYER a layer, for T >= 2), the head once."""
        layers = sum(self.layer_seconds(*self.bucket_layer(l, T, position)) for l in range(len(self.layers)))
        return float(self.forward_time(layers, T, decode=True, eager=self.decode_is_eager(),
                                       ops_per_layer=self.step_ops_per_layer(T)))

    def bucket_prefill(self, n: int, buckets: list[int], position: int | None = None) -> float:
        """n tokens after `position` as the steps bucket_pieces picks from `buckets`, one after another."""
        at, total = self.at(n, position), 0.0
        for T in bucket_pieces(n, buckets):
            total += self.bucket_step(T, at)
            at += T
        return total

    def crossover(self, limit: int = 1 << 20, position: int | None = None, sharded: bool = False) -> int | None:
        """Largest n for which split-route is still at least as fast as upload-once (None: always), both after
        `position`; `sharded`: as the faster of the single-link and the sharded upload (a plan that holds the
        slices' staging). On a cpu-only spec always: its "upload" is a copy within host memory before the same
        CPU kernel runs."""
        if self.hw.cpu_only:
            return None
        split = lambda n: self.split_prefill(n, position)    # noqa: E731
        upload = lambda n: self.upload_prefill(n, position)  # noqa: E731
        if sharded and self.shards > 1:
            upload = lambda n: min(self.upload_prefill(n, position), self.sharded_prefill(n, position))  # noqa: E731
        return self._last_win(split, upload, limit)

    def shard_crossover(self, position: int | None = None, limit: int | None = None) -> int | None:
        """Largest n for which the single-link upload is still at least as fast as the sharded one, both after
        `position` (0: sharded wins from 1 token); None: sharding does not pay at `limit` tokens (default the
        plan's prefill chunk, the longest forward the runtime runs: longer prompts run in chunks), or the spec
        has one GPU (or none)."""
        if self.shards < 2:
            return None
        single = lambda n: self.upload_prefill(n, position)    # noqa: E731
        sharded = lambda n: self.sharded_prefill(n, position)  # noqa: E731
        return self._last_win(single, sharded, limit or self.prefill_chunk)

    @staticmethod
    def _last_win(first, second, limit: int) -> int | None:
        """Largest n <= limit at which `first` (a function of n) is at least as fast as `second`, found by
        bisection (the two cross once: a fixed cost against a cheaper rate); None: `second` does not win at
        `limit`; 0: it wins from 1."""
        if second(limit) >= first(limit):
            return None
        if second(1) < first(1):
            return 0
        lo, hi = 1, limit  # invariant: first wins at lo, second at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if second(mid) < first(mid):
                hi = mid
            else:
                lo = mid
        return lo

    def choose_buckets(self, threshold: int | None, context: int, largest: int = MAX_BUCKET,
                       position: int | None = None, shard_threshold: int | None = None) -> list[int]:
        """Powers of two 2..B for the largest B such that every prompt of n <= B tokens after `position` is
        predicted strictly faster as bucket steps than eagerly (none on a cpu-only spec, where both run eagerly),
        B at most `largest`, the threshold (past it upload-once wins) and context / 3 (a step's warm-up and
        capture runs take 3 of them from position 0)."""
        limit = min(largest, largest_bucket_for(context), threshold if threshold is not None else largest)
        best, sizes, T = [], [], 2
        while T <= limit:
            sizes = sizes + [T]
            eager = lambda n: self.eager_prefill(n, threshold, position, shard_threshold)  # noqa: E731
            if any(self.bucket_prefill(n, sizes, position) >= eager(n) for n in range(1, T + 1)):
                break
            best, T = list(sizes), 2 * T
        return best

    # ----- speculative decoding with the MTP block ----------------------------------------------
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
        shared = self.shared_expert_time(index, 1)
        if m.hot is not None:
            q, k = np.minimum(1.0, self.cfg.num_experts_per_tok * m.share), self.cfg.num_experts_per_tok
            split = [(float(q[mask].sum()), float(k * m.share[mask].sum())) for mask in (m.hot, ~m.hot)]
            experts = [(self.gpu_experts_time(*split[0]), self.cpu_experts_time(1, *split[1]))]
        else:
            experts = [(self.gpu_experts_time(self.distinct(l, 1, True), self.routes(l, 1, True)),
                        self.cpu_experts_time(1, self.distinct(l, 1, False), self.routes(l, 1, False)))
                       for l in range(len(self.layers))]
        layer = float(np.mean([self.layer_seconds(first, shared + g, c) for g, c in experts]))
        busy = layer + self._head_time(1)
        if self.decode_is_eager():
            return busy + self.eager_ops_per_layer * self.hw.host.op_dispatch_s
        return busy + self.hw.gpus.launch_overhead_s

    def verify_step(self, T: int, position: int | None = None) -> float:
        """The verify forward of T tokens: a fixed-shape step of T tokens, which the engine makes whether or not
        T is a prefill bucket (runtime/engine/step_runner.py), captured on GPUs."""
        return self.bucket_step(T, position)

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

    def hot_share(self) -> float:
        """Profiled share of all routes that land on hot experts (mean over layers)."""
        return float(np.mean([l.share[l.hot].sum() for l in self.layers]))
