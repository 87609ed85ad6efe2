"""ostinato-compile: exact memory totals, determinism, committed plans, refusals, the plan contract."""

import os
import shutil
from pathlib import Path

import pytest
import yaml

from ostinato.checkpoint import ModelConfig, model_sizes
from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.checkpoint.tensor_specs import global_specs, layer_specs
from ostinato.compiler.cli import compile as compile_cli
from ostinato.compiler.compile import CompileError, CompileOptions, compile_plan
from ostinato.compiler.memory_model import held_bytes, kv_cache_bytes
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


def test_flash_memory_adds_up_to_the_checkpoint_bytes(in_repo):
    plan = compile_plan(_flash_options()).plan
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
    assert weights == held  # every tensor of the model is placed exactly once, as the runtime holds it
    dense = list(global_specs(cfg)) + [s for l in range(cfg.n_layers) for s in layer_specs(cfg, l, with_experts=False)]
    grown = sum(held_bytes(s, fmt) - s.nbytes for s in dense)  # bf16 norms, compressors, router held in float32
    assert held - sizes.total_bytes == grown and 0 < grown < 0.05 * sizes.total_bytes
    hot = sum(len(l.hot_experts) for l in plan.layers)
    assert sum(d.components["hot_experts"] for d in gpus) == hot * 13_369_344
    assert host.components["cold_experts"] == (43 * 256 - hot) * 13_369_344


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
    t, buckets = plan.policy.prefill_threshold, plan.policy.prefill_buckets
    assert (buckets and buckets == [2 ** i for i in range(1, len(buckets) + 1)]
            and 3 * buckets[-1] <= plan.policy.context)
    for row in plan.predictions.prefill:
        bucketed = row.tokens <= buckets[-1]
        assert row.mode == ("bucket" if bucketed else "upload" if t is not None and row.tokens > t else "split")
        assert (row.bucket_ms is not None) == bucketed and (not bucketed or row.bucket_ms < row.split_ms)
        assert (row.split_ms <= row.upload_ms) == (t is None or row.tokens <= t)


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
        compile_plan(_flash_options(context=40_000_000))


def test_no_hot_expert_fits(tiny_ckpt, tmp_path):
    roomy = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "a.yaml", "cpu-only", build_kernels=False)).plan
    gpu = roomy.memory[0]
    base = gpu.total_bytes - gpu.components["hot_experts"] - gpu.components["headroom"]
    spec = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    spec["gpus"]["usable_bytes"] = int((base + roomy.model.expert_bytes // 2) / 0.95)  # half an expert free
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(CompileError, match="no hot expert fits: every GPU is short by at least [\\d,]+ bytes"):
        compile_plan(CompileOptions(tiny_ckpt, tmp_path / "b.yaml", str(tmp_path / "small.yaml"), build_kernels=False))


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
                             str(REPO / "plans/profiles/tiny-planted.safetensors"), "--context", "8192",
                             "--max-hot-per-layer", "4"]) == 0
    assert out.read_bytes() == (REPO / "plans/tiny.cpu-only.yaml").read_bytes(), \
        "plans/tiny.cpu-only.yaml is stale: regenerate it (plans/profiles/README.md)"
