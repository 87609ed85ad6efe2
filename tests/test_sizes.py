"""Exact byte sizes of the real DeepSeek-V4-Flash from config.json alone (docs/model.md section 4)."""

import json

from ostinato.checkpoint import ModelConfig, model_sizes
from ostinato.checkpoint.reader import Checkpoint
from ostinato.plans import plans_dir

FLASH = plans_dir() / "models" / "deepseek-v4-flash" / "config.json"


def test_v4_flash_sizes_match_the_model_card():
    cfg = ModelConfig.from_json(FLASH)
    sizes = model_sizes(cfg)
    assert sizes.expert_bytes == 13_369_344                     # 12.75 MiB per MXFP4 expert incl. scales
    assert sizes.routed_bytes == 147_169_738_752                # 43 layers x 256 experts
    assert sizes.layers[5].routed_bytes == 3_422_552_064
    assert round(sizes.dense_bytes / 1e9, 2) == 8.85 and abs(sizes.dense_bytes - 8.84e9) < 0.01e9
    assert round(sizes.global_bytes / 1e9, 3) == 2.118
    kinds = {l.attention_kind: l for l in sizes.layers if not l.hash_layer}
    assert round(kinds["csa"].dense_bytes / 1e6, 2) == 167.30
    assert round(kinds["hca"].dense_bytes / 1e6, 2) == 146.04
    sliding = sizes.layers[0]
    assert sliding.hash_layer and round((sliding.dense_bytes - sliding.dense_by_role["hash_table"]) / 1e6, 2) == 137.39
    assert sliding.dense_by_role["shared_expert"] == 25_167_360
    assert [l.attention_kind for l in sizes.layers[:4]] == ["sliding", "sliding", "csa", "hca"]
    assert sizes.layers[42].attention_kind == "csa"


def test_size_model_reproduces_the_bytes_on_disk(tiny_ckpt):
    total = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    with Checkpoint.open(tiny_ckpt) as ckpt:
        mtp = sum(s.nbytes for s in ckpt.mtp_specs.values())  # the MTP block: in the file, not in the main model
        assert ckpt.has_mtp and mtp > 0
        assert model_sizes(ckpt.config).total_bytes + mtp == total
        assert sum(s.nbytes for s in ckpt.specs.values()) + mtp == total
