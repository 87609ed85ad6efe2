"""ostinato-make-tiny: write a random DeepSeek-V4 checkpoint in the official format."""

from __future__ import annotations

import argparse
import sys

from ostinato.tiny.presets import FLASH, PRESET_NAMES, RELEASES

from .common import refuse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="ostinato-make-tiny",
        description="Write a random DeepSeek-V4 model of the official architecture and on-disk format "
                    "(native names, FP8 + e8m0 scales, MXFP4 experts, shards + index, config.json, tokenizer). "
                    "The same arguments always give byte-identical files.")
    p.add_argument("directory", help="where to write the checkpoint (created; must be empty unless --force)")
    p.add_argument("--preset", default="tiny", choices=PRESET_NAMES,
                   help="model size: 'tiny' runs in seconds on 2 cores; 'small' is larger; 'flash' has "
                        "DeepSeek-V4-Flash's exact dimensions and real tokenizer, cut with --layers/--experts "
                        "(default: tiny)")
    p.add_argument("--layers", type=int, help="flash: the first N layers of V4-Flash (1..43; default all)")
    p.add_argument("--experts", type=int, help="flash: routed experts per layer (6..256; default 256)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--popularity", type=float, default=0.0, metavar="S",
                   help="plant a synthetic per-layer expert popularity of strength S through the gate bias "
                        "and the hash tables (0 = none: random weights route almost uniformly; 1 = strong)")
    p.add_argument("--no-mtp", dest="mtp", action="store_false", default=None,
                   help="leave out the multi-token-prediction block (mtp.0.*), which every preset but real-vocab "
                        "writes by default")
    p.add_argument("--release", choices=RELEASES, default="original",
                   help="the checkpoint layout of a V4-Flash release: 'original', or '0731' (DeepSeek-V4-Flash-0731: "
                        "retrained weights, so other random weights here, and a DSpark drafter in mtp.0-mtp.2 with "
                        "the config's dspark_* keys instead of an MTP block) (default: original)")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.popularity < 0:
        p.error(f"--popularity must be >= 0, got {args.popularity}")
    if args.preset != FLASH and (args.layers is not None or args.experts is not None):
        p.error("--layers and --experts slice the flash preset (--preset flash)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ostinato.tiny.writer import write_tiny_checkpoint  # torch: only once the arguments are good

    try:
        out = write_tiny_checkpoint(args.directory, args.preset, args.seed, args.popularity, args.force,
                                    progress=not args.quiet, layers=args.layers, experts=args.experts,
                                    mtp=args.mtp, release=args.release)
    except (FileExistsError, NotADirectoryError, ValueError) as e:
        return refuse("ostinato-make-tiny", e)
    release = "" if args.release == "original" else f", release {args.release}"
    print(f"wrote {args.preset} checkpoint (seed {args.seed}, planted popularity {args.popularity}{release}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
