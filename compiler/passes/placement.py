"""placement: the hot experts of each layer and the layers' split over the GPUs (compiler/placement.py
solves it), checked against the GPUs' and the host's memory. Where the plan does not fit, it gives up
what it may and fits again (memory, then placement): first an MTP block --speculative auto placed, then
the prefill buckets' graph pool (user-given buckets are never dropped)."""

from __future__ import annotations

import logging

from ostinato.checkpoint import model_sizes

from ..placement import DoesNotFit, PlacementProblem, place
from .build import Build, mtp_counts
from .footprint import device_components, host_components
from .memory import memory
from .options import CompileError

log = logging.getLogger("ostinato.compile")


def placement(b: Build) -> None:
    """The hot sets and the layer split; where they do not fit, the plan without the MTP block (as where
    speculation does not pay), else without bucket steps: memory again, reserve 0, and placement again."""
    while True:
        try:
            _place(b)
            return
        except CompileError:
            if b.mtp_placed and b.options.speculative == "auto":
                b.notes.append("no room for the MTP block beside the head: planned without it "
                               "(policy.speculative: off)")
                log.info("pass placement: no room for the MTP block, planning without it")
                b.mtp_placed = False
            elif not b.bucket_reserve or b.options.prefill_buckets is not None:
                raise
            else:
                b.notes.append(f"no room for the prefill buckets' graph pool ({b.bucket_reserve} tokens): "
                               f"planned without bucket steps")
                log.info("pass placement: no room for a %d-token bucket pool, planning without buckets",
                         b.bucket_reserve)
                b.bucket_reserve = 0
        memory(b)


def _place(b: Build) -> None:
    cfg, hw = b.config, b.hardware
    expert = model_sizes(cfg).expert_bytes
    counts = b.profile.phase_counts(b.options.objective_phases).numpy()
    budgets = tuple(hw.gpus.usable_bytes - sum(f.values()) for f in b.gpu_fixed)
    mtp = mtp_counts(b)
    problem = PlacementProblem(counts=counts, layer_bytes=tuple(sum(l.values()) for l in b.layer_bytes),
                               gpu_budget=budgets, expert_bytes=expert, max_hot_per_layer=b.options.max_hot_per_layer,
                               mtp_bytes=sum(b.mtp_bytes.values()),
                               mtp_counts=None if mtp is None else mtp.numpy())
    if cfg.n_layers < hw.gpus.count:
        raise CompileError(f"{hw.gpus.count} GPUs for {cfg.n_layers} layers: plan with at most {cfg.n_layers} GPUs")
    try:
        b.placement = place(problem)
    except DoesNotFit as e:
        raise CompileError(f"does not fit: {_device_short(b, e.device)} is short by {e.short_by:,d} bytes for its "
                           f"layers' dense weights, KV cache (context {b.options.context:,d} x {b.options.sessions} "
                           f"session(s)) and buffers. Use a shorter --context, fewer --sessions, a smaller "
                           f"--prefill-chunk, {_smaller_or_more(b)}.") from None
    if sum(len(h) for h in b.placement.hot) + len(b.placement.mtp_hot) == 0 and b.options.max_hot_per_layer != 0:
        G = hw.gpus.count
        short = expert - max(budgets[g] - (problem.mtp_bytes if g == G - 1 else 0)
                             - sum(problem.layer_bytes[l] for l in range(cfg.n_layers) if b.placement.layer_gpu[l] == g)
                             for g in range(G))
        raise CompileError(f"no hot expert fits: every GPU is short by at least {short:,d} bytes of one expert "
                           f"({expert:,d} B). Use a shorter --context, fewer --sessions or more GPUs.")
    _check_host(b, expert)


def _check_host(b: Build, expert: int) -> None:
    # without the down matrices' shard-major copy: the plan holds it only where the host has room beside the
    # rest (the shard_copy pass decides, once the cost model has decided whether the plan shards)
    host, hw = host_components(b, expert, shard_major_copy=False), b.hardware
    need = sum(host.values())
    if hw.cpu_only:  # the device is the host itself: what it holds is host memory too
        device = sum(sum(device_components(b, g, expert).values()) for g in range(hw.gpus.count))
        if need + device > hw.host.usable_bytes:
            raise CompileError(
                f"does not fit: host memory ({hw.host.usable_bytes:,d} usable bytes) is short by "
                f"{need + device - hw.host.usable_bytes:,d} bytes: on a cpu-only spec it holds the device's "
                f"{device:,d} B (dense weights, KV cache, buffers, hot experts), the cold experts' "
                f"{host['cold_experts']:,d} B and the CPU workspace. Use a shorter --context, fewer --sessions, "
                f"{_smaller_or_more(b)}.")
    elif need > hw.host.usable_bytes:
        raise CompileError(f"does not fit: host memory is short by {need - hw.host.usable_bytes:,d} bytes "
                           f"(cold experts {host['cold_experts']:,d} B + workspace). "
                           "Use a machine with more memory or more GPUs (more hot experts).")


def _device_short(b: Build, g: int) -> str:
    """The device that does not fit, as people know it."""
    hw = b.hardware
    if hw.cpu_only:
        return (f"{hw.device_name(g)} (the CPU as a device: {hw.gpus.usable_bytes:,d} bytes of host memory, the spec's "
                f"gpus.usable_bytes)")
    return f"gpu{g} ({hw.gpus.name}, {hw.gpus.usable_bytes:,d} usable bytes)"


def _smaller_or_more(b: Build) -> str:
    """The last ways out of a plan that does not fit: FP8 matrices held as stored where the plan dequantizes them;
    more GPUs; on a cpu-only spec, all of the host's memory for the CPU device, or a host with more."""
    hw = b.hardware
    fp8 = "--dense-format fp8 (FP8 matrices held as stored), " if b.policy.dense_format != "fp8" else ""
    if not hw.cpu_only:
        return f"{fp8}or more GPUs"
    if hw.gpus.count * hw.gpus.usable_bytes < hw.host.usable_bytes:
        return (f"{fp8}or a spec that gives the CPU device the host's memory (ostinato-calibrate cpu-only OUT writes "
                f"one for this host)")
    return f"{fp8}or a host with more memory"
