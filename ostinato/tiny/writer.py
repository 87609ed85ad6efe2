"""Write a random DeepSeek-V4 checkpoint in exactly the official on-disk format.

Layout follows the official shards: embed alone, one shard per decoder layer, then head + norm +
hc_head, then the MTP block (when the config has one) or the 0731 release's DSpark drafter, a shard
per stage; `model.safetensors.index.json` maps every name to its shard. Shards are written tensor by
tensor (shard_writer), so memory stays bounded by one tensor even for a V4-Flash layer's 3.4 GB of
experts. The directory appears whole or not at all: everything is written to a temporary sibling
that is renamed into place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.shard_writer import write_shard
from ostinato.checkpoint.tensor_specs import dspark_stage_specs, global_specs, layer_specs, mtp_block_specs

from .presets import FLASH, REAL_VOCAB_PRESETS, preset_config
from .tokenizer import copy_real_tokenizer, write_tokenizer
from .weights import encode_spec

PROVENANCE_FILE = "ostinato_tiny.json"


def shard_groups(cfg: ModelConfig) -> list[list]:
    """Spec lists, one per shard, in official order."""
    g = global_specs(cfg)
    first = [s for s in g if s.role == "embed"]
    last = [s for s in g if s.role != "embed"]
    return ([first] + [layer_specs(cfg, layer) for layer in range(cfg.num_hidden_layers)] + [last]
            + [mtp_block_specs(cfg, k) for k in range(cfg.mtp_blocks)]
            + [dspark_stage_specs(cfg, stage) for stage in range(cfg.dspark_stages)])


def write_tiny_checkpoint(directory: str | Path, preset: str = "tiny", seed: int = 0, popularity: float = 0.0,
                          force: bool = False, progress: bool = True, layers: int | None = None,
                          experts: int | None = None, mtp: bool | None = None, release: str = "original") -> Path:
    """Write a random checkpoint of `preset`; `layers` / `experts` slice the flash preset; `mtp`: with the
    MTP block or not (None: the preset's default, presets.py); `release` "0731": the 0731 release's layout
    (a DSpark drafter) and other weights than the original's under the same seed (it was retrained)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")
    if directory.exists() and any(directory.iterdir()) and not force:
        raise FileExistsError(f"{directory} exists and is not empty (use --force to replace it)")
    raw = preset_config(preset, layers, experts, mtp, release)
    cfg = ModelConfig.from_dict(raw, source=f"preset '{preset}'")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        groups = shard_groups(cfg)
        n = len(groups)
        weight_map: dict[str, str] = {}
        total = 0
        bar = tqdm(total=sum(s.nbytes for specs in groups for s in specs), unit="B", unit_scale=True,
                   desc=f"writing {preset} checkpoint", disable=not progress)
        with bar:
            def produce(spec):
                tensors = encode_spec(cfg, spec, seed, popularity, release)
                bar.update(sum(t.numel() * t.element_size() for t in tensors.values()))
                return tensors.items()

            for i, specs in enumerate(groups):
                file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
                total += write_shard(tmp / file, specs, produce)
                weight_map.update((s.name, file) for s in specs)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        if preset == FLASH or preset in REAL_VOCAB_PRESETS:
            copy_real_tokenizer(tmp, cfg.vocab_size)
        else:
            write_tokenizer(tmp, cfg.vocab_size, cfg.max_position_embeddings)
        provenance = {"generator": "ostinato-make-tiny", "preset": preset, "release": release, "seed": seed,
                      "planted_popularity": popularity,
                      "note": "random weights; any expert popularity is planted (synthetic), not learned"}
        if preset == FLASH:
            provenance.update(layers=cfg.num_hidden_layers, experts=cfg.n_routed_experts)
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)  # mkdtemp creates private files; a checkpoint is shared data
        tmp.chmod(0o755)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
