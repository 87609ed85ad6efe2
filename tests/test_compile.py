"""ostinato-compile: exact memory totals, determinism, committed plans, refusals, the plan contract."""

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from ostinato.checkpoint import ModelConfig, model_sizes
from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.checkpoint.tensor_specs import global_specs, layer_specs, mtp_block_specs
from ostinato.compiler.cli import compile as compile_cli
from ostinato.compiler.compile import CompileError, CompileOptions, compile_plan
from ostinato.compiler.explain import explain
from ostinato.compiler.memory_model import held_bytes, kv_cache_bytes, speculative_steps_bytes
from ostinato.compiler.profile import RoutingProfile, synthetic_profile
from ostinato.plan import (
    KernelName,
    PlanError,
    check_fingerprint,
    load_plan,
    plan_from_dict,
)
from ostinato.plans import plans_dir

REPO = Path(__file__).resolve().parents[1]
FLASH = Path("plans/models/deepseek-v4-flash")
FLASH_PLAN = "plans/deepseek-v4-flash.rtx4090d-x4.yaml"


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _flash_options(**kw):
    base = dict(model=FLASH, output=Path("unused.yaml"), hardware="rtx4090d-x4", profile="synthetic:0.9")
    base.update(kw)
    return CompileOptions(**base)


def test_committed_flash_plan_regenerates_byte_identically(tmp_path, monkeypatch):
    # the same inputs at the same relative places, compiled from elsewhere: the same bytes
    shutil.copytree(REPO / FLASH, tmp_path / FLASH)
    monkeypatch.chdir(tmp_path / "plans")
    assert compile_cli.main(["models/deepseek-v4-flash", Path(FLASH_PLAN).name, "--hardware", "rtx4090d-x4",
                             "--profile", "synthetic:0.9"]) == 0
    assert (tmp_path / FLASH_PLAN).read_bytes() == (REPO / FLASH_PLAN).read_bytes(), \
        f"{FLASH_PLAN} is stale: regenerate it with ostinato-compile (see docs/commands.md)"


@pytest.mark.parametrize("speculative", ["mtp", "off"])
def test_flash_memory_adds_up_to_the_checkpoint_bytes(in_repo, speculative):
    plan = compile_plan(_flash_options(speculative=speculative)).plan
    assert plan.policy.speculative == speculative and (plan.mtp is not None) == (speculative == "mtp")
    sizes = model_sizes(ModelConfig.from_json(FLASH / "config.json"))
    for dev in plan.memory:
        assert sum(dev.components.values()) == dev.total_bytes <= dev.usable_bytes
        assert dev.free_bytes == dev.usable_bytes - dev.total_bytes
    gpus = [d for d in plan.memory if d.device != "host"]
    host = next(d for d in plan.memory if d.device == "host")
    weights = (sum(d.components["dense_weights"] + d.components["hot_experts"] + d.components.get("head", 0)
                   + d.components.get("embedding", 0) for d in gpus) + host.components["cold_experts"])
    cfg = ModelConfig.from_json(FLASH / "config.json")
    fmt = plan.model.dense_format
    assert fmt == "fp8"  # the default with GPUs: FP8 matrices as stored
    held = sum(held_bytes(s, fmt) for s in global_specs(cfg)) + sum(
        held_bytes(s, fmt) for l in range(cfg.n_layers) for s in layer_specs(cfg, l, with_experts=True))
    mtp = mtp_block_specs(cfg, 0, with_experts=True) if plan.mtp else []  # the MTP block: counted only when placed
    held += sum(held_bytes(s, fmt) for s in mtp)
    assert weights == held  # every tensor of the model is placed exactly once, as the runtime holds it
    dense = list(global_specs(cfg)) + [s for l in range(cfg.n_layers) for s in layer_specs(cfg, l, with_experts=False)]
    dense += [s for s in mtp if s.role != "routed_expert"]
    grown = sum(held_bytes(s, fmt) - s.nbytes for s in dense)  # bf16 norms and router held in float32
    total = sizes.total_bytes + (sum(s.nbytes for s in mtp) if mtp else 0)
    assert held - total == grown and 0 < grown < 0.05 * total
    hot = sum(len(l.hot_experts) for l in plan.layers) + (len(plan.mtp.hot_experts) if plan.mtp else 0)
    assert sum(d.components["hot_experts"] for d in gpus) == hot * 13_369_344
    assert host.components["cold_experts"] == ((43 + bool(plan.mtp)) * 256 - hot) * 13_369_344


def test_the_mtp_block_is_placed_beside_the_head_from_its_profile_row(in_repo):
    on, off = (compile_plan(_flash_options(speculative=s)) for s in ("mtp", "off"))
    cfg, mtp = on.config, on.plan.mtp
    assert off.plan.mtp is None and off.plan.policy.speculative == "off"
    assert mtp.layer == 43 and mtp.gpu == on.plan.layers[-1].gpu == 3 and mtp.attention == "sliding"
    # its hot experts are its synthetic row's most routed ones, and as many as a layer of its GPU gets
    routes = on.profile.mtp_counts(on.options.objective_phases)
    hot = np.zeros(256, dtype=bool)
    hot[mtp.hot_experts] = True
    assert routes is not None and routes.numpy()[hot].min() >= routes.numpy()[~hot].max()
    assert 0.5 < mtp.hot_route_share < 1 and 0 < len(mtp.hot_experts) < 256
    # its dense part, its cache and the speculative steps' buffers, in the last GPU's row beside its layers';
    # nothing when left out
    assert off.mtp_bytes == {} and on.mtp_bytes == {
        "dense_weights": sum(held_bytes(s, "fp8") for s in mtp_block_specs(cfg, 0, with_experts=False)),
        "kv_cache": kv_cache_bytes(cfg, 43, 65536, "fp8"),
        "speculative_steps": speculative_steps_bytes(cfg, on.policy)}
    row = on.plan.memory[3].components
    assert row["speculative_steps"] == on.mtp_bytes["speculative_steps"] and "speculative_steps" not in \
        off.plan.memory[3].components
    for kind in ("dense_weights", "kv_cache"):
        layers = sum(on.layer_bytes[l.layer][kind] for l in on.plan.layers if l.gpu == 3)
        assert row[kind] == layers + on.mtp_bytes[kind]
    assert row["hot_experts"] == (sum(len(l.hot_experts) for l in on.plan.layers if l.gpu == 3)
                                  + len(mtp.hot_experts)) * on.cost.expert_bytes
    # the cost model prices the draft with the block's experts as placed: all cold costs more
    on.cost.mtp = dataclasses.replace(on.cost.mtp, hot=np.zeros(256, dtype=bool))
    assert on.cost.mtp_draft() > compile_plan(_flash_options(speculative="mtp")).cost.mtp_draft()


def test_speculative_auto_keeps_the_block_only_where_it_pays(in_repo, monkeypatch):
    auto = compile_plan(_flash_options())
    assert auto.plan.predictions.speculative.pays and auto.plan.policy.speculative == "mtp" and auto.plan.mtp
    assert "the plan places the MTP block on gpu3" in auto.plan.predictions.speculative.reason
    monkeypatch.setattr("ostinato.compiler.passes.speculation.MTP_ACCEPTANCE", 0.0)  # a draft never kept never pays
    never = compile_plan(_flash_options())
    s = never.plan.predictions.speculative
    assert not s.pays and never.plan.policy.speculative == "off" and never.plan.mtp is None
    assert "the plan leaves the MTP block out" in s.reason and "--speculative mtp forces it" in s.reason
    forced = compile_plan(_flash_options(speculative="mtp"))
    assert forced.plan.policy.speculative == "mtp"
    assert "--speculative mtp:" in forced.plan.predictions.speculative.reason
    # left out, its memory goes back to the layers: the plan is the one --speculative off gives
    assert never.plan.memory == compile_plan(_flash_options(speculative="off")).plan.memory


def test_speculation_is_priced_at_the_profiles_measured_acceptance(in_repo, tmp_path):
    from ostinato.compiler.compile import MIN_MEASURED_DRAFTS
    from ostinato.compiler.cost_model import MTP_ACCEPTANCE

    synth = synthetic_profile(ModelConfig.from_json(FLASH / "config.json"), alpha=0.9)

    def measured(drafts, agreed):
        path = tmp_path / f"m{drafts}-{agreed}.safetensors"
        dataclasses.replace(synth, mtp_drafts=drafts, mtp_agreed=agreed).save(path)
        return compile_plan(_flash_options(profile=str(path)))

    # none measured (synthetic): the published figure, and speculation pays on this preset
    published = compile_plan(_flash_options()).plan
    s = published.predictions.speculative
    assert s.acceptance == MTP_ACCEPTANCE == 0.9 and s.pays and published.policy.speculative == "mtp"
    assert "at 90% acceptance (the published figure; the profile measured none)" in s.reason
    # a block whose drafts are rarely kept: measured on enough drafts, it is what the plan prices, and auto
    # leaves the block out (the plan --speculative off gives)
    rare = measured(1000, 6)
    s = rare.plan.predictions.speculative
    assert s.acceptance == 0.006 and not s.pays and rare.plan.policy.speculative == "off" and rare.plan.mtp is None
    assert "at 0.6% acceptance (measured on the profile's 1000 drafts)" in s.reason
    assert "the plan leaves the MTP block out" in s.reason
    assert any("measured on the routing profile: 0.6% (6 of 1000 depth-1 greedy drafts kept), not the published "
               "90%" in n for n in rare.plan.notes)
    assert rare.plan.memory == compile_plan(_flash_options(speculative="off")).plan.memory
    # as good as published: the same decision and gain as the published figure gives
    same = measured(1000, 900).plan.predictions.speculative
    assert same.acceptance == 0.9 and same.pays and same.gain == published.predictions.speculative.gain
    # too few drafts to trust (MIN_MEASURED_DRAFTS): the published figure, and the note says why
    few = measured(MIN_MEASURED_DRAFTS - 1, 0)
    s = few.plan.predictions.speculative
    assert s.acceptance == 0.9 and s.pays and f"measured drafts are fewer than {MIN_MEASURED_DRAFTS}" in s.reason
    assert any(f"only {MIN_MEASURED_DRAFTS - 1} drafts" in n for n in few.plan.notes)


def test_a_profile_without_the_mtp_row_gives_it_no_hot_experts_and_says_so(tiny_ckpt, tmp_path):
    profile = synthetic_profile(ModelConfig.from_json(tiny_ckpt), alpha=1.0)
    assert profile.mtp_layers == 1
    without = RoutingProfile(counts=profile.counts[:-1].clone(), top_k=profile.top_k, phase_boundary=0, source="old")
    without.save(tmp_path / "old.safetensors")
    opts = dict(model=tiny_ckpt, output=tmp_path / "p.yaml", hardware="cpu-only", build_kernels=False,
                context=1024, speculative="mtp")
    b = compile_plan(CompileOptions(profile=str(tmp_path / "old.safetensors"), **opts))
    assert b.plan.mtp.hot_experts == [] and b.plan.mtp.hot_route_share == 0.0
    assert any("record a profile with ostinato-record to place the MTP block's experts" in n for n in b.plan.notes)
    synth = compile_plan(CompileOptions(profile="synthetic:1.0", **opts)).plan
    assert synth.mtp.hot_experts and synth.mtp.hot_route_share > 0
    assert not any("MTP block's experts" in n for n in synth.notes)


def test_speculative_mtp_without_the_block_names_the_flag(tmp_path):
    from ostinato.tiny import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path / "nomtp", "tiny", seed=0, progress=False, mtp=False)
    opts = dict(model=ckpt, output=tmp_path / "p.yaml", hardware="cpu-only", build_kernels=False, context=1024)
    with pytest.raises(CompileError, match=r"--speculative mtp: .* has no MTP block .*--speculative auto or off"):
        compile_plan(CompileOptions(speculative="mtp", **opts))
    plan = compile_plan(CompileOptions(**opts)).plan
    assert plan.mtp is None and plan.policy.speculative == "off" and not plan.predictions.speculative.pays


def test_kv_cache_matches_the_model_card():
    cfg = ModelConfig.from_json(REPO / FLASH / "config.json")
    # docs/model.md 4: 6,880 B/token over the model, plus a constant 128 KiB sliding ring per layer + compressor state
    per_token = sum(kv_cache_bytes(cfg, l, 2 * 128 * 1024, "bf16") - kv_cache_bytes(cfg, l, 128 * 1024, "bf16")
                    for l in range(43))
    assert per_token == 6_880 * 128 * 1024
    ring = 127 * 512 * 2  # W-1 rows of head_dim in bf16 (the current token is the W-th)
    assert kv_cache_bytes(cfg, 0, 10**6, "bf16") == ring                                # sliding only
    assert kv_cache_bytes(cfg, 3, 0, "bf16") == ring + 127 * 512 * 2 * 4                # HCA: < m buffered kv + gate
    assert kv_cache_bytes(cfg, 2, 0, "bf16") == ring + (3 * 1024 * 2 + 4 * 512 * 2) * 4 + (  # CSA: overlapped
        3 * 256 * 2 + 4 * 128 * 2) * 4                                                  # + the indexer's compressor


def test_flash_plan_content(in_repo):
    plan = load_plan(FLASH_PLAN)
    assert plan.model.layers == 43 and len(plan.layers) == 43
    assert ([l.gpu for l in plan.layers] == sorted(l.gpu for l in plan.layers)
            and {l.gpu for l in plan.layers} == {0, 1, 2, 3})
    assert any("SYNTHETIC" in n for n in plan.notes) and plan.provenance.profile_source.startswith("synthetic zipf")
    assert plan.provenance.index_sha256 is None  # config.json alone: said in the plan
    assert 0.5 < plan.predictions.hot_route_share < 1.0
    # speculation pays on this preset: the MTP block is placed beside the head, and --explain says where
    assert plan.policy.speculative == "mtp" and plan.predictions.speculative.pays
    assert plan.mtp.layer == 43 and plan.mtp.gpu == plan.layers[-1].gpu and plan.mtp.hot_experts
    assert (f"on gpu{plan.mtp.gpu} beside the head (sliding): {len(plan.mtp.hot_experts)} hot experts, "
            f"{plan.mtp.hot_route_share:.1%} of its routes") in explain(plan)
    t, buckets = plan.policy.prefill_threshold, plan.policy.prefill_buckets
    s = plan.policy.shard_threshold  # four GPUs: the longer uploads are sharded (tests/test_shard_plan.py)
    assert (buckets and buckets == [2 ** i for i in range(1, len(buckets) + 1)]
            and 3 * buckets[-1] <= plan.policy.context)
    assert t is not None and s is not None and s >= t
    for row in plan.predictions.prefill:
        bucketed = row.tokens <= buckets[-1]
        eager = "sharded" if row.tokens > s else "upload" if row.tokens > t else "split"
        assert row.mode == ("bucket" if bucketed else eager)
        assert (row.bucket_ms is not None) == bucketed and (not bucketed or row.bucket_ms < row.split_ms)
        assert (row.split_ms <= min(row.upload_ms, row.sharded_ms)) == (row.tokens <= t)


def test_compile_is_deterministic(in_repo):
    a = compile_plan(_flash_options(context=8192)).plan.dumps()
    b = compile_plan(_flash_options(context=8192)).plan.dumps()
    assert a == b


def test_plan_round_trips_through_yaml(in_repo):
    plan = compile_plan(_flash_options()).plan
    again = plan_from_dict(yaml.safe_load(plan.dumps()))
    assert again.dumps() == plan.dumps()


def test_uniform_profile_is_said(tiny_ckpt, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert compile_cli.main([str(tiny_ckpt), str(out), "--hardware", "cpu-only", "--no-kernels"]) == 0
    assert "UNIFORM routing" in capsys.readouterr().out
    plan = load_plan(out)
    assert plan.provenance.profile_source == "uniform" and any("UNIFORM" in n for n in plan.notes)
    assert "# note: no routing profile given" in out.read_text()


def test_does_not_fit_names_device_and_bytes(in_repo):
    with pytest.raises(CompileError, match=r"gpu\d \(RTX 4090D.*\) is short by [\d,]+ bytes.*shorter --context"):
        compile_plan(_flash_options(context=1_048_576, sessions=8))  # within the model's positions, 8x its KV


def test_no_hot_expert_fits(tiny_ckpt, tmp_path):
    roomy = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "a.yaml", "cpu-only", build_kernels=False)).plan
    gpu = roomy.memory[0]
    base = gpu.total_bytes - gpu.components["hot_experts"] - gpu.components["headroom"]
    spec = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    spec["gpus"]["usable_bytes"] = int((base + roomy.model.expert_bytes // 2) / 0.95)  # half an expert free
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(CompileError, match="no hot expert fits: every GPU is short by at least [\\d,]+ bytes"):
        compile_plan(CompileOptions(tiny_ckpt, tmp_path / "b.yaml", str(tmp_path / "small.yaml"), build_kernels=False))


def test_auto_speculation_without_room_for_the_mtp_block_plans_without_it(tiny_ckpt, tmp_path):
    roomy = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "a.yaml", "cpu-only", build_kernels=False,
                                        speculative="off")).plan
    gpu = roomy.memory[0]
    base = gpu.total_bytes - gpu.components["hot_experts"] - gpu.components["headroom"]
    spec = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    spec["gpus"]["usable_bytes"] = int((base + 3 * roomy.model.expert_bytes) / 0.95)  # 3 experts, not the block
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(spec))
    forced = CompileOptions(tiny_ckpt, tmp_path / "b.yaml", str(tmp_path / "small.yaml"), build_kernels=False,
                            speculative="mtp")
    with pytest.raises(CompileError, match="does not fit"):  # forced: the block or nothing
        compile_plan(forced)
    b = compile_plan(forced.__class__(**{**vars(forced), "speculative": "auto"}))
    assert b.plan.mtp is None and b.plan.policy.speculative == "off"
    assert sum(len(lp.hot_experts) for lp in b.plan.layers) == 3
    assert "no room for the MTP block beside the head" in b.plan.predictions.speculative.reason
    assert any("no room for the MTP block" in n for n in b.notes)


def test_plan_for_another_checkpoint_is_refused(tiny_ckpt, small_ckpt, tmp_path):
    out = tmp_path / "p.yaml"
    assert compile_cli.main([str(tiny_ckpt), str(out), "--hardware", "cpu-only", "--no-kernels"]) == 0
    plan = load_plan(out)
    fp = model_fingerprint(tiny_ckpt)
    check_fingerprint(plan, fp.config_sha256, fp.index_sha256)  # its own checkpoint: fine
    other = model_fingerprint(small_ckpt)
    with pytest.raises(PlanError, match="field 'provenance.config_sha256'"):
        check_fingerprint(plan, other.config_sha256, other.index_sha256)


def test_profile_for_another_model_is_refused(tiny_ckpt, tmp_path, capsys):
    from ostinato.compiler.profile import synthetic_profile

    other = synthetic_profile(ModelConfig.from_json(REPO / FLASH / "config.json"))
    other.save(tmp_path / "flash.safetensors")
    rc = compile_cli.main([str(tiny_ckpt), str(tmp_path / "p.yaml"), "--hardware", "cpu-only",
                           "--profile", str(tmp_path / "flash.safetensors"), "--no-kernels"])
    assert rc == 1
    assert "field 'n_layers' is 43 but the model has 4" in capsys.readouterr().err


def test_malformed_plan_names_the_field(in_repo, tmp_path):
    d = yaml.safe_load((REPO / FLASH_PLAN).read_text())
    del d["policy"]["prefill_threshold"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(PlanError, match="field 'policy.prefill_threshold' is missing"):
        load_plan(tmp_path / "bad.yaml")


@pytest.mark.slow  # builds kernels (C++) into its own folder
def test_kernels_are_built_and_recorded(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plans").mkdir()
    plan = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "plans/p.yaml", "cpu-only")).plan
    assert [k.name for k in plan.kernels] == list(KernelName)
    for k in plan.kernels:  # relative to the plan file's folder
        assert not os.path.isabs(k.path) and plan.resolve(k.path).exists()
        assert k.path.startswith(f"../build/kernels/{k.content_sha256[:20]}/")
        assert plan.provenance.templates[k.template] == k.template_sha256
    from ostinato.compiler.codegen.render import included_headers  # headers are recorded as templates are
    assert (included_headers(plan.kernel(KernelName.COLD_EXPERTS_CPU).template).items()
            <= plan.provenance.templates.items())
    assert plan.kernel(KernelName.COLD_EXPERTS_CPU).params["isa"] == "avx2"
    assert plan.kernel(KernelName.HOT_EXPERTS_DECODE).params["max_routes"] == 4


def test_a_kernel_that_fails_to_compile_fails_the_compile(tiny_ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    broken = tmp_path / "broken-cxx"
    broken.write_text("#!/bin/sh\necho 'moe_experts.cpp:1:1: error: the compiler says no' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    assert compile_cli.main([str(tiny_ckpt), str(tmp_path / "p.yaml"), "--hardware", "cpu-only"]) == 1
    err = capsys.readouterr().err
    assert "the compiler says no" in err and not (tmp_path / "p.yaml").exists()


@pytest.mark.slow  # builds kernels (C++) into its own folder
def test_committed_tiny_plan_regenerates_byte_identically(tmp_path, monkeypatch):
    from ostinato.tiny import write_tiny_checkpoint

    # a copy of the repository's layout: the plan names its model and kernels relative to itself
    monkeypatch.chdir(tmp_path)
    write_tiny_checkpoint(Path("build/demo/tiny"), "tiny", seed=0, popularity=1.0, progress=False)
    out = tmp_path / "plans/tiny.cpu-only.yaml"
    assert compile_cli.main(["build/demo/tiny", str(out), "--hardware", "cpu-only", "--profile",
                             str(REPO / "plans/profiles/tiny-planted.safetensors"), "--max-hot-per-layer", "4",
                             "--sessions", "4"]) == 0
    assert out.read_bytes() == (REPO / "plans/tiny.cpu-only.yaml").read_bytes(), \
        "plans/tiny.cpu-only.yaml is stale: regenerate it (plans/profiles/README.md)"


def _cpu_only_host(tmp_path, total_bytes: int) -> str:
    """The cpu-only preset as ostinato-calibrate writes it for a host of `total_bytes` (its memory, not its rates)."""
    from ostinato.compiler.cli.calibrate import with_host_memory
    from ostinato.hardware import load_hardware
    from ostinato.yaml_files import dump_yaml

    spec = with_host_memory(load_hardware("cpu-only"), total_bytes)
    path = tmp_path / f"host-{total_bytes}.yaml"
    path.write_text(dump_yaml(spec.model_dump(mode="json", exclude_none=True)))
    return str(path)


def test_flash_compiles_for_a_cpu_only_host_with_the_memory_and_names_the_bytes_short(in_repo, tmp_path):
    """A CPU-only V4-Flash plan holds every byte in host memory: the device's part (dense weights, KV, buffers, hot
    experts) and the host's (cold experts, workspace) are counted together against the host's usable bytes."""
    gib = 2**30
    large = compile_plan(_flash_options(hardware=_cpu_only_host(tmp_path, 1024 * gib), speculative="off")).plan
    device, host = large.memory
    assert device.device == "gpu0" and host.device == "host"
    held = device.total_bytes - device.components["headroom"] + host.total_bytes  # independent of the host's size
    assert held == sum(device.components.values()) - device.components["headroom"] + sum(host.components.values())
    text = explain(large)
    assert "the CPU as its device, in host memory" in text and "\ncpu     0-42 " in text and "gpu0" not in text
    assert (f"one memory on a cpu-only plan: the device {device.total_bytes / gib:.3f}G + the host "
            f"{host.total_bytes / gib:.3f}G") in text

    def usable(total: int) -> int:
        return int(total * 7 / 8) // 2**20 * 2**20

    enough = next(n * gib for n in range(1, 1025) if held + int(usable(n * gib) * 0.05) <= usable(n * gib))
    fits = compile_plan(_flash_options(hardware=_cpu_only_host(tmp_path, enough), speculative="off")).plan
    assert sum(d.total_bytes for d in fits.memory) <= fits.memory[-1].usable_bytes == usable(enough)
    small = enough - gib
    short = held + int(usable(small) * 0.05) - usable(small)
    said = rf"host memory \({usable(small):,d} usable bytes\) is short by {short:,d} bytes: on a cpu-only spec it"
    with pytest.raises(CompileError, match=rf"does not fit: {said} holds the device's"):
        compile_plan(_flash_options(hardware=_cpu_only_host(tmp_path, small), speculative="off"))
    # the preset's 4 GiB device: the message says what to use instead
    with pytest.raises(CompileError, match=r"does not fit: cpu \(the CPU as a device: 4,294,967,296 bytes of host "
                                           r"memory.*ostinato-calibrate cpu-only"):
        compile_plan(_flash_options(hardware="cpu-only"))


def test_plans_reserve_an_agents_context_and_say_what_it_costs(tmp_path):
    """The committed plans reserve 262,144 tokens (the default); V4-Flash's whole 1,048,576 compiles on
    rtx4090d-x4, and --explain states what the context takes: its bytes and the hot experts they would hold."""
    for plan_file in (FLASH_PLAN, "plans/tiny.cpu-only.yaml"):
        assert load_plan(REPO / plan_file).policy.context >= 262_144
    costs = {}
    for context in (262_144, 1_048_576):
        plan = compile_plan(CompileOptions(REPO / FLASH, tmp_path / f"{context}.yaml", "rtx4090d-x4",
                                           profile="synthetic:0.9", context=context, build_kernels=False)).plan
        line = next(l for l in explain(plan).splitlines() if l.startswith("context:"))
        assert f"context: {context:,d} tokens x 1 session(s)" in line
        costs[context] = (int(line.split("the room of ")[1].split(" hot experts")[0].replace(",", "")),
                          sum(len(l.hot_experts) for l in plan.layers))
    (room_262k, hot_262k), (room_1m, hot_1m) = costs[262_144], costs[1_048_576]
    assert room_1m > room_262k > 0 and hot_1m < hot_262k  # the longer context holds fewer hot experts
