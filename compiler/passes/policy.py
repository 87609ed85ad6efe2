"""policy: the plan's execution policy, validated by the plan schema before any kernel is built; the notes
say which workload each choice came from (least_wait.py) and what each workload's typical call waits."""

from __future__ import annotations

import numpy as np

from ostinato.adaptation import AdaptPolicy, default_policy
from ostinato.checkpoint import model_sizes
from ostinato.plan import Policy
from ostinato.validation import SchemaError, validate

from .build import Build
from .options import ADAPT, CPU_STEP, CompileError, CompileOptions
from .predictions import predictions_position


def policy(b: Build) -> None:
    cfg, hw, o = b.config, b.hardware, b.options
    if bool(b.slice_reserve) != (b.shard_threshold is not None):  # the memory rows count what the runtime holds
        raise CompileError(f"the slices' staging is {'' if b.slice_reserve else 'not '}counted and policy."
                           f"shard_threshold is {b.shard_threshold}: the re-plan loop left them apart")
    b.notes += _workload_notes(b)
    try:
        b.execution = validate(Policy, dict(
            context=o.context, sessions=o.sessions, prefill_threshold=b.threshold, shard_threshold=b.shard_threshold,
            shard_major_copy=b.shard_major_copy,
            prefill_chunk=o.prefill_chunk,
            upload_group=o.upload_group, snapshots=o.snapshots, decode_graph_routes=cfg.num_experts_per_tok,
            prefill_buckets=list(b.buckets), cpu_threads=hw.host.cores, decode_cpu_threads=b.cost.decode_pool_threads,
            objective_phases=list(o.objective_phases),
            speculative="mtp" if b.mtp_placed else "off", adapt=adapt_policy(b).model_dump(), cpu_step=cpu_step(o),
            chat_encoding=b.chat_encoding),
            "the plan's policy")
    except SchemaError as e:
        raise CompileError(str(e)) from None


def _workload_notes(b: Build) -> list[str]:
    t, s = b.threshold, b.shard_threshold
    split = "split-route at any size" if t is None else f"split-route up to {t:,d} tokens, upload-once above"
    split += f" (priced on {b.threshold_from})"
    if s is not None:
        split += (f"; uploads sharded over the {b.hardware.gpus.count} GPUs' links above {s:,d} tokens (priced on "
                  f"{b.shard_from})")
    buckets = f"bucket steps up to {b.buckets[-1]}" if b.buckets else "no bucket steps"
    notes = [f"prefill: {split}; {buckets} (priced on {b.buckets_from})",
             *([b.shard_copy_why] if b.shard_copy_why else []),
             f"re-placement budget (policy.adapt.max_bytes): the link's bytes in {b.idle_from}",
             f"predictions: priced at session position {predictions_position(b):,d}"
             + (f" ({b.workloads[0].name}'s median cached prefix)" if b.workloads else "")]
    for w in b.workloads:
        n, at = int(np.sort(w.appended)[(len(w.appended) - 1) // 2]), w.median_cached
        wait = (b.cost.prefill(n, t, b.buckets, at, s) + b.cost.decode_step(at + n)) * 1e3
        top = b.buckets[-1] if b.buckets else 0
        bucket = float(np.mean(w.appended <= top))
        upload = 0.0 if t is None else float(np.mean(w.appended > max(t, top)))
        sharded = 0.0 if s is None else float(np.mean(w.appended > max(s, top)))
        notes.append(f"workload {w.name} ({w.sessions} sessions, {len(w.appended):,d} calls after a session's first): "
                     f"median append {n:,d} tokens on a median cached prefix of {w.median_cached:,d}, predicted "
                     f"wait {wait:,.0f} ms; {bucket:.0%} of its calls as bucket steps, {1 - bucket - upload:.0%} "
                     f"split-route, {upload:.0%} upload-once"
                     + (f" ({sharded:.0%} sharded)" if s is not None else ""))
    return notes


def cpu_step(o: CompileOptions) -> str:
    """policy.cpu_step: --cpu-step, checked."""
    if o.cpu_step not in CPU_STEP:
        raise CompileError(f"--cpu-step is {o.cpu_step!r}: one of {', '.join(CPU_STEP)}")
    return o.cpu_step


def adapt_policy(b: Build) -> AdaptPolicy:
    """policy.adapt: --adapt, by default idle where there are GPUs to promote experts onto."""
    o, hw, pl = b.options, b.hardware, b.placement
    mode = o.adapt if o.adapt is not None else "off" if hw.cpu_only else "idle"
    if mode not in ADAPT:
        raise CompileError(f"--adapt is {mode!r}: one of {', '.join(ADAPT)}")
    return default_policy(mode, sum(len(h) for h in pl.hot), model_sizes(b.config).expert_bytes,
                          hw.link.h2d_bandwidth, b.idle_s)
