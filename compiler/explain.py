"""The human-readable view of a plan (ostinato-compile --explain)."""

from __future__ import annotations

from ostinato.plan import Plan

from .cost_model import CostModel
from .memory_model import shard_major_down_bytes
from .passes.shard_copy import shard_copy_line

GIB = 1024**3


def explain(plan: Plan, cost: CostModel | None = None, position: int | None = None) -> str:
    """The plan as a readable table; with the `cost` model it was priced with (a compile's), the prefill modes'
    crossover points too, priced at session `position` (the plan's predictions')."""
    m, p, hw = plan.model, plan.predictions, plan.hardware
    # a cpu-only plan's device is the CPU itself: named so (the plan file calls it gpu0 like any device)
    runs_on = (f"the CPU as its {'device' if hw.gpus.count == 1 else f'{hw.gpus.count} devices'}, in host memory"
               if hw.cpu_only else f"{hw.gpus.count}x {hw.gpus.name}")
    out = [f"plan for {m.path}: {m.layers} layers x {m.routed_experts} experts (top-{m.top_k}), "
           f"{runs_on} ({hw.name})",
           f"routing profile: {plan.provenance.profile_source}",
           _workloads_line(plan), ""]
    kinds = []  # every GPU component any device has, in the plan's order
    for dev in plan.memory:
        kinds += [k for k in dev.components if dev.device != "host" and k not in kinds]
    out.append("device  layers    " + "".join(f"{k[:12]:>13s}" for k in kinds) + "        total   hot  route share")
    for dev in plan.memory:
        if dev.device == "host":
            continue
        g = int(dev.device[3:])
        layers = [l for l in plan.layers if l.gpu == g]
        hot = sum(len(l.hot_experts) for l in layers)
        share = sum(l.hot_route_share for l in layers) / len(layers) if layers else 0.0
        span = f"{layers[0].layer}-{layers[-1].layer}" if layers else "-"
        out.append(f"{hw.device_name(g):7s} {span:9s} "
                   + "".join(f"{dev.components.get(k, 0) / GIB:12.3f}G" for k in kinds)
                   + f" {dev.total_bytes / GIB:11.3f}G {hot:5d}  {share:10.1%}")
    if plan.mtp is not None:  # counted in its GPU's row above (and its cold experts in the host's)
        t = plan.mtp
        out.append(f"mtp     {t.layer:<9d} on {hw.device_name(t.gpu)} beside the head ({t.attention}): "
                   f"{len(t.hot_experts)} hot experts, {t.hot_route_share:.1%} of its routes")
    host = next(d for d in plan.memory if d.device == "host")
    out.append("host    " + ", ".join(f"{k} {v / GIB:.3f}G" for k, v in host.components.items())
               + f"; total {host.total_bytes / GIB:.3f}G of {host.usable_bytes / GIB:.1f}G")
    if hw.cpu_only:  # one memory: the device's bytes are the host's too
        devices = sum(d.total_bytes for d in plan.memory if d.device != "host")
        out.append(f"        one memory on a cpu-only plan: {'the device' if hw.gpus.count == 1 else 'the devices'} "
                   f"{devices / GIB:.3f}G + the host {host.total_bytes / GIB:.3f}G = "
                   f"{(devices + host.total_bytes) / GIB:.3f}G of {host.usable_bytes / GIB:.1f}G")
    t, s, buckets = plan.policy.prefill_threshold, plan.policy.shard_threshold, plan.policy.prefill_buckets
    steps = (f"captured bucket steps ({', '.join(map(str, buckets))} tokens) up to {buckets[-1]} tokens, "
             if buckets else "no bucket steps (none predicted faster than eager), ")
    out += ["", _context_line(plan),
            f"hot route share (profiled): {p.hot_route_share:.1%}",
            f"prefill: {steps}split-route up to {t if t is not None else 'any number of'} tokens, upload-once above"
            + (f", sharded over the {hw.gpus.count} GPUs' links above {s} tokens" if s is not None else ""),
            *(crossover_lines(plan, cost, position) if cost is not None else []),
            *([_shard_copy_line(plan)] if s is not None else []),
            f"predicted wait after a 120-token tool output: {p.wait_after_tool_output_120_tokens_ms:.1f} ms",
            f"predicted decode: {p.decode_ms_per_token:.2f} ms/token = {p.decode_tokens_per_s:.1f} tokens/s",
            _decode_threads_line(plan, cost),
            f"MTP speculative decoding ({plan.policy.speculative}): {p.speculative.reason}",
            _adapt_line(plan.policy.adapt, hw.link.h2d_bandwidth),
            f"decode step on the CPU: {plan.policy.cpu_step}"
            + (" (one compiled call per token, built at the first load)" if plan.policy.cpu_step == "compiled"
               else " (op by op)")]
    return "\n".join(out)


def _shard_copy_line(plan: Plan) -> str:
    """policy.shard_major_copy of a plan that shards: the copy's bytes, held or not, from the host's memory row."""
    host = next(d for d in plan.memory if d.device == "host")
    copy = shard_major_down_bytes(host.components)
    rest = host.total_bytes - host.components.get("shard_major_down", 0)
    return shard_copy_line(plan.policy.shard_major_copy, copy, host.usable_bytes - rest)


def _decode_threads_line(plan: Plan, cost: CostModel | None) -> str:
    """policy.decode_cpu_threads, with the cost model's reason when the compile's model is at hand."""
    d, cores = plan.policy.decode_cpu_threads, plan.policy.cpu_threads
    if d is None:
        return f"decode CPU expert pool: all {cores} threads (a plan without policy.decode_cpu_threads)"
    if cost is not None and cost.decode_pool_threads == d:
        return cost.decode_threads_reason()
    return f"decode runs the CPU expert pool on {d} of {cores} threads (policy.decode_cpu_threads)"


def crossover_lines(plan: Plan, cost: CostModel, position: int | None) -> list[str]:
    """Where the dynamic prefill changes mode (policy.prefill_threshold, policy.shard_threshold), in tokens, with
    both sides' predicted prefill ms at the last token count of the mode below and the first of the one above."""
    t, s = plan.policy.prefill_threshold, plan.policy.shard_threshold
    price = {"split": cost.split_prefill, "upload": cost.upload_prefill, "sharded": cost.sharded_prefill}
    said = {"split": "split-route", "upload": "upload-once over one link", "sharded": "upload-once sharded"}
    at = f"session position {position:,d}" if position is not None else "the end of the plan's context"
    out = []
    for n in sorted({x for x in (t, s) if x is not None}):
        below, above = cost.eager_mode(n, t, s), cost.eager_mode(n + 1, t, s)
        sides = "; ".join(f"{k:,d} tokens {below} {price[below](k, position) * 1e3:,.1f} ms, {above} "
                          f"{price[above](k, position) * 1e3:,.1f} ms" for k in (n, n + 1))
        out.append(f"  crossover {said[below]} -> {said[above]} after {n:,d} tokens ({at}): {sides}")
    if s is not None and s == t:  # no prompt length uploads over one link: where it would take over from split-route
        one = cost.crossover(position=position)
        out.append("  (one link alone: " + ("split-route at any size)" if one is None else
                   f"split-route -> upload-once over one link after {one:,d} tokens: {one + 1:,d} tokens split "
                   f"{cost.split_prefill(one + 1, position) * 1e3:,.1f} ms, one link "
                   f"{cost.upload_prefill(one + 1, position) * 1e3:,.1f} ms, sharded "
                   f"{cost.sharded_prefill(one + 1, position) * 1e3:,.1f} ms)"))
    return out


CONTEXT_KINDS = ("kv_cache", "kv_snapshots", "decode_state")  # the device bytes that grow with the context


def _context_line(plan: Plan) -> str:
    """What the reserved context costs: its bytes on the devices, and the hot experts they would hold."""
    held = sum(d.components.get(k, 0) for d in plan.memory if d.device != "host" for k in CONTEXT_KINDS)
    experts = held // plan.model.expert_bytes
    return (f"context: {plan.policy.context:,d} tokens x {plan.policy.sessions} session(s); its KV cache, turn "
            f"snapshots and decode step state take {held / GIB:.3f}G on the device{'s' if len(plan.memory) > 2 else ''}"
            f", the room of {experts:,d} hot experts (--context trades them)")


def _workloads_line(plan: Plan) -> str:
    names = list(plan.provenance.workloads)
    if not names:
        return "workloads: none (threshold and buckets priced at the plan's context; an assumed idle period)"
    return (f"workloads: {', '.join(names)} (threshold, buckets and re-placement budget priced on them: the notes "
            f"say which came from which)")


def _adapt_line(a, h2d_bandwidth: float) -> str:
    if a.mode == "off":
        return "re-placement between turns: off (--adapt idle turns it on)"
    return (f"re-placement between turns (idle): up to {a.max_experts} experts and {a.max_bytes / 1e9:.1f} GB per "
            f"idle period (the link's {a.max_bytes / h2d_bandwidth:.3g} s), session routes decayed x{a.decay:g} a "
            f"turn, blended {1 - a.prior:g}/{a.prior:g} with "
            f"the plan's hot set, swaps gaining at least {a.min_gain:.1%} of a layer's routes")
