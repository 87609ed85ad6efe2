"""DeepSeek-V4-Flash-0731 (the current release): its `mtp.*` is a DSpark drafter, not an MTP block.

The reader recognises the drafter from the config's dspark_* keys and checks its tensors as one set (all or
none, each tensor's dtype and shape); the plan does not load it and says so; MTP speculation is refused with
the reason; plain decoding is V4's forward on the release's weights (checked against transformers); and
the weights' identity tells the two releases apart.
"""

import json
import shutil

import pytest
import torch

from ostinato.checkpoint import CheckpointError, ModelConfig
from ostinato.checkpoint.reader import Checkpoint
from ostinato.checkpoint.tensor_specs import dspark_stage_specs
from ostinato.checkpoint.weight_fingerprint import weight_fingerprint
from ostinato.cli import inspect as inspect_cli
from ostinato.compiler.compile import CompileError, CompileOptions, compile_plan
from ostinato.plan import PlanError, check_weights
from ostinato.tiny import write_tiny_checkpoint
from ostinato.tiny.presets import official_flash_config, preset_config, with_dspark


@pytest.fixture(scope="module")
def release_0731(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-0731", "tiny", seed=0, progress=False,
                                 release="0731")


def _index(path):
    return json.loads((path / "model.safetensors.index.json").read_text())


def test_v4_flash_0731s_drafter_has_the_published_stages():
    """From the release's config alone: three stages of 1568 / 1565 / 1572 tensors (shared/PUBLISHED.md), and
    num_nextn_predict_layers 1 no longer means an MTP block."""
    cfg = ModelConfig.from_dict(with_dspark(official_flash_config()))
    assert cfg.num_nextn_predict_layers == 1 and cfg.mtp_blocks == 0 and cfg.has_dspark
    assert [len(dspark_stage_specs(cfg, s)) for s in range(cfg.dspark_stages)] == [1568, 1565, 1572]
    proj = {s.name: s for s in dspark_stage_specs(cfg, 0)}["mtp.0.main_proj.weight"]
    assert proj.shape == (4096, 12288) and proj.dtype == "F8_E4M3"
    last = {s.name: s for s in dspark_stage_specs(cfg, 2)}
    assert last["mtp.2.markov_head.markov_w2.weight"].shape == (129280, 256)
    assert last["mtp.2.confidence_head.proj.weight"].shape == (1, 4352)


def test_the_reader_recognises_the_drafter_and_never_calls_it_an_mtp_block(release_0731):
    with Checkpoint.open(release_0731) as ckpt:
        assert ckpt.has_dspark and not ckpt.has_mtp and ckpt.mtp_specs == {}
        assert set(ckpt.dspark_specs) == {n for n in ckpt.weight_map if n.startswith("mtp.")}
        assert list(ckpt.expert_layers) == list(range(ckpt.config.num_hidden_layers))
        assert ckpt.raw("mtp.2.markov_head.markov_w1.weight").dtype == torch.bfloat16


@pytest.mark.parametrize("damage, message", [
    ("drop", "the DSpark drafter is incomplete: 1 of its 385 tensors are missing"),
    ("dtype", "dtype F32 is wrong; expected BF16"),
    ("no-keys", "holds a DSpark drafter .* but config.json has no dspark_\\* keys"),
])
def test_a_damaged_drafter_is_refused_naming_the_tensor(release_0731, tmp_path, damage, message):
    from safetensors.torch import save_file

    copy = shutil.copytree(release_0731, tmp_path / "copy")
    index = _index(copy)
    name = "mtp.2.markov_head.markov_w1.weight"
    if damage == "drop":
        del index["weight_map"][name]
    elif damage == "dtype":
        save_file({name: torch.zeros(1024, 32)}, copy / "extra.safetensors", metadata={"format": "pt"})
        index["weight_map"][name] = "extra.safetensors"
    else:
        cfg = json.loads((copy / "config.json").read_text())
        for key in ("dspark_block_size", "dspark_target_layer_ids", "dspark_markov_rank", "dspark_noise_token_id"):
            del cfg[key]
        (copy / "config.json").write_text(json.dumps(cfg))
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=message) as e:
        Checkpoint.open(copy)
    assert ("mtp.0.main_proj.weight" if damage == "no-keys" else name) in str(e.value)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.pop("dspark_markov_rank"), "dspark_markov_rank"),
    (lambda c: c.update(dspark_target_layer_ids=[1, 9]), "dspark_target_layer_ids"),
    (lambda c: c.update(dspark_noise_token_id=5000), "dspark_noise_token_id"),
    (lambda c: c.update(dspark_block_size=0), "dspark_block_size"),
])
def test_drafter_config_errors_name_the_key(edit, field):
    cfg = preset_config("tiny", release="0731")
    edit(cfg)
    with pytest.raises(CheckpointError) as e:
        ModelConfig.from_dict(cfg, source="x/config.json")
    assert e.value.field == field


def test_the_weights_tell_the_releases_apart(release_0731, tmp_path):
    original = write_tiny_checkpoint(tmp_path / "original", "tiny", seed=0, progress=False, mtp=False)
    with Checkpoint.open(original) as a, Checkpoint.open(release_0731) as b:
        assert set(a.specs) == set(b.specs)  # the same model ...
        assert not torch.equal(a.raw("layers.1.attn.wq_a.weight").view(torch.uint8),
                               b.raw("layers.1.attn.wq_a.weight").view(torch.uint8))  # ... retrained
    plan = compile_plan(CompileOptions(original, tmp_path / "p.yaml", "cpu-only", build_kernels=False,
                                       context=1024)).plan
    with pytest.raises(PlanError, match="shard"):
        check_weights(plan, weight_fingerprint(release_0731).shards)


def test_the_plan_leaves_the_drafter_out_and_says_so(release_0731, tmp_path, capsys):
    opts = dict(model=release_0731, output=tmp_path / "p.yaml", hardware="cpu-only", build_kernels=False, context=1024)
    with pytest.raises(CompileError, match="0731 release, whose mtp.\\* tensors are a DSpark drafter"):
        compile_plan(CompileOptions(speculative="mtp", **opts))
    plan = compile_plan(CompileOptions(**opts)).plan
    assert plan.mtp is None and plan.policy.speculative == "off"
    assert any("DSpark drafter" in n and "does not load it" in n for n in plan.notes)
    assert inspect_cli.main([str(release_0731)]) == 0
    out = capsys.readouterr().out
    assert "DSpark drafter (the 0731 release: mtp.0-mtp.2" in out and "385 tensors" in out and "not loaded" in out


@pytest.mark.slow  # transformers' model (seconds to load)
def test_plain_decoding_of_0731_is_v4s_forward_on_its_weights(release_0731):
    from hf_reference import load_reference

    from ostinato.runtime import load_model

    ids = torch.randint(0, 1024, (1, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = load_reference(str(release_0731))(ids).logits[0]
    got = load_model(release_0731).new_session().prefill(ids[0])
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_the_plan_records_the_releases_chat_encoding(release_0731, tmp_path):
    opts = dict(output=tmp_path / "p.yaml", hardware="cpu-only", build_kernels=False, context=1024)
    plan = compile_plan(CompileOptions(release_0731, **opts)).plan
    assert plan.policy.chat_encoding == "dsv4-0731" and any("chat encoding dsv4-0731" in n for n in plan.notes)
    assert compile_plan(CompileOptions(release_0731, chat_encoding="dsv4", **opts)).plan.policy.chat_encoding == "dsv4"
    with pytest.raises(CompileError, match="--chat-encoding is 'v5': one of auto, dsv4, dsv4-0731"):
        compile_plan(CompileOptions(release_0731, chat_encoding="v5", **opts))


@pytest.mark.slow  # two engines
def test_0731_runs_as_the_same_weights_without_the_drafter(release_0731, tmp_path, kernel_dir):
    """Planned and run, the 0731 checkpoint decodes the greedy tokens of the same weights with its drafter
    stripped (its mtp.* out of the index, its dspark_* keys out of the config): the drafter changes nothing."""
    from engine_helpers import IDS

    from ostinato.runtime.engine.loader import load_engine

    stripped = shutil.copytree(release_0731, tmp_path / "stripped")
    index = _index(stripped)
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if not n.startswith("mtp.")}
    (stripped / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = json.loads((stripped / "config.json").read_text())
    for key in ("dspark_block_size", "dspark_target_layer_ids", "dspark_markov_rank", "dspark_noise_token_id"):
        del cfg[key]
    cfg["num_nextn_predict_layers"] = 0
    (stripped / "config.json").write_text(json.dumps(cfg))
    tokens = []
    for ckpt in (release_0731, stripped):
        work = tmp_path / f"plan-{ckpt.name}"
        work.mkdir()
        plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", "cpu-only", kernel_dir=kernel_dir, context=1024,
                                           max_hot_per_layer=6)).plan
        plan.write(work / "plan.yaml")
        engine = load_engine(work / "plan.yaml", ckpt, device="cpu")
        session, out = engine.new_session(), []
        token = int(session.prefill(IDS[:40], last_only=True)[-1].argmax())
        for _ in range(12):
            out.append(token)
            token = int(session.decode(token).argmax())
        tokens.append(out)
        engine.close()
    assert tokens[0] == tokens[1]
