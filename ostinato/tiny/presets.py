"""Configs of the test models: the official V4-Flash key set with small values, or its real values.

Every preset carries one MTP block (`mtp.0.*`, num_nextn_predict_layers 1, as V4-Flash does) unless
asked not to (`mtp=False`); `real-vocab` has none by default (llama.cpp's converter has not been tried
with one).

`tiny` and `small` shrink every dimension (`real-vocab`: tiny's, with the real vocabulary)
(constraints from the format, docs/model.md section 6: every FP8 matrix dim a multiple of 128,
expert input dims multiples of 32, compress ratios only 0/4/128, index_head_dim >=
qk_rope_head_dim). `flash` keeps every V4-Flash value and only cuts the
model to its first N layers (their real attention kinds, hash layers first) and E routed experts:
a slice of the real model that fits a small machine.
"""

from __future__ import annotations

import copy
import json

from ostinato.plans import plans_dir

# The presets' positions: the context a plan reserves by default (ostinato-compile --context, an agent's: 262,144
# tokens), so the committed tiny plan and a ~100k-token conversation fit the model. Only max_position_embeddings
# grows; YaRN's factor (16, V4-Flash's) and original window (256 / 512) stay. Why: the rotation frequencies
# (runtime/model/rope.py, and transformers' reference) are a function of factor and original window alone, never
# of max_position_embeddings, so every position computes exactly what it did (the routing profiles recorded on
# the tiny model reproduce bit for bit), while making the window consistent (original x factor = max, as
# V4-Flash's 65,536 x 16 = 1,048,576) would change the CSA/HCA rotations at every position. The positions are
# still covered: the slowest compressed-layer channel turns once every ~11.1M positions (base 160,000
# interpolated by 16, the same channel as V4-Flash's), so at 262,144 it has turned 0.15 rad (V4-Flash at
# 1,048,576: 0.60) and no two positions share a rotation. transformers logs that the factor differs from
# max / original (a warning only; it uses the given factor, as rope.py does).
AGENT_POSITIONS = 262144

# Keys that differ from the official V4-Flash config; everything else is copied from it.
PRESETS: dict[str, dict] = {
    # Runs in seconds on 2 cores. Covers sliding, CSA and HCA layers and hash + score routing.
    # index_topk 128 keeps every visible compressed entry up to 512 tokens (exact-test safe).
    # Positions: an agent's context (AGENT_POSITIONS, the plans' default), with V4-Flash's YaRN factor 16 on a
    # short original window (see AGENT_POSITIONS for why the window stays 256).
    "tiny": dict(
        vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, head_dim=128,
        qk_rope_head_dim=64, q_lora_rank=128, o_groups=2, o_lora_rank=128, n_routed_experts=16,
        num_experts_per_tok=4, moe_intermediate_size=128, compress_ratios=[0, 4, 128, 4, 0], num_hash_layers=1,
        index_n_heads=4, index_head_dim=128, index_topk=128, sliding_window=16,
        max_position_embeddings=AGENT_POSITIONS,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 256,
                      "type": "yarn"},
    ),
    # Larger and differently ordered: more heads and experts, top-6, two hash layers, a small
    # index_topk so the indexer really selects.
    "small": dict(
        vocab_size=1024, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, head_dim=128,
        qk_rope_head_dim=64, q_lora_rank=256, o_groups=4, o_lora_rank=128, n_routed_experts=32,
        num_experts_per_tok=6, moe_intermediate_size=256, compress_ratios=[0, 128, 4, 128, 4, 4, 0],
        num_hash_layers=2, index_n_heads=8, index_head_dim=128, index_topk=64, sliding_window=32,
        max_position_embeddings=AGENT_POSITIONS,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 512,
                      "type": "yarn"},
    ),
}
# tiny's dimensions with V4's real vocabulary (129,280 ids) and tokenizer, and index_head_dim != head_dim:
# a checkpoint llama.cpp's converter and DSV4 loader accept (they refuse a toy vocabulary and die on
# index_head_dim == head_dim), so both engines can run the same weights; the head and embedding
# (66 MB each in bf16) dominate a decode step, as they do in small real models.
PRESETS["real-vocab"] = dict(PRESETS["tiny"], vocab_size=129280, index_head_dim=64)
REAL_VOCAB_PRESETS = ("real-vocab",)  # with the real tokenizer (besides flash)
WITHOUT_MTP = ("real-vocab",)  # presets whose default is no MTP block (above)


def official_flash_config() -> dict:
    """The shipped DeepSeek-V4-Flash config.json as a dict."""
    return json.loads((plans_dir() / "models" / "deepseek-v4-flash" / "config.json").read_text())


FLASH = "flash"                  # V4-Flash's own values, sliced (flash_config)
PRESET_NAMES = sorted(PRESETS) + [FLASH]


def flash_config(layers: int, experts: int, mtp: bool = True) -> dict:
    """V4-Flash's config.json cut to its first `layers` layers and `experts` routed experts (its MTP block
    too, which keeps its own attention kind, the entry after the main layers'), with or without it."""
    cfg = official_flash_config()
    top_k, n_layers = cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    if not 1 <= layers <= n_layers:
        raise ValueError(f"--layers must be in 1..{n_layers} (V4-Flash has {n_layers}), got {layers}")
    if not top_k <= experts <= cfg["n_routed_experts"]:
        raise ValueError(f"--experts must be in {top_k}..{cfg['n_routed_experts']} (at least top-k = {top_k}), "
                         f"got {experts}")
    cfg.update(num_hidden_layers=layers, n_routed_experts=experts, num_hash_layers=min(cfg["num_hash_layers"], layers),
               compress_ratios=cfg["compress_ratios"][:layers] + [cfg["compress_ratios"][n_layers]],
               num_nextn_predict_layers=1 if mtp else 0)
    return cfg


RELEASES = ("original", "0731")  # V4-Flash's releases: the first, and 0731 (retrained, a DSpark drafter)
# The 0731 release's drafter, as its config.json has it; a preset keeps the block size and takes its own last
# layers as targets, a rank that fits its size and its vocabulary's last id as the mask token.
DSPARK_0731 = dict(dspark_block_size=5, dspark_target_layer_ids=[40, 41, 42], dspark_markov_rank=256,
                   dspark_noise_token_id=128799)
DSPARK_TARGETS = 3


def with_dspark(cfg: dict) -> dict:
    """`cfg` as the 0731 release writes it: the dspark_* keys (num_nextn_predict_layers stays 1, its mtp.*
    being the drafter) and compress_ratios entries for the drafter's stages (sliding: 0)."""
    cfg = dict(cfg, **DSPARK_0731)
    n, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    if n != 43 or vocab != 129280:  # not V4-Flash's own shape: targets among its layers, its own mask token
        targets = list(range(max(0, n - DSPARK_TARGETS), n))
        cfg.update(dspark_target_layer_ids=targets, dspark_noise_token_id=vocab - 1,
                   dspark_markov_rank=min(256, cfg["hidden_size"] // 8))
    stages = len(cfg["dspark_target_layer_ids"])
    cfg["compress_ratios"] = cfg["compress_ratios"][:n] + [0] * stages
    cfg["num_nextn_predict_layers"] = 1
    return cfg


def preset_config(name: str, layers: int | None = None, experts: int | None = None, mtp: bool | None = None,
                  release: str = "original") -> dict:
    """The config.json of a preset; `layers` / `experts` slice the flash preset (None: all of them);
    `mtp`: with the MTP block (None: the preset's default); `release` "0731": the 0731 release's layout
    (a DSpark drafter in mtp.*, no MTP block)."""
    if release not in RELEASES:
        raise ValueError(f"unknown release '{release}'; choose one of {RELEASES}")
    if release == "0731":
        if mtp:
            raise ValueError("the 0731 release has no MTP block (its mtp.* is a DSpark drafter)")
        return with_dspark(preset_config(name, layers, experts, mtp=False))
    mtp = name not in WITHOUT_MTP if mtp is None else mtp
    if name == FLASH:
        full = official_flash_config()
        return flash_config(layers or full["num_hidden_layers"], experts or full["n_routed_experts"], mtp)
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'; choose one of {PRESET_NAMES}")
    if layers is not None or experts is not None:
        raise ValueError(f"--layers and --experts slice the flash preset, not '{name}'")
    cfg = official_flash_config()
    cfg.update(copy.deepcopy(PRESETS[name]))
    cfg["num_nextn_predict_layers"] = 1 if mtp else 0  # compress_ratios has its entry (0: sliding)
    return cfg
