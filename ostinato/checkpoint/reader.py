"""Lazy reader of an official DeepSeek-V4 checkpoint directory.

`Checkpoint.open(dir)` reads config.json, the index (or a single model.safetensors) and every
shard's header, and validates all of it against the name map (tensor_specs) before returning: a
checkpoint either opens whole or raises one CheckpointError naming the file and tensor. Tensor
data is read only when asked for, and only from the shard that holds it.

With `weights=False` (planning) the shards may be absent: config.json and the index suffice, and
shapes come from the config; headers of shards that do exist are still checked.

The multi-token-prediction blocks (`mtp.K.*`, num_nextn_predict_layers of them) are optional: a
checkpoint has all of their tensors (`mtp_specs`, checked like the model's) or none (`has_mtp` False;
some conversions strip them). The main model never needs them.

The 0731 release's `mtp.0`-`mtp.2` are a DSpark drafter instead (its config's `dspark_*` keys say so):
checked the same way, as one set (`dspark_specs`: all or none), and never loaded: `has_dspark`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ModelConfig
from .errors import CheckpointError
from .formats import dequantize_fp8, dequantize_mxfp4
from .shard import Shard
from .tensor_specs import TensorSpec, dspark_specs, layer_prefix, model_specs, mtp_specs

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class PackedExpert:
    """One routed expert as stored: MXFP4 bytes [rows, cols/2] int8 and e8m0 scales [rows, cols/32]."""

    w1: torch.Tensor        # gate [I, D/2]
    w1_scale: torch.Tensor  # [I, D/32]
    w3: torch.Tensor        # up   [I, D/2]
    w3_scale: torch.Tensor  # [I, D/32]
    w2: torch.Tensor        # down [D, I/2]
    w2_scale: torch.Tensor  # [D, I/32]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.w1_scale, self.w3, self.w3_scale,
                                                           self.w2, self.w2_scale))


class Checkpoint:
    def __init__(self, root: Path, config: ModelConfig, specs: dict[str, TensorSpec], weight_map: dict[str, str],
                 shards: dict[str, Shard], mtp: dict[str, TensorSpec] | None = None,
                 dspark: dict[str, TensorSpec] | None = None):
        self.root = root
        self.config = config
        self.specs = specs  # the main model's tensors: every one is present
        self.mtp_specs = mtp or {}  # the MTP blocks' tensors when the checkpoint has them, else empty
        self.dspark_specs = dspark or {}  # the DSpark drafter's tensors when the checkpoint has them (0731)
        self.weight_map = weight_map
        self._shards = shards

    # ----- opening and validation ---------------------------------------------------------------
    @classmethod
    def open(cls, root: str | Path, weights: bool = True) -> Checkpoint:
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(root, "checkpoint directory not found")
        config = ModelConfig.from_json(root / "config.json")
        specs = model_specs(config)
        weight_map, index_path = _read_weight_map(root)
        shards: dict[str, Shard] = {}
        for file in sorted(set(weight_map.values())):
            if (root / file).exists():
                shards[file] = Shard(root / file)
            elif weights:
                first = next(n for n, f in sorted(weight_map.items()) if f == file)
                raise CheckpointError(root / file, f"shard file is missing (listed in {index_path.name})", tensor=first)
        for name, spec in specs.items():
            if name not in weight_map:
                raise CheckpointError(index_path, "tensor required by config.json is missing from the index",
                                      tensor=name)
            _check_entry(spec, shards.get(weight_map[name]), index_path)
        if not config.has_dspark and DSPARK_MARK in weight_map:
            raise CheckpointError(root / weight_map[DSPARK_MARK], "the index holds a DSpark drafter (the 0731 "
                                  "release's mtp.*) but config.json has no dspark_* keys: is it the release's "
                                  "config.json?", tensor=DSPARK_MARK)
        mtp = _optional_set("the MTP block", mtp_specs(config), weight_map, shards, index_path)
        dspark = _optional_set("the DSpark drafter", dspark_specs(config), weight_map, shards, index_path)
        for name, file in weight_map.items():
            if name not in specs and name not in mtp and name not in dspark:
                raise CheckpointError(root / file, "tensor is not part of the model config.json describes "
                                      "(does the config match these weights?)", tensor=name)
        return cls(root, config, specs, weight_map, shards, mtp, dspark)

    # ----- facts --------------------------------------------------------------------------------
    @property
    def has_mtp(self) -> bool:
        """Whether the checkpoint carries its MTP blocks (all num_nextn_predict_layers of them)."""
        return bool(self.mtp_specs)

    @property
    def has_dspark(self) -> bool:
        """Whether the checkpoint carries a DSpark drafter (the 0731 release): present, checked, never loaded."""
        return bool(self.dspark_specs)

    @property
    def expert_layers(self) -> range:
        """Layer indices with routed experts in this checkpoint: the main layers, then the MTP blocks'."""
        n = self.config.num_hidden_layers
        return range(n + (self.config.mtp_blocks if self.has_mtp else 0))

    def spec(self, name: str) -> TensorSpec | None:
        return self.specs.get(name) or self.mtp_specs.get(name) or self.dspark_specs.get(name)

    @property
    def has_weights(self) -> bool:
        return all(f in self._shards for f in set(self.weight_map[n] for n in self.specs))

    @property
    def opened_shards(self) -> list[str]:
        """Shard files whose data has been opened so far (headers alone do not count)."""
        return sorted(f for f, s in self._shards.items() if s.is_open)

    def names(self, role: str | None = None, layer: int | None = None) -> list[str]:
        return [n for n, s in self.specs.items()
                if (role is None or s.role == role) and (layer is None or s.layer == layer)]

    # ----- data ---------------------------------------------------------------------------------
    def raw(self, name: str) -> torch.Tensor:
        """The tensor exactly as stored (FP8, e8m0, packed int8, BF16, F32, int)."""
        spec = self.spec(name)
        if spec is None:
            raise CheckpointError(self.root, "no such tensor in this model", tensor=name)
        file = self.weight_map[name]
        shard = self._shards.get(file)
        if shard is None:
            raise CheckpointError(self.root / file, "weights are not present (opened for planning only)", tensor=name)
        return shard.get(name)

    def dequantized(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A weight as real numbers: FP8 and MXFP4 are decoded with their `.scale`, others cast to dtype.

        Integer tables (tid2eid) are returned as int64.
        """
        spec = self.spec(name)
        if spec is None:
            raise CheckpointError(self.root, "no such tensor in this model", tensor=name)
        stored = self.raw(name)
        if spec.dtype == "F8_E4M3":
            return dequantize_fp8(stored, self.raw(_scale_name(name)), dtype)
        if spec.role == "routed_expert" and not spec.is_scale:
            return dequantize_mxfp4(stored, self.raw(_scale_name(name)), dtype)
        if not stored.is_floating_point():
            return stored.to(torch.int64)
        return stored.to(dtype)

    def expert_packed(self, layer: int, expert: int) -> PackedExpert:
        p = f"{layer_prefix(self.config, layer)}.ffn.experts.{expert}"
        return PackedExpert(*(self.raw(f"{p}.{w}.{kind}") for w in ("w1", "w3", "w2") for kind in ("weight", "scale")))

    def close(self) -> None:
        for s in self._shards.values():
            s.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


DSPARK_MARK = "mtp.0.main_proj.weight"  # a tensor only a DSpark drafter has


def _optional_set(what: str, specs: dict[str, TensorSpec], weight_map: dict[str, str], shards: dict[str, Shard],
                  index_path: Path) -> dict[str, TensorSpec]:
    """An optional group of tensors (an MTP block, a drafter): all of it, each checked like the model's,
    or none of it ({}). A partial group is a broken conversion, refused naming a missing tensor."""
    present = [n for n in specs if n in weight_map]
    if present and len(present) < len(specs):
        missing = sorted(set(specs) - set(present))
        raise CheckpointError(index_path, f"{what} is incomplete: {len(missing)} of its {len(specs)} tensors are "
                              "missing from the index", tensor=missing[0])
    for name in present:
        _check_entry(specs[name], shards.get(weight_map[name]), index_path)
    return specs if present else {}


def _check_entry(spec: TensorSpec, shard: Shard | None, index_path: Path) -> None:
    """A listed tensor against its spec: present in its shard, with the spec's dtype and shape (nothing to
    check when the shard is absent: planning without weights)."""
    if shard is None:
        return
    name, entry = spec.name, shard.entries.get(spec.name)
    if entry is None:
        raise CheckpointError(shard.path, f"tensor is listed in {index_path.name} but absent from the file",
                              tensor=name)
    if not spec.accepts(entry.dtype):
        raise CheckpointError(shard.path, f"dtype {entry.dtype} is wrong; expected {spec.dtype}", tensor=name)
    if entry.shape != spec.shape:
        raise CheckpointError(shard.path, f"shape {list(entry.shape)} contradicts config.json "
                              f"(expected {list(spec.shape)})", tensor=name)


def _scale_name(weight_name: str) -> str:
    assert weight_name.endswith(".weight"), weight_name
    return weight_name[: -len("weight")] + "scale"


def _read_weight_map(root: Path) -> tuple[dict[str, str], Path]:
    index_path = root / INDEX_NAME
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
            weight_map = index["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(index_path, f"not a valid safetensors index ({type(e).__name__}: {e})") from None
        if not isinstance(weight_map, dict):
            raise CheckpointError(index_path, "weight_map must be an object", field="weight_map")
        return {str(k): str(v) for k, v in weight_map.items()}, index_path
    single = root / SINGLE_NAME
    if single.exists():
        return {name: SINGLE_NAME for name in Shard(single).entries}, single
    raise CheckpointError(root, f"neither {INDEX_NAME} nor {SINGLE_NAME} found")
