"""DeepSeek-V4 config.json, read with the official key names and validated on construction.

The official file keeps legacy names (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
`rope_scaling`); transformers folds them into new ones, we keep them as shipped. Derived facts the
rest of the project needs (attention kind per layer, hash layers, compressor widths) are properties.

The 0731 release (DeepSeek-V4-Flash-0731) adds `dspark_*` keys: its `mtp.*` tensors are then a DSpark
drafter (one V4 block per target layer, plus its own projection and heads), not an MTP block, although
`num_nextn_predict_layers` still says 1. `mtp_blocks` is the number of real MTP blocks.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import CheckpointError

# compress ratio -> attention kind; only these three values exist in DeepSeek-V4.
ATTENTION_KINDS = {0: "sliding", 4: "csa", 128: "hca"}
SUPPORTED_EXPERT_DTYPES = ("fp4",)
SUPPORTED_SCORING = ("sqrtsoftplus",)
DSPARK_KEYS = ("dspark_block_size", "dspark_target_layer_ids", "dspark_markov_rank", "dspark_noise_token_id")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_hash_layers: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    sliding_window: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: dict = field(hash=False)
    routed_scaling_factor: float
    swiglu_limit: float
    scoring_func: str
    expert_dtype: str
    quantization_config: dict = field(hash=False)
    num_key_value_heads: int = 1
    max_position_embeddings: int = 1048576
    num_nextn_predict_layers: int = 0
    bos_token_id: int = 0
    eos_token_id: int = 1
    # the DSpark drafter of the 0731 release (all four keys or none): tokens drafted per block, the main
    # layers whose hidden states it reads (one drafter stage each), its Markov head's rank, its mask token
    dspark_block_size: int | None = None
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int | None = None
    dspark_noise_token_id: int | None = None
    source: str = field(default="<dict>", compare=False, hash=False)
    raw: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        self._validate()

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> ModelConfig:
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("source", "raw"):
                continue
            if f.name not in d:
                if f.default is not MISSING:
                    continue  # optional key; the dataclass default applies
                raise CheckpointError(source, "required key is missing", field=f.name)
            kwargs[f.name] = d[f.name]
        kwargs["compress_ratios"] = tuple(_as_int_list(source, "compress_ratios", d["compress_ratios"]))
        if "dspark_target_layer_ids" in d:
            kwargs["dspark_target_layer_ids"] = tuple(_as_int_list(source, "dspark_target_layer_ids",
                                                                   d["dspark_target_layer_ids"]))
        return cls(**kwargs, source=source, raw=dict(d))

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise CheckpointError(path, "config.json not found")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(path, f"not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise CheckpointError(path, "top level must be a JSON object")
        return cls.from_dict(d, source=str(path))

    # ----- derived facts ------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    def compress_ratio(self, layer: int) -> int:
        """0 (sliding only), 4 (CSA) or 128 (HCA). Layers from num_hidden_layers on are the MTP blocks; a
        config whose list stops before them gives them 0, as V4's own entries for them are."""
        return self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0

    def attention_kind(self, layer: int) -> str:
        return ATTENTION_KINDS[self.compress_ratio(layer)]

    @property
    def has_dspark(self) -> bool:
        """Whether the config describes a DSpark drafter (the 0731 release's `mtp.*`)."""
        return bool(self.dspark_target_layer_ids)

    @property
    def dspark_stages(self) -> int:
        """The drafter's blocks, `mtp.0` .. `mtp.{stages - 1}`: one per target layer (0 without a drafter)."""
        return len(self.dspark_target_layer_ids)

    @property
    def mtp_blocks(self) -> int:
        """Real multi-token-prediction blocks: num_nextn_predict_layers, except where `mtp.*` is a DSpark
        drafter (0731 keeps num_nextn_predict_layers 1 with no MTP block)."""
        return 0 if self.has_dspark else self.num_nextn_predict_layers

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.num_hash_layers

    @property
    def hc_dim(self) -> int:
        """Width of the flattened mHC residual (hc_mult streams of hidden_size)."""
        return self.hc_mult * self.hidden_size

    @property
    def hc_mix_dim(self) -> int:
        """Rows of hc_*_fn: pre (hc) + post (hc) + the hc x hc combination matrix."""
        return (2 + self.hc_mult) * self.hc_mult

    def compressor_width(self, layer: int) -> int:
        """Output width of a layer's compressor wkv/wgate: CSA overlaps two windows (2 x head_dim)."""
        ratio = self.compress_ratio(layer)
        return (2 if ratio == 4 else 1) * self.head_dim

    # ----- validation ---------------------------------------------------------------------------
    def _validate(self) -> None:
        src = self.source

        def bad(name: str, problem: str) -> CheckpointError:
            return CheckpointError(src, problem, field=name)

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                     "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "n_routed_experts",
                     "num_experts_per_tok", "moe_intermediate_size", "index_n_heads", "index_head_dim",
                     "index_topk", "sliding_window", "hc_mult", "hc_sinkhorn_iters"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, f"must be a positive integer, got {v!r}")
        for name in ("num_hash_layers", "n_shared_experts", "num_nextn_predict_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, f"must be a non-negative integer, got {v!r}")
        if len(self.compress_ratios) < self.num_hidden_layers:
            raise bad("compress_ratios", f"has {len(self.compress_ratios)} entries, needs at least "
                      f"num_hidden_layers = {self.num_hidden_layers}")
        for i, r in enumerate(self.compress_ratios):
            if r not in ATTENTION_KINDS:
                raise bad("compress_ratios", f"entry {i} is {r}; allowed values are {sorted(ATTENTION_KINDS)}")
        if self.num_hash_layers > self.num_hidden_layers:
            raise bad("num_hash_layers", f"{self.num_hash_layers} exceeds num_hidden_layers {self.num_hidden_layers}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise bad("num_experts_per_tok",
                      f"{self.num_experts_per_tok} exceeds n_routed_experts {self.n_routed_experts}")
        if self.n_shared_experts != 1:
            raise bad("n_shared_experts", f"DeepSeek-V4 has exactly 1 shared expert, got {self.n_shared_experts}")
        if self.num_key_value_heads != 1:
            raise bad("num_key_value_heads", f"DeepSeek-V4 uses one shared K=V head, got {self.num_key_value_heads}")
        if self.qk_rope_head_dim > self.head_dim or self.qk_rope_head_dim % 2:
            raise bad("qk_rope_head_dim", f"must be even and <= head_dim {self.head_dim}, got {self.qk_rope_head_dim}")
        if self.qk_rope_head_dim > self.index_head_dim:
            raise bad("index_head_dim", f"must be >= qk_rope_head_dim {self.qk_rope_head_dim}")
        if self.num_attention_heads % self.o_groups:
            raise bad("o_groups", f"{self.o_groups} does not divide num_attention_heads {self.num_attention_heads}")
        if self.scoring_func not in SUPPORTED_SCORING:
            raise bad("scoring_func", f"'{self.scoring_func}' is not supported; allowed: {SUPPORTED_SCORING}")
        if self.expert_dtype not in SUPPORTED_EXPERT_DTYPES:
            raise bad("expert_dtype",
                      f"unknown expert format '{self.expert_dtype}'; allowed: {SUPPORTED_EXPERT_DTYPES}")
        qc = self.quantization_config
        if not isinstance(qc, dict):
            raise bad("quantization_config", "must be an object")
        expected = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0"}
        for k, v in expected.items():
            if qc.get(k) != v:
                raise bad(f"quantization_config.{k}", f"unknown quantization format {qc.get(k)!r}; supported: {v!r}")
        if list(qc.get("weight_block_size", [])) != [128, 128]:
            raise bad("quantization_config.weight_block_size",
                      f"{qc.get('weight_block_size')!r} is not supported; supported: [128, 128]")
        self._validate_dspark(bad)
        rs = self.rope_scaling
        if not isinstance(rs, dict) or rs.get("type", rs.get("rope_type")) != "yarn":
            raise bad("rope_scaling", f"expected a yarn rope_scaling object, got {rs!r}")
        for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
            if k not in rs:
                raise bad(f"rope_scaling.{k}", "required key is missing")


    def _validate_dspark(self, bad) -> None:
        given = [k for k in DSPARK_KEYS if k in self.raw] if self.raw else \
            [k for k in DSPARK_KEYS if getattr(self, k) not in (None, ())]
        if not given:
            return
        missing = [k for k in DSPARK_KEYS if k not in given]
        if missing:
            raise bad(missing[0], f"the DSpark drafter's keys come together ({', '.join(DSPARK_KEYS)}); "
                      f"{given[0]} is given, {missing[0]} is missing")
        for name in ("dspark_block_size", "dspark_markov_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(name, f"must be a positive integer, got {v!r}")
        targets = self.dspark_target_layer_ids
        if not targets or any(not 0 <= t < self.num_hidden_layers for t in targets) or len(set(targets)) < len(targets):
            raise bad("dspark_target_layer_ids", f"must be distinct layers in 0..{self.num_hidden_layers - 1}, "
                      f"got {list(targets)}")
        v = self.dspark_noise_token_id
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < self.vocab_size:
            raise bad("dspark_noise_token_id", f"must be a token id in 0..{self.vocab_size - 1}, got {v!r}")


def _as_int_list(source: str, name: str, value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise CheckpointError(source, f"must be a list of integers, got {value!r}", field=name)
    return list(value)
