"""ostinato-inspect: validate a checkpoint directory and print what it holds and how big it is.

Works on a full checkpoint, on config.json + index (planning without weights), or on a folder
with config.json alone (sizes come from the config: nothing else is needed to size a model).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from ostinato.checkpoint import CheckpointError, ModelConfig, model_sizes
from ostinato.checkpoint.reader import INDEX_NAME, SINGLE_NAME, Checkpoint
from ostinato.checkpoint.tensor_specs import model_specs, mtp_specs

from .common import InputError, check_model_dir, print_output, refuse


def _gb(n: int) -> str:
    return f"{n / 1e9:9.3f} GB"


def describe(directory: Path, list_tensors: bool) -> str:
    has_index = (directory / INDEX_NAME).exists() or (directory / SINGLE_NAME).exists()
    if has_index:
        ckpt = Checkpoint.open(directory, weights=False)
        cfg, specs, mtp = ckpt.config, ckpt.specs, ckpt.mtp_specs
        status = "weights present, all headers valid" if ckpt.has_weights else "index only (no weights): planning only"
        mtp_status = "present" if mtp else "absent from this checkpoint (speculative decoding unavailable)"
    else:
        cfg = ModelConfig.from_json(directory)
        specs, mtp = model_specs(cfg), mtp_specs(cfg)
        status = "config.json only: sizes computed from the config"
        mtp_status = "sized from the config"
    sizes = model_sizes(cfg)
    kinds = Counter(l.attention_kind for l in sizes.layers)
    lines = [f"{directory}: {status}",
             f"  layers {cfg.n_layers} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
             f"hash layers {cfg.num_hash_layers}, experts {cfg.n_routed_experts} routed + 1 shared, "
             f"top-{cfg.num_experts_per_tok}, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}",
             f"  one routed expert   {sizes.expert_bytes:>15,d} B (MXFP4 + scales)",
             f"  all routed experts  {_gb(sizes.routed_bytes)}",
             f"  dense layer weights {_gb(sizes.dense_layer_bytes)}",
             f"  embed/head/norms    {_gb(sizes.global_bytes)}",
             f"  total               {_gb(sizes.total_bytes)}  ({len(specs)} tensors)",
             "",
             "  layer  kind     hash  dense bytes    routed bytes"]
    for l in sizes.layers:
        lines.append(f"  {l.layer:5d}  {l.attention_kind:7s}  {'yes' if l.hash_layer else '   '}  "
                     f"{l.dense_bytes:>12,d}  {l.routed_bytes:>14,d}")
    if cfg.num_nextn_predict_layers:
        routed = sum(s.nbytes for s in mtp.values() if s.role == "routed_expert")
        dense = sum(s.nbytes for s in mtp.values()) - routed
        lines += ["", f"  MTP blocks (mtp.K.*, num_nextn_predict_layers {cfg.num_nextn_predict_layers}): {mtp_status}",
                  f"    {len(mtp)} tensors ({cfg.n_routed_experts} routed experts each): dense {dense:,d} B, "
                  f"routed {routed:,d} B, not counted in the total above"]
    if list_tensors:
        lines += ["", "  name                                                 shape              dtype     role"]
        for s in list(specs.values()) + list(mtp.values()):
            lines.append(f"  {s.name:52s} {str(list(s.shape)):18s} {s.dtype:9s} {s.role}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ostinato-inspect",
                                description="Validate a DeepSeek-V4 checkpoint directory (official format) and "
                                            "print its layers and exact byte sizes.")
    p.add_argument("directory", type=Path, help="checkpoint directory (config.json, index, shards)")
    p.add_argument("--tensors", action="store_true", help="also list every tensor with shape, dtype and role")
    args = p.parse_args(argv)
    try:
        check_model_dir(args.directory, "DIRECTORY")
        print_output(describe(args.directory, args.tensors))
    except (CheckpointError, InputError) as e:
        return refuse("ostinato-inspect", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
