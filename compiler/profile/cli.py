"""ostinato-profile: record, report, merge, import and export routing profiles.

  ostinato-profile MODEL --sessions FILE -o profile.safetensors     record by replaying sessions
  ostinato-profile report PROFILE [--holdout P2] [--budget-experts N | --hardware HW --model DIR] [--plot PNG]
  ostinato-profile merge OUT P1 P2 [...]
  ostinato-profile import COUNTS.csv|.npz --model DIR -o OUT        counts recorded by another engine
  ostinato-profile export PROFILE -o COUNTS.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...runtime.checkpoint import CheckpointError, ModelConfig
from ...runtime.workload import WorkloadError
from .format import ProfileError, load_profile

COMMANDS = ("report", "merge", "import", "export")


def _record(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile",
                                description="Record a routing profile: replay agent sessions (workload CSV) through "
                                            "the model and count the routes of every layer and expert, by phase. "
                                            f"Other commands: {', '.join(COMMANDS)} (ostinato-profile COMMAND -h).")
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument("--sessions", type=Path, required=True, help="workload CSV (e.g. plans/workloads/agent_turns.csv)")
    p.add_argument("-o", "--output", type=Path, required=True, help="profile file to write (.safetensors)")
    p.add_argument("--phase-boundary", type=int, default=1024,
                   help="prefills of more tokens than this count as long prefill (1024)")
    p.add_argument("--first-session", type=int, default=0, help="skip this many sessions of the file (0)")
    p.add_argument("--limit-sessions", type=int, help="replay at most this many sessions")
    p.add_argument("--limit-turns", type=int, help="replay at most this many turns per session")
    p.add_argument("--max-generated", type=int, help="decode at most this many tokens per turn")
    p.add_argument("--scale", type=float, default=1.0, help="multiply appended tokens by this factor (1.0)")
    p.add_argument("--text", type=Path, help="text to draw token ids from (default: the package's corpus)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    for name in ("phase_boundary", "limit_sessions", "limit_turns"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    if a.scale <= 0:
        p.error(f"--scale must be positive, got {a.scale}")
    from ...runtime import load_model
    from ...runtime.workload import read_sessions, shrink_sessions
    from .record import record_profile

    sessions = read_sessions(a.sessions)[a.first_session:]
    sessions = shrink_sessions(sessions[: a.limit_sessions] if a.limit_sessions else sessions, a.scale,
                               a.limit_turns, a.max_generated)
    if not sessions:
        raise ProfileError(f"{a.sessions}: no sessions selected (check --first-session and --limit-sessions)")
    model = load_model(a.model)
    profile = record_profile(model, a.model, sessions, a.phase_boundary, a.seed, a.text, progress=not a.quiet)
    profile.save(a.output)
    print(f"wrote {a.output}: {len(sessions)} sessions, {profile.pass_tokens.numel()} forward passes, "
          f"{int(profile.counts.sum()):,d} routes")
    return 0


def _report(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile report",
                                description="How much of the routing a resident hot set covers, per layer and phase, "
                                            "in-sample and on held-out sessions; a table and a PNG plot.")
    p.add_argument("profile", type=Path)
    p.add_argument("--holdout", type=Path, help="a profile of other sessions, to measure the chosen hot set on")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-experts", type=int, help="hot experts per layer (default: a quarter of them)")
    g.add_argument("--hardware", help="hardware spec or preset: the hot set ostinato-compile would place (needs --model)")
    p.add_argument("--model", type=Path, help="checkpoint directory (with --hardware)")
    p.add_argument("--plot", type=Path, help="write the coverage plot here (PNG)")
    a = p.parse_args(argv)
    from .report import build_report, plot_report

    profile = load_profile(a.profile)
    holdout = load_profile(a.holdout) if a.holdout else None
    if holdout is not None:
        holdout.check_fits(profile.n_layers, profile.n_experts, profile.top_k, where=str(a.holdout))
    budget = a.budget_experts if a.budget_experts is not None else profile.n_experts // 4
    if a.hardware:
        if a.model is None:
            p.error("--hardware needs --model (the checkpoint the plan would be for)")
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
    from ..compile import CompileOptions, compile_plan

    plan = compile_plan(CompileOptions(model, Path("-"), hardware, profile=str(profile), build_kernels=False)).plan
    return round(sum(len(l.hot_experts) for l in plan.layers) / len(plan.layers))


def _merge(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile merge", description="Add up profiles of the same model.")
    p.add_argument("output", type=Path)
    p.add_argument("profiles", type=Path, nargs="+")
    a = p.parse_args(argv)
    from .merge import merge_profiles

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
    from .counts_io import import_counts

    cfg = ModelConfig.from_json(a.model)
    profile = import_counts(a.counts, cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok)
    profile.save(a.output)
    print(f"wrote {a.output}: {int(profile.counts.sum()):,d} routes")
    return 0


def _export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ostinato-profile export", description="Write a profile's counts as CSV.")
    p.add_argument("profile", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    a = p.parse_args(argv)
    from .counts_io import export_csv

    export_csv(load_profile(a.profile), a.output)
    print(f"wrote {a.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    handlers = {"report": _report, "merge": _merge, "import": _import, "export": _export}
    handler = handlers.get(argv[0]) if argv else None
    try:
        return handler(argv[1:]) if handler else _record(argv)
    except (ProfileError, CheckpointError, WorkloadError) as e:
        print(f"ostinato-profile: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
