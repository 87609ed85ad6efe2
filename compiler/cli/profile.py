"""ostinato-profile: report, merge, import and export routing profiles (offline: no model runs).

Recording a profile runs the model, so it is the runtime's command: ostinato-record.

  ostinato-profile report PROFILE [--holdout P2] [--budget-experts N | --hardware HW --model DIR] [--plot PNG]
  ostinato-profile merge OUT P1 P2 [...]
  ostinato-profile import COUNTS.csv|.npz --model DIR -o OUT        counts recorded by another engine
  ostinato-profile export PROFILE -o COUNTS.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ostinato.checkpoint import CheckpointError, ModelConfig
from ostinato.cli.common import EXIT_USAGE, InputError, check_model_dir, check_output_file, refuse
from ostinato.hardware import HardwareError, available_presets
from ostinato.plan import PlanError
from ostinato.profile_format import ProfileError, load_profile

from ..codegen.cxx import KernelCompileError
from ..compile import CompileError, CompileOptions, compile_plan

COMMANDS = ("report", "merge", "import", "export")


def _report(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile report",
                                description="How much of the routing a resident hot set covers, per layer and phase, "
                                            "in-sample and on held-out sessions; a table and a PNG plot.")
    p.add_argument("profile", type=Path)
    p.add_argument("--holdout", type=Path, help="a profile of other sessions, to measure the chosen hot set on")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-experts", type=int, help="hot experts per layer (default: a quarter of them)")
    g.add_argument("--hardware", help="hardware spec or preset: the hot set ostinato-compile would place (needs "
                                      f"--model); presets: {', '.join(available_presets())}")
    p.add_argument("--model", type=Path, help="checkpoint directory (with --hardware)")
    p.add_argument("--plot", type=Path, help="write the coverage plot here (PNG)")
    a = p.parse_args(argv)
    if a.hardware and a.model is None:
        p.error("--hardware needs --model (the checkpoint the plan would be for)")
    if a.plot:
        check_output_file(a.plot, "--plot")
    from ..profile.report import build_report, plot_report

    profile = load_profile(a.profile)
    holdout = load_profile(a.holdout) if a.holdout else None
    if holdout is not None:
        holdout.check_fits(profile.n_layers, profile.n_experts, profile.top_k, where=str(a.holdout))
    budget = a.budget_experts if a.budget_experts is not None else profile.n_experts // 4
    if a.hardware:
        check_model_dir(a.model, "--model")
        budget = _budget_from_hardware(a.model, a.hardware, a.profile)
    if not 0 <= budget <= profile.n_experts:
        p.error(f"--budget-experts must be in [0, {profile.n_experts}], got {budget}")
    report = build_report(profile, holdout, budget)
    print(report.text)
    if a.plot:
        print(f"wrote {plot_report(report, profile, a.plot)}")
    return 0


def _budget_from_hardware(model: Path, hardware: str, profile: Path) -> int:
    """Mean hot experts per layer of the plan ostinato-compile would make."""
    plan = compile_plan(CompileOptions(model, Path("-"), hardware, profile=str(profile), build_kernels=False)).plan
    return round(sum(len(l.hot_experts) for l in plan.layers) / len(plan.layers))


def _merge(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile merge", description="Add up profiles of the same model.")
    p.add_argument("output", type=Path)
    p.add_argument("profiles", type=Path, nargs="+")
    a = p.parse_args(argv)
    check_output_file(a.output, "OUTPUT")
    from ..profile.merge import merge_profiles

    merged = merge_profiles([load_profile(x) for x in a.profiles])
    merged.save(a.output)
    print(f"wrote {a.output}: {len(a.profiles)} profiles, {int(merged.counts.sum()):,d} routes")
    return 0


def _import(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile import",
                                description="Make a profile from plain counts (CSV: layer,expert,phase,count; or NPZ).")
    p.add_argument("counts", type=Path)
    p.add_argument("--model", type=Path, required=True, help="checkpoint directory (gives layers, experts, top-k)")
    p.add_argument("-o", "--output", type=Path, required=True)
    a = p.parse_args(argv)
    check_model_dir(a.model, "--model")
    check_output_file(a.output, "--output")
    from ..profile.counts_io import import_counts

    cfg = ModelConfig.from_json(a.model)
    profile = import_counts(a.counts, cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok,
                            mtp_layers=cfg.mtp_blocks)
    profile.save(a.output)
    print(f"wrote {a.output}: {int(profile.counts.sum()):,d} routes")
    return 0


def _export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile export", description="Write a profile's counts as CSV.")
    p.add_argument("profile", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    a = p.parse_args(argv)
    check_output_file(a.output, "--output")
    from ..profile.counts_io import export_csv

    export_csv(load_profile(a.profile), a.output)
    print(f"wrote {a.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    handlers = {"report": _report, "merge": _merge, "import": _import, "export": _export}
    if not argv or argv[0] not in handlers:
        if argv and argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0
        print(f"ostinato-profile: error: expected a command ({', '.join(COMMANDS)}); to record a profile (it runs "
              "the model) use ostinato-record MODEL --sessions FILE -o OUT", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handlers[argv[0]](argv[1:])
    except (InputError, ProfileError, CheckpointError, HardwareError, CompileError, PlanError, KernelCompileError) as e:
        return refuse("ostinato-profile", e)


if __name__ == "__main__":
    sys.exit(main())
