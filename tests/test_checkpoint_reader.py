"""The lazy reader: roles, packed experts, shard laziness, planning without weights, bad input."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ostinato.checkpoint import CheckpointError, ModelConfig
from ostinato.checkpoint.formats import dequantize_mxfp4
from ostinato.checkpoint.reader import Checkpoint


@pytest.fixture
def ckpt_copy(tiny_ckpt, tmp_path):
    """A private copy of the tiny checkpoint that a test may damage."""
    return shutil.copytree(tiny_ckpt, tmp_path / "copy")


def _index(path):
    return json.loads((path / "model.safetensors.index.json").read_text())


def _write_index(path, index):
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def test_roles_cover_every_tensor_of_a_layer(tiny_ckpt):
    with Checkpoint.open(tiny_ckpt) as ckpt:
        cfg = ckpt.config
        assert [cfg.attention_kind(l) for l in range(cfg.n_layers)] == ["sliding", "csa", "hca", "csa"]
        assert ckpt.names("hash_table") == ["layers.0.ffn.gate.tid2eid"]
        assert ckpt.names("indexer", layer=2) == []  # HCA has no indexer
        assert len(ckpt.names("indexer", layer=1)) == 7  # wq_b + scale, weights_proj, compressor x4
        assert len(ckpt.names("routed_expert", layer=3)) == 6 * cfg.n_routed_experts
        every = set(ckpt.names())
        by_role = set().union(*(ckpt.names(r) for r in {s.role for s in ckpt.specs.values()}))
        assert every == by_role == set(ckpt.specs)


def test_packed_expert_is_the_stored_bytes(tiny_ckpt):
    with Checkpoint.open(tiny_ckpt) as ckpt:
        cfg = ckpt.config
        e = ckpt.expert_packed(2, 5)
        D, I = cfg.hidden_size, cfg.moe_intermediate_size
        assert e.w1.shape == (I, D // 2) and e.w1.dtype == torch.int8
        assert e.w2.shape == (D, I // 2) and e.w2_scale.shape == (D, I // 32)
        assert e.nbytes == 3 * (I * D // 2 + I * D // 32)
        assert torch.equal(dequantize_mxfp4(e.w3, e.w3_scale), ckpt.dequantized("layers.2.ffn.experts.5.w3.weight"))


def test_reading_opens_only_the_shards_holding_the_requested_tensors(tiny_ckpt):
    with Checkpoint.open(tiny_ckpt) as ckpt:
        assert ckpt.opened_shards == []  # opening reads headers only
        ckpt.dequantized("layers.2.attn.wq_a.weight")
        assert ckpt.opened_shards == [ckpt.weight_map["layers.2.attn.wq_a.weight"]]
        ckpt.raw("layers.2.ffn.gate.bias")  # same shard: nothing new
        assert len(ckpt.opened_shards) == 1
        ckpt.raw("head.weight")
        assert ckpt.opened_shards == sorted({ckpt.weight_map["layers.2.attn.wq_a.weight"],
                                             ckpt.weight_map["head.weight"]})


def test_single_file_checkpoint(tiny_ckpt, tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(tiny_ckpt / "config.json", single)
    tensors = {}
    for f in sorted(tiny_ckpt.glob("*.safetensors")):
        tensors.update(load_file(f))
    save_file(tensors, single / "model.safetensors")
    with Checkpoint.open(single) as a, Checkpoint.open(tiny_ckpt) as b:
        for name in ("layers.1.attn.wq_b.weight", "layers.3.ffn.experts.7.w2.weight", "embed.weight"):
            assert torch.equal(a.dequantized(name), b.dequantized(name))


def test_planning_needs_only_config_and_index(tiny_ckpt, tmp_path):
    plan_only = tmp_path / "plan_only"
    plan_only.mkdir()
    for f in ("config.json", "model.safetensors.index.json"):
        shutil.copy(tiny_ckpt / f, plan_only)
    with pytest.raises(CheckpointError, match="shard file is missing"):
        Checkpoint.open(plan_only)
    ckpt = Checkpoint.open(plan_only, weights=False)
    assert not ckpt.has_weights
    assert len(ckpt.specs) > 0
    with pytest.raises(CheckpointError, match="weights are not present"):
        ckpt.raw("embed.weight")


# ----- bad input: one clear error naming the file and tensor, nothing half-opened -------------------

def test_missing_shard(ckpt_copy):
    shard = _index(ckpt_copy)["weight_map"]["layers.1.attn.wq_a.weight"]
    (ckpt_copy / shard).unlink()
    with pytest.raises(CheckpointError, match="shard file is missing") as e:
        Checkpoint.open(ckpt_copy)
    assert shard in str(e.value) and "tensor 'layers.1." in str(e.value)


def test_tensor_missing_from_index(ckpt_copy):
    index = _index(ckpt_copy)
    del index["weight_map"]["layers.3.ffn.experts.2.w2.scale"]
    _write_index(ckpt_copy, index)
    with pytest.raises(CheckpointError, match="missing from the index") as e:
        Checkpoint.open(ckpt_copy)
    assert "model.safetensors.index.json" in str(e.value) and "layers.3.ffn.experts.2.w2.scale" in str(e.value)


def test_tensor_missing_from_file(ckpt_copy):
    index = _index(ckpt_copy)
    name = "layers.2.attn.compressor.ape"
    shard = ckpt_copy / index["weight_map"][name]
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="absent from the file") as e:
        Checkpoint.open(ckpt_copy)
    assert shard.name in str(e.value) and name in str(e.value)


@pytest.mark.parametrize("name,bad,problem", [
    ("layers.1.attn.wq_a.weight", lambda t: t.to(torch.bfloat16), "dtype BF16 is wrong; expected F8_E4M3"),
    ("layers.2.ffn.experts.0.w1.weight", lambda t: t[:, :-1].contiguous(), "shape .* contradicts config.json"),
])
def test_wrong_dtype_or_shape(ckpt_copy, name, bad, problem):
    shard = ckpt_copy / _index(ckpt_copy)["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = bad(tensors[name])
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=problem) as e:
        Checkpoint.open(ckpt_copy)
    assert shard.name in str(e.value) and name in str(e.value)


def test_truncated_shard(ckpt_copy):
    shard = ckpt_copy / _index(ckpt_copy)["weight_map"]["layers.3.attn.wkv.weight"]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated") as e:
        Checkpoint.open(ckpt_copy)
    assert shard.name in str(e.value)


def test_unknown_quantization_format(ckpt_copy):
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["quantization_config"]["fmt"] = "e5m2"
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown quantization format 'e5m2'") as e:
        Checkpoint.open(ckpt_copy)
    assert "config.json" in str(e.value) and "quantization_config.fmt" in str(e.value)


def test_unknown_expert_format(ckpt_copy):
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg["expert_dtype"] = "int3"
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="expert_dtype.*unknown expert format 'int3'"):
        Checkpoint.open(ckpt_copy)


@pytest.mark.parametrize("key,value,problem", [
    ("hidden_size", 512, "shape .* contradicts config.json"),            # every tensor disagrees
    ("n_routed_experts", 8, r"shape \[16, 256\] contradicts"),         # the gate has 16 rows
    ("num_hidden_layers", 5, "missing from the index"),                  # layer 4 does not exist
])
def test_config_contradicting_tensors(ckpt_copy, key, value, problem):
    cfg = json.loads((ckpt_copy / "config.json").read_text())
    cfg[key] = value
    if key == "num_hidden_layers":
        cfg["compress_ratios"] = cfg["compress_ratios"] + [0]
    (ckpt_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=problem):
        Checkpoint.open(ckpt_copy)


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.pop("hidden_size"), "hidden_size"),
    (lambda c: c.update(compress_ratios=[0, 4, 64, 4, 0]), "compress_ratios"),
    (lambda c: c.update(compress_ratios=[0, 4]), "compress_ratios"),
    (lambda c: c.update(num_experts_per_tok=99), "num_experts_per_tok"),
    (lambda c: c.update(rope_scaling={"type": "linear", "factor": 2}), "rope_scaling"),
])
def test_config_errors_name_the_field(tiny_ckpt, edit, field):
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    edit(cfg)
    with pytest.raises(CheckpointError) as e:
        ModelConfig.from_dict(cfg, source="x/config.json")
    assert e.value.field == field and "x/config.json" in str(e.value)


def test_config_accepts_long_compress_ratios_and_the_mtp_tail(tiny_ckpt):
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    cfg["compress_ratios"] = cfg["compress_ratios"][:4] + [4, 0, 0]  # like V4-Flash-0731's 46 entries
    c = ModelConfig.from_dict(cfg)
    assert c.compress_ratios[:4] == (0, 4, 128, 4) and c.n_layers == 4


def test_mtp_tensors_are_checked_like_the_models(ckpt_copy):
    """The MTP block is optional, but what a checkpoint has of it must be right: a wrong dtype is refused
    naming the tensor, and the main model's specs never include it."""
    with Checkpoint.open(ckpt_copy) as ckpt:
        assert "mtp.0.e_proj.weight" in ckpt.mtp_specs and "mtp.0.e_proj.weight" not in ckpt.specs
    extra = ckpt_copy / "model-mtp.safetensors"
    save_file({"mtp.0.e_proj.weight": torch.zeros(256, 256)}, extra, metadata={"format": "pt"})
    index = _index(ckpt_copy)
    index["weight_map"]["mtp.0.e_proj.weight"] = extra.name
    _write_index(ckpt_copy, index)
    with pytest.raises(CheckpointError, match="dtype F32 is wrong; expected F8_E4M3") as e:
        Checkpoint.open(ckpt_copy)
    assert "mtp.0.e_proj.weight" in str(e.value)
