"""memory: what each layer and each GPU holds whatever the placement (dense weights, KV cache, states,
buffers, the prefill buckets' graph pool, the sharded upload's slices), under the plan's memory policy. The
re-plan loop runs it again when what it reserved changes (compile.py, replan.py)."""

from __future__ import annotations

from ostinato.buckets import largest_bucket_for
from ostinato.checkpoint import model_sizes
from ostinato.hardware import HardwareSpec

from ..cost_model import MAX_BUCKET
from ..memory_model import MemoryPolicy, gpu_fixed_bytes, layer_resident_bytes, mtp_resident_bytes, shardable
from .build import Build
from .options import CompileOptions


def memory(b: Build) -> None:
    o, cfg, hw = b.options, b.config, b.hardware
    if b.bucket_reserve is None:  # first time: room for the largest bucket the plan may get
        b.bucket_reserve = max_bucket(o, hw)
    if b.slice_reserve is None:  # first time: room for the sharded upload's slices wherever it can run
        b.slice_reserve = shardable(cfg, hw.gpus.count, hw.cpu_only)
    b.policy = MemoryPolicy(context=o.context, sessions=o.sessions, prefill_chunk=o.prefill_chunk,
                            upload_group=o.upload_group, upload_shards=hw.gpus.count if b.slice_reserve else 1,
                            snapshots=o.snapshots, dense_format=dense_format(o, hw), max_bucket=b.bucket_reserve)
    expert = model_sizes(cfg).expert_bytes
    b.layer_bytes = [layer_resident_bytes(cfg, l, b.policy) for l in range(cfg.n_layers)]
    b.mtp_bytes = mtp_resident_bytes(cfg, b.policy) if b.mtp_placed else {}
    G = hw.gpus.count
    b.gpu_fixed = [gpu_fixed_bytes(cfg, b.policy, hw.gpus.usable_bytes, expert, first=g == 0, last=g == G - 1,
                                   cuda=not hw.cpu_only) for g in range(G)]


def dense_format(o: CompileOptions, hw: HardwareSpec) -> str:
    """How the plan holds dense weights. A CPU computes the exact float32 path (it has no bf16 matmul
    worth the rounding on most hosts); GPUs keep FP8 as stored: a decode token reads half the dense
    bytes of bf16."""
    if o.dense_format is not None:
        return o.dense_format
    return "float32" if hw.cpu_only else "fp8"


def max_bucket(o: CompileOptions, hw: HardwareSpec) -> int:
    """The largest prefill bucket the plan may get: the given buckets', else the largest the cost model may
    choose (powers of two up to MAX_BUCKET and context / 3; none on a cpu-only spec, where steps and
    eager forwards both run eagerly)."""
    if o.prefill_buckets is not None:
        return max(o.prefill_buckets, default=0)
    if hw.cpu_only:
        return 0
    limit = min(MAX_BUCKET, largest_bucket_for(o.context))
    return 1 << (limit.bit_length() - 1) if limit >= 2 else 0
