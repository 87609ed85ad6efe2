"""The plan decides the sharded upload (#57): the cost model prices it, the compiler sets policy.shard_threshold
and counts the slices' staging, the engine runs prefills past the threshold sharded.

- the cost model: a sharded layer's upload is its slices over all G links at once, bounded by the host memory, with
  the activations' host -> device bytes; its compute the layer's GPU's dense part, hot experts and slice, the
  exchange through the host out and back; no sharding on one GPU or a cpu-only spec, nor where the host memory
  feeds no more than one link;
- the compiler: the V4-Flash plan on rtx4090d-x4 shards (threshold at least the upload threshold, each GPU's
  upload_staging holding two buffers of slices more, predictions in mode "sharded"); where sharding does not pay
  the plan neither shards nor counts the slices;
- the schema: a shard threshold below the upload threshold, or without one, is refused; a plan without the
  field reads as never sharded;
- the engine (2 planned GPUs, all the CPU): split-route, single-link upload and sharded upload by prompt length
  as the plan's thresholds say, each within 1e-4 of the reference; $OSTINATO_UPLOAD overrides the plan;
- allocation = plan for a 2-GPU plan that shards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from allocation_helpers import TWO_GPUS, _check, _compile, _filled_session
from engine_helpers import IDS, _close, _variant, on_gpus
from test_pinned_arena import force_pinning

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.compiler.cost_model import CostModel, LayerCostInputs
from ostinato.compiler.explain import explain
from ostinato.compiler.memory_model import layer_dense_bytes
from ostinato.compiler.passes.predictions import predictions_position
from ostinato.hardware import load_hardware, parse_hardware
from ostinato.plan import Policy
from ostinato.plans import plans_dir
from ostinato.runtime.engine.held_memory import held_memory
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.sharded_upload import ENV
from ostinato.validation import SchemaError, validate

ROOT = Path(__file__).resolve().parents[1]
V4 = ROOT / "plans" / "models" / "deepseek-v4-flash"
EXPERT = 13_369_344  # V4-Flash's expert, MXFP4 with scales


def v4_cost(hw, hot: int = 64) -> CostModel:
    """V4-Flash in fp8 on `hw` (a spec), the first `hot` experts of every layer hot, routes even."""
    cfg = ModelConfig.from_json(V4)
    E = cfg.n_routed_experts
    mask = np.arange(E) < hot
    layers = [LayerCostInputs(0, layer_dense_bytes(cfg, l, "fp8"),
                              sum(int(np.prod(s.shape)) for s in layer_specs(cfg, l, with_experts=False)
                                  if len(s.shape) == 2 and s.role != "hash_table" and not s.is_scale
                                  and not s.name.endswith("_fn")),
                              mask, np.full(E, 1.0 / E)) for l in range(cfg.n_layers)]
    return CostModel(cfg, hw, layers, EXPERT, 0, 65_536, dense_format="fp8")


def with_host_bandwidth(name: str, bandwidth: float):
    """Preset `name` with the host memory read at `bandwidth` bytes/s."""
    data = yaml.safe_load((plans_dir() / "hardware" / f"{name}.yaml").read_text())
    data["host"]["bandwidth"] = bandwidth
    return data


# ----- the cost model ---------------------------------------------------------------------------------------
def test_a_sharded_layer_is_its_slices_over_every_link_and_the_exchange_through_the_host():
    hw = load_hardware("rtx4090d-x4")
    c, G, link = v4_cost(hw), 4, hw.link
    D, n, layer = c.cfg.hidden_size, 1000, 5
    cold = c.distinct(layer, n, False)
    upload, compute = c.sharded_upload_layer(layer, n)
    # slices: 1/G of every distinct cold expert per link, G links at once (100 GB/s, under the host's 203);
    # each other GPU's link also carries x (bf16) in and its float32 partial back to the layer's GPU's
    links = min(G * link.h2d_bandwidth, hw.host.bandwidth)
    assert links == G * link.h2d_bandwidth
    assert upload == pytest.approx((cold * EXPERT + (G - 1) * n * D * (2 + 4)) / links + link.latency_s, rel=1e-12)
    out = 2 * link.latency_s + n * D * 2 / link.d2h_bandwidth + n * D * 2 / link.h2d_bandwidth
    back = 2 * link.latency_s + n * D * 4 / link.d2h_bandwidth + (G - 1) * n * D * 4 / link.h2d_bandwidth
    assert c.exchange_time(n) == pytest.approx((out, back), rel=1e-12)
    piece = c.gpu_experts_time(cold / G, c.routes(layer, n, False) / G)
    home = c.shared_expert_time(layer, n) + c.gpu_experts_time(c.distinct(layer, n, True), c.routes(layer, n, True))
    first = c.before_experts_time(layer, n)
    assert compute == pytest.approx(first + max(home + piece, out + piece) + back, rel=1e-12)
    # against the single-link upload: a quarter of the link time, the same cold experts
    single, _ = c.upload_layer(layer, n)
    assert single == pytest.approx(cold * EXPERT / link.h2d_bandwidth + link.latency_s, rel=1e-12)
    assert upload < single / 3
    assert c.sharded_prefill(n) < c.upload_prefill(n)
    assert 0 <= c.shard_crossover() < n


def test_no_sharding_on_one_gpu_a_cpu_only_spec_or_a_host_that_feeds_one_link():
    for name in ("h200-x1", "cpu-only"):
        c = v4_cost(load_hardware(name))
        assert c.shards == 1 and c.shard_crossover() is None and c.exchange_time(100) == (0.0, 0.0)
        with pytest.raises(ValueError, match="a sharded upload needs 2\\+ GPUs"):
            c.sharded_upload_layer(0, 100)
    hw = load_hardware("rtx4090d-x4")
    slow = parse_hardware(with_host_bandwidth("rtx4090d-x4", hw.link.h2d_bandwidth), "one link's host")
    c = v4_cost(slow)  # four links at once move no more than one: the slices gain nothing, the exchange costs
    assert c.sharded_upload_layer(5, 1000)[0] > c.upload_layer(5, 1000)[0]
    assert c.shard_crossover() is None


# ----- the compiler -----------------------------------------------------------------------------------------
def _flash(tmp_path, hardware="rtx4090d-x4"):
    return compile_plan(CompileOptions(model=V4, output=tmp_path / "plan.yaml", hardware=hardware,
                                       profile="synthetic:0.9"))


def test_the_flash_plan_on_four_gpus_shards_its_longer_uploads(tmp_path):
    b = _flash(tmp_path)
    p, c = b.plan, b.cost
    t, s = p.policy.prefill_threshold, p.policy.shard_threshold
    assert t is not None and s is not None and s >= t
    for m in p.memory:  # the whole experts' pair and the slices' pair: a quarter of an expert each
        if m.device != "host":
            assert m.components["upload_staging"] == 2 * p.policy.upload_group * (EXPERT + EXPERT // 4), m.device
    at = b.workloads[0].median_cached
    for turn in p.predictions.prefill:
        assert turn.sharded_ms is not None
        assert (turn.mode == "sharded") == (turn.tokens > max(s, *p.policy.prefill_buckets)), turn
        # where the plan shards, the sharded upload is the faster, past the prefill chunk too (16,384 tokens: four
        # chunk forwards, each uploading and exchanging its own, as the runtime runs them)
        if turn.mode == "sharded":
            assert turn.sharded_ms < turn.upload_ms, turn
    assert any(turn.mode == "sharded" for turn in p.predictions.prefill)
    # past the threshold (at the workloads' position) the sharded upload is the faster upload
    assert c.sharded_prefill(s + 1, at) < c.upload_prefill(s + 1, at)
    assert any(f"uploads sharded over the 4 GPUs' links above {s:,d} tokens" in note for note in p.notes)


def test_where_sharding_does_not_pay_the_plan_neither_shards_nor_counts_the_slices(tmp_path):
    hw = load_hardware("rtx4090d-x4")
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(with_host_bandwidth("rtx4090d-x4", hw.link.h2d_bandwidth)))
    p = _flash(tmp_path, str(tmp_path / "hw.yaml")).plan
    assert p.policy.prefill_threshold is not None and p.policy.shard_threshold is None
    assert all(m.components["upload_staging"] == 2 * p.policy.upload_group * EXPERT
               for m in p.memory if m.device != "host")
    assert all(turn.mode != "sharded" and turn.sharded_ms is None for turn in p.predictions.prefill)


def test_explain_shows_the_crossovers_with_both_sides_predicted_ms(tmp_path):
    b = _flash(tmp_path)
    p, c, at = b.plan, b.cost, predictions_position(b)
    t = p.policy.prefill_threshold
    text = explain(p, c, at)
    assert f"sharded over the 4 GPUs' links above {p.policy.shard_threshold} tokens" in text
    assert (f"crossover split-route -> upload-once sharded after {t:,d} tokens (session position {at:,d}): "
            f"{t:,d} tokens split {c.split_prefill(t, at) * 1e3:,.1f} ms, "
            f"sharded {c.sharded_prefill(t, at) * 1e3:,.1f} ms; {t + 1:,d} tokens split") in text
    one = c.crossover(position=at)  # where one link alone would take over: further out
    assert one > t and f"(one link alone: split-route -> upload-once over one link after {one:,d} tokens" in text
    # a plan that uploads over one link first: both crossovers, in order
    later = p.replace(policy=p.policy.replace(shard_threshold=t + 100))
    lines = [line for line in explain(later, c, at).splitlines() if "crossover" in line]
    assert [line.split(" after ")[0].strip() for line in lines] == [
        "crossover split-route -> upload-once over one link",
        "crossover upload-once over one link -> upload-once sharded"]
    n = t + 100
    assert (f"after {n:,d} tokens (session position {at:,d}): {n:,d} tokens upload "
            f"{c.upload_prefill(n, at) * 1e3:,.1f} ms, sharded {c.sharded_prefill(n, at) * 1e3:,.1f} ms") in lines[1]
    assert "crossover" not in explain(p)  # a plan file alone: the thresholds, without the cost model's figures


def _host(plan):
    return next(m for m in plan.memory if m.device == "host")


def _copy_line(copy: int, room: int | None = None, lacks: int | None = None) -> str:
    said = (f"held: the host has room, {room / 1e9:.1f} GB beside the rest" if lacks is None else
            f"not held: the host lacks {lacks / 1e9:.1f} GB; slices of w2 are copied from strided rows")
    return f"shard-major copy of the down matrices: {copy / 1e9:.1f} GB of host memory ({said})"


def test_the_plan_holds_the_shard_major_copy_where_the_host_has_room_and_says_so(tmp_path):
    p = _flash(tmp_path).plan
    host = _host(p)
    copy = (host.components["cold_experts"] + host.components.get("hot_expert_rows", 0)) // 3  # each row's w2
    assert p.policy.shard_threshold is not None and p.policy.shard_major_copy
    assert host.components["shard_major_down"] == copy > 0
    line = _copy_line(copy, room=host.free_bytes + copy)
    assert line in p.notes and line in explain(p).splitlines()


def test_a_host_without_room_for_the_copy_still_shards_without_it(tmp_path):
    """A host whose usable memory is a byte short of the plan with the copy compiles the same plan (thresholds,
    placement) without it: policy.shard_major_copy false, no shard_major_down row, the notes and --explain say
    by how much it was short; a byte more and the copy is held."""
    held = _flash(tmp_path / "held").plan
    total, copy = _host(held).total_bytes, _host(held).components["shard_major_down"]
    data = yaml.safe_load((plans_dir() / "hardware" / "rtx4090d-x4.yaml").read_text())
    plans = {}
    for usable in (total - 1, total):
        data["host"]["usable_bytes"] = usable
        (tmp_path / f"{usable}.yaml").write_text(yaml.safe_dump(data))
        plans[usable] = _flash(tmp_path / str(usable), str(tmp_path / f"{usable}.yaml")).plan
    short = plans[total - 1]
    p, host = short.policy, _host(short)
    assert not p.shard_major_copy and "shard_major_down" not in host.components
    assert (p.prefill_threshold, p.shard_threshold) == (held.policy.prefill_threshold, held.policy.shard_threshold)
    assert [lp.hot_experts for lp in short.layers] == [lp.hot_experts for lp in held.layers]
    assert host.total_bytes == total - copy and host.free_bytes == copy - 1
    line = _copy_line(copy, lacks=1)
    assert line in short.notes and line in explain(short).splitlines()
    room = plans[total]  # exactly the total: held, no byte free
    assert room.policy.shard_major_copy and _host(room).components["shard_major_down"] == copy
    assert _host(room).free_bytes == 0


# ----- the schema -------------------------------------------------------------------------------------------
def test_the_shard_threshold_is_checked_and_older_plans_never_shard(tmp_path):
    policy = _flash(tmp_path).plan.policy.model_dump()
    t = policy["prefill_threshold"]
    assert policy["shard_major_copy"] is True
    del policy["shard_major_copy"]  # a plan written before the copy was a plan decision: no copy
    assert validate(Policy, policy, "an older plan's policy").shard_major_copy is False
    del policy["shard_threshold"]  # a plan written before the field
    assert validate(Policy, policy, "an older plan's policy").shard_threshold is None
    with pytest.raises(SchemaError, match="field 'policy.shard_major_copy' is true: the copy serves sharded uploads"):
        validate(Policy, {**policy, "shard_major_copy": True}, "policy")
    for bad, threshold in ((t - 1, t), (10, None)):
        with pytest.raises(SchemaError, match="field 'policy.shard_threshold' is"):
            validate(Policy, {**policy, "shard_threshold": bad, "prefill_threshold": threshold}, "policy")
    assert validate(Policy, {**policy, "shard_threshold": t}, "policy").shard_threshold == t


# ----- the engine -------------------------------------------------------------------------------------------
UPLOAD, SHARD = 16, 50  # the tiny plan's thresholds here: split up to 16 tokens, single link up to 50, sharded above


def _planned(compiled, gpus: int = 2, shard: int | None = SHARD):
    plan = on_gpus(_variant(compiled[0], "mixed", UPLOAD), gpus)
    return plan.replace(policy=plan.policy.replace(shard_threshold=shard))


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_the_engine_splits_uploads_and_shards_by_the_plans_thresholds(compiled, tiny_ckpt, reference, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    engine = load_engine(_planned(compiled), tiny_ckpt, device="cpu")
    ex = engine.executor
    assert ex.sharded is not None and ex.sharded.threshold == SHARD and ex.upload_as == "upload"
    for n, mode in ((10, "split"), (30, "upload"), (100, "sharded")):
        session = engine.new_session()
        assert session.prefill_mode(n) == mode
        before, sliced = ex.counters.copy(), sum(ex.sharded.bytes_uploaded)
        logits = session.prefill(IDS[:n])
        c = ex.counters.minus(before)
        assert ex.mode == mode, n
        assert (c.experts_uploaded > 0) == (mode != "split"), n
        # the slices crossed the links only in the sharded prefill, every one of its experts' once
        assert sum(ex.sharded.bytes_uploaded) - sliced == (c.bytes_uploaded if mode == "sharded" else 0), n
        _close(logits, reference.new_session().prefill(IDS[:n]))
    engine.close()


@pytest.mark.slow  # the compiled plan's engine
def test_the_environment_overrides_the_plans_choice(compiled, tiny_ckpt, monkeypatch):
    monkeypatch.setenv(ENV, "single")  # the plan shards; the experiment does not
    engine = load_engine(_planned(compiled), tiny_ckpt, device="cpu")
    assert engine.executor.sharded is None and engine.new_session().prefill_mode(100) == "upload"
    engine.close()
    monkeypatch.setenv(ENV, "sharded")  # the plan does not shard; the experiment shards every upload
    engine = load_engine(_planned(compiled, shard=None), tiny_ckpt, device="cpu")
    session = engine.new_session()
    assert session.prefill_mode(30) == "upload"
    session.prefill(IDS[:30])
    assert engine.executor.mode == "sharded" and sum(engine.executor.sharded.bytes_uploaded) > 0
    engine.close()
    monkeypatch.delenv(ENV)  # the plan does not shard: no slices
    engine = load_engine(_planned(compiled, shard=None), tiny_ckpt, device="cpu")
    assert engine.executor.sharded is None and engine.executor.upload_shards == 1
    engine.close()


# ----- allocation = plan ------------------------------------------------------------------------------------
SLOW_LINKS = {**TWO_GPUS, "name": "two-gpus-slow-links", "description": "two small GPUs on slow links, a slow host "
              "(sharding pays)", "host": {**TWO_GPUS["host"], "bandwidth": 1.0e9, "matmul_flops": 1.0e8,
                                          "op_dispatch_s": 1.0e-9},
              "link": {"h2d_bandwidth": 1.0e8, "d2h_bandwidth": 1.0e8, "latency_s": 1.0e-6}}


@pytest.mark.slow  # a compiled plan, a session filled to the planned context
def test_a_two_gpu_plan_that_shards_holds_what_it_counted(tiny_ckpt, tmp_path, kernel_dir, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    context = 512
    plan = _compile(tiny_ckpt, tmp_path, SLOW_LINKS, kernel_dir, context=context, prefill_chunk=64,
                    max_hot_per_layer=5, dense_format="float32", speculative="off")
    assert plan.policy.shard_threshold is not None and {lp.gpu for lp in plan.layers} == {0, 1}
    force_pinning(monkeypatch)  # as on GPUs: host rows pinned, so the down matrices' shard-major copy is made
    engine = load_engine(tmp_path / "plan.yaml", device="cpu")
    assert engine.executor.sharded is not None
    session = _filled_session(engine, context)
    assert sum(engine.executor.sharded.bytes_uploaded) > 0  # its prefills ran sharded
    _check(engine, session)  # the slices' pair beside the whole experts' pair, as the plan counts them
    held = held_memory(engine, [session])
    for g in (0, 1):
        assert held.rows[f"gpu{g}"]["upload_staging"] == engine.plan.memory[g].components["upload_staging"]
    host = next(m for m in engine.plan.memory if m.device == "host").components
    assert held.rows["host"]["shard_major_down"] == host["shard_major_down"] > 0
    engine.close()


@pytest.mark.slow  # two compiled plans, a session filled to the planned context
def test_a_two_gpu_plan_without_room_for_the_copy_shards_exactly_from_strided_rows(tiny_ckpt, tmp_path, kernel_dir,
                                                                                    monkeypatch):
    """The plan above on a host a byte short of it with the down matrices' copy: it shards without the copy,
    loaded as on GPUs (pinned rows) holds no copy, copies w2's slices as strided views of the pinned rows, its
    sharded prefill equals the single-link upload's within 1e-4, and it holds what it counted."""
    monkeypatch.delenv(ENV, raising=False)
    context, options = 512, dict(prefill_chunk=64, max_hot_per_layer=5, dense_format="float32", speculative="off")
    held = _compile(tiny_ckpt, tmp_path / "held", SLOW_LINKS, kernel_dir, context=context, **options)
    assert held.policy.shard_major_copy and _host(held).components["shard_major_down"] > 0
    short = {**SLOW_LINKS, "host": {**SLOW_LINKS["host"], "usable_bytes": _host(held).total_bytes - 1}}
    plan = _compile(tiny_ckpt, tmp_path / "short", short, kernel_dir, context=context, **options)
    s = plan.policy.shard_threshold
    assert s == held.policy.shard_threshold and not plan.policy.shard_major_copy
    assert "shard_major_down" not in _host(plan).components
    force_pinning(monkeypatch)  # as on GPUs: host rows pinned (the copy would be made if the plan held it)
    engine = load_engine(tmp_path / "short" / "plan.yaml", device="cpu")
    ex = engine.executor
    assert ex.sharded is not None and ex.sharded.down is None
    n = max(s, *plan.policy.prefill_buckets, plan.policy.prefill_threshold) + 1
    ids = torch.randint(0, engine.model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    session = engine.new_session()
    assert session.prefill_mode(n) == "sharded"
    copies = []
    real = ex.sharded._copy_group
    monkeypatch.setattr(ex.sharded, "_copy_group", lambda g, slices, pool, timer: copies.extend(slices)
                        or real(g, slices, pool, timer))
    sharded = session.prefill(ids)
    assert ex.mode == "sharded" and copies and not any(src.w2.is_contiguous() for src in copies)  # strided w2
    ex.sharded.threshold, uploaded = None, ex.counters.experts_uploaded  # the same prompt over one link
    single = engine.new_session().prefill(ids)
    assert ex.mode == "upload" and ex.counters.experts_uploaded > uploaded
    _close(sharded, single)
    ex.sharded.threshold = s
    session = _filled_session(engine, context)
    _check(engine, session)  # held = plan, without the copy
    assert "shard_major_down" not in held_memory(engine, [session]).rows["host"]
    engine.close()


def test_the_simulator_shards_past_the_plans_threshold_as_the_cost_model_prices_it():
    """bench/simulator's Ostinato runs a prefill past policy.shard_threshold sharded (sharded_pass: the cost
    model's sharded_layer over the trace's own counts), one above the prefill threshold and below it over one
    link; the shard threshold None never shards."""
    from ostinato.bench.simulator.ostinato_policy import Ostinato

    c = v4_cost(load_hardware("rtx4090d-x4"))
    L, E = c.cfg.n_layers, c.cfg.n_routed_experts
    hot = np.stack([l.hot for l in c.layers])
    rng = np.random.default_rng(0)
    counts = np.stack([np.bincount(rng.integers(0, E, 6 * 600), minlength=E) for _ in range(L)])  # [L, E]
    plan = Ostinato(c, hot, threshold=100, shard_threshold=500)
    sharded, upload = plan.prefill(counts, 600), plan.prefill(counts, 400)
    assert (sharded.mode, upload.mode) == ("sharded", "upload")
    per = []
    for l in range(L):
        touched = counts[l] > 0
        per.append(c.sharded_layer(l, 600, (float((touched & hot[l]).sum()), float(counts[l][hot[l]].sum())),
                                   (float((touched & ~hot[l]).sum()), float(counts[l][~hot[l]].sum())), 0))
    assert sharded.seconds == pytest.approx(c.forward_time(c.pipelined(per), 600, False, True), rel=1e-12)
    assert sharded.uploaded == int(((counts > 0) & ~hot).sum())
    assert Ostinato(c, hot, threshold=100).prefill(counts, 600).mode == "upload"
