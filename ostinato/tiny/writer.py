"""Write a random DeepSeek-V4 checkpoint in exactly the official on-disk format.

Layout follows the official shards: embed alone, one shard per decoder layer, then head + norm +
hc_head; `model.safetensors.index.json` maps every name to its shard. The directory appears whole
or not at all: everything is written to a temporary sibling that is renamed into place.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file
from tqdm import tqdm

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import global_specs, layer_specs

from .presets import preset_config
from .tokenizer import write_tokenizer
from .weights import encode_tensors

PROVENANCE_FILE = "ostinato_tiny.json"


def shard_groups(cfg: ModelConfig) -> list[list]:
    """Spec lists, one per shard, in official order."""
    g = global_specs(cfg)
    first = [s for s in g if s.role == "embed"]
    last = [s for s in g if s.role != "embed"]
    return [first] + [layer_specs(cfg, layer) for layer in range(cfg.num_hidden_layers)] + [last]


def write_tiny_checkpoint(directory: str | Path, preset: str = "tiny", seed: int = 0, popularity: float = 0.0,
                          force: bool = False, progress: bool = True) -> Path:
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()) and not force:
        raise FileExistsError(f"{directory} exists and is not empty (use --force to replace it)")
    raw = preset_config(preset)
    cfg = ModelConfig.from_dict(raw, source=f"preset '{preset}'")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        groups = shard_groups(cfg)
        n = len(groups)
        weight_map: dict[str, str] = {}
        total = 0
        for i, specs in enumerate(tqdm(groups, desc=f"writing {preset} checkpoint", unit="shard", disable=not progress)):
            file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            tensors = encode_tensors(cfg, specs, seed, popularity)
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            for name, t in tensors.items():
                weight_map[name] = file
                total += t.numel() * t.element_size()
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        write_tokenizer(tmp, cfg.vocab_size, cfg.max_position_embeddings)
        provenance = {"generator": "ostinato-make-tiny", "preset": preset, "seed": seed,
                      "planted_popularity": popularity,
                      "note": "random weights; any expert popularity is planted (synthetic), not learned"}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)  # mkdtemp and safetensors create private files; a checkpoint is shared data
        tmp.chmod(0o755)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory
