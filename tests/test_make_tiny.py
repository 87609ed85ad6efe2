"""ostinato-make-tiny: deterministic, official-format, atomic, with planted popularity."""

import filecmp
import json

import pytest
import torch
from tokenizers import Tokenizer

from ostinato.checkpoint.reader import Checkpoint
from ostinato.cli import make_tiny as cli
from ostinato.tiny import write_tiny_checkpoint
from ostinato.tiny import writer as writer_module


def _same_files(a, b):
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return mismatch == [] and errors == []


def test_same_seed_gives_byte_identical_files(tiny_ckpt, tmp_path):
    again = write_tiny_checkpoint(tmp_path / "again", "tiny", seed=0, progress=False)
    assert _same_files(tiny_ckpt, again)
    other = write_tiny_checkpoint(tmp_path / "other", "tiny", seed=1, progress=False)
    assert not _same_files(tiny_ckpt, other)


def test_official_layout(tiny_ckpt):
    files = sorted(p.name for p in tiny_ckpt.iterdir())
    shards = [f for f in files if f.endswith(".safetensors")]
    assert shards == [f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)]  # embed, 4 layers, head, MTP
    index = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["embed.weight"] == shards[0] and index["weight_map"]["head.weight"] == shards[-2]
    assert index["weight_map"]["mtp.0.e_proj.weight"] == shards[-1]
    assert not any(n.startswith("model.") for n in index["weight_map"])  # native names, no prefix
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    assert cfg["quantization_config"]["fmt"] == "e4m3" and cfg["expert_dtype"] == "fp4"
    assert cfg["architectures"] == ["DeepseekV4ForCausalLM"]


def test_tokenizer_has_the_v4_special_tokens(tiny_ckpt):
    tok = Tokenizer.from_file(str(tiny_ckpt / "tokenizer.json"))
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    assert tok.token_to_id("<｜begin▁of▁sentence｜>") == cfg["bos_token_id"] == 0
    assert tok.token_to_id("<｜end▁of▁sentence｜>") == cfg["eos_token_id"] == 1
    for special in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"):
        assert tok.encode(f"a{special}b").tokens.count(special) == 1
    assert tok.get_vocab_size() <= cfg["vocab_size"]
    text = "def read_header(path): return 42"
    assert tok.decode(tok.encode(text).ids) == text


def _gate_selection_share(ckpt, layer, top):
    """Share of top-k selections that go to the `top` most biased experts, for random activations."""
    gate = ckpt.dequantized(f"layers.{layer}.ffn.gate.weight")
    bias = ckpt.dequantized(f"layers.{layer}.ffn.gate.bias")
    x = torch.randn(2000, gate.shape[1], generator=torch.Generator().manual_seed(0))
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    scores = torch.nn.functional.softplus(x @ gate.T).sqrt()
    chosen = (scores + bias).topk(ckpt.config.num_experts_per_tok, dim=-1).indices
    favourites = bias.topk(top).indices
    return torch.isin(chosen, favourites).float().mean().item()


def test_planted_popularity_concentrates_routes(tmp_path, tiny_ckpt):
    planted = write_tiny_checkpoint(tmp_path / "planted", "tiny", seed=0, popularity=1.0, progress=False)
    with Checkpoint.open(planted) as p, Checkpoint.open(tiny_ckpt) as u:
        E = p.config.n_routed_experts
        assert _gate_selection_share(p, 1, E // 4) > 0.6      # a quarter of the experts takes most routes
        assert _gate_selection_share(u, 1, E // 4) < 0.45     # vs about a quarter without planting
        tid2eid = p.dequantized("layers.0.ffn.gate.tid2eid")
        counts = torch.bincount(tid2eid.flatten(), minlength=E).sort(descending=True).values
        assert counts[: E // 4].sum() / counts.sum() > 0.5
        assert all(len(set(row)) == len(row) for row in tid2eid.tolist())  # distinct experts per token


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(writer_module, "write_tokenizer", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_tiny_checkpoint(tmp_path / "out", "tiny", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert cli.main([str(tmp_path / "x"), "--quiet"]) == 1  # refused input (usage errors are 2)
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"


def test_cli_rejects_unknown_preset(capsys):
    with pytest.raises(SystemExit):
        cli.main(["somewhere", "--preset", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_the_mtp_block_in_the_official_format(tiny_ckpt, tmp_path):
    """mtp.0.*: a decoder block at layer index num_hidden_layers (its compress_ratios entry), FP8 dense
    weights with e8m0 block scales, MXFP4 experts, plus e_proj/h_proj (FP8), enorm/hnorm/norm (BF16) and
    its own mHC head (F32); --no-mtp leaves it out; a partial block is refused by name."""
    from ostinato.checkpoint import CheckpointError
    from ostinato.runtime import load_model

    with Checkpoint.open(tiny_ckpt) as ckpt:
        n, m = ckpt.config.num_hidden_layers, ckpt.mtp_specs
        assert ckpt.has_mtp and list(ckpt.expert_layers) == list(range(n + 1))
        assert {m[f"mtp.0.{k}"].dtype for k in ("e_proj.weight", "h_proj.weight", "attn.wq_a.weight")} == {"F8_E4M3"}
        assert m["mtp.0.e_proj.scale"].dtype == "F8_E8M0" and m["mtp.0.e_proj.weight"].shape == (256, 256)
        assert m["mtp.0.ffn.experts.3.w1.weight"].dtype == "I8" and m["mtp.0.enorm.weight"].dtype == "BF16"
        assert m["mtp.0.hc_head_fn"].shape == (4, 1024) and "mtp.0.ffn.gate.bias" in m  # score routing
        assert "mtp.0.attn.compressor.ape" not in m  # compress_ratios[n] = 0: sliding attention
        assert not any(name.startswith("mtp.") for name in ckpt.specs)  # the main model never needs it
        assert ckpt.expert_packed(n, 3).w1.shape == (128, 128)
    bare = write_tiny_checkpoint(tmp_path / "bare", "tiny", seed=0, progress=False, mtp=False)
    with Checkpoint.open(bare) as ckpt:
        assert not ckpt.has_mtp and ckpt.config.num_nextn_predict_layers == 0
    with pytest.raises(CheckpointError, match="has none"):
        load_model(bare, mtp=True)
    index = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())
    del index["weight_map"]["mtp.0.h_proj.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_ckpt.iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "model.safetensors.index.json").unlink()
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="MTP block is incomplete") as e:
        Checkpoint.open(broken)
    assert "mtp.0.h_proj.weight" in str(e.value)


def test_inspect_lists_the_mtp_block(tiny_ckpt, capsys):
    from ostinato.cli import inspect

    assert inspect.main([str(tiny_ckpt), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "MTP blocks (mtp.K.*, num_nextn_predict_layers 1): present" in out
    assert "mtp.0.e_proj.weight" in out and "mtp.0.ffn.experts.15.w2.scale" in out
