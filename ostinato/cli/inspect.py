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
from ostinato.checkpoint.tensor_specs import dspark_specs, model_specs, mtp_specs

from .common import InputError, check_model_dir, print_output, refuse


def _gb(n: int) -> str:
    return f"{n / 1e9:9.3f} GB"


def _dense_and_routed(specs: dict) -> tuple[int, int]:
    routed = sum(s.nbytes for s in specs.values() if s.role == "routed_expert")
    return sum(s.nbytes for s in specs.values()) - routed, routed


def describe(directory: Path, list_tensors: bool) -> str:
    has_index = (directory / INDEX_NAME).exists() or (directory / SINGLE_NAME).exists()
    if has_index:
        ckpt = Checkpoint.open(directory, weights=False)
        cfg, specs, mtp, drafter = ckpt.config, ckpt.specs, ckpt.mtp_specs, ckpt.dspark_specs
        status = "weights present, all headers valid" if ckpt.has_weights else "index only (no weights): planning only"
        mtp_status = "present" if mtp else "absent from this checkpoint (speculative decoding unavailable)"
        drafter_status = "present" if drafter else "absent from this checkpoint"
    else:
        cfg = ModelConfig.from_json(directory)
        specs, mtp, drafter = model_specs(cfg), mtp_specs(cfg), dspark_specs(cfg)
        status = "config.json only: sizes computed from the config"
        mtp_status = drafter_status = "sized from the config"
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
    if cfg.mtp_blocks:
        dense, routed = _dense_and_routed(mtp)
        lines += ["", f"  MTP blocks (mtp.K.*, num_nextn_predict_layers {cfg.num_nextn_predict_layers}): {mtp_status}",
                  f"    {len(mtp)} tensors ({cfg.n_routed_experts} routed experts each): dense {dense:,d} B, "
                  f"routed {routed:,d} B, not counted in the total above"]
    if cfg.has_dspark:
        sized = dspark_specs(cfg)
        dense, routed = _dense_and_routed(sized)
        lines += ["", f"  DSpark drafter (the 0731 release: mtp.0-mtp.{cfg.dspark_stages - 1}, no MTP block although "
                  f"num_nextn_predict_layers is {cfg.num_nextn_predict_layers}): {drafter_status}",
                  f"    {len(sized)} tensors: {cfg.dspark_stages} V4 blocks of {cfg.n_routed_experts} routed "
                  f"experts reading layers {list(cfg.dspark_target_layer_ids)}, block size {cfg.dspark_block_size}, "
                  f"Markov head rank {cfg.dspark_markov_rank}",
                  f"    dense {dense:,d} B, routed {routed:,d} B, not counted in the total above; "
                  "not loaded: Ostinato decodes without drafting"]
    if list_tensors:
        lines += ["", "  name                                                 shape              dtype     role"]
        for s in list(specs.values()) + list(mtp.values()) + list(drafter.values()):
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
