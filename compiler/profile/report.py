"""The hot-set stability report: how much of the routing a resident hot set covers, in-sample and held out.

A hot set is chosen per layer on one profile (the k experts with the most routes in the planning
phases, as ostinato-compile does) and its coverage (share of routes landing in it) is measured
per phase on the same profile (in-sample) and on another one recorded from other sessions
(held out). Coverage is averaged over layers weighted by routes, i.e. the share of all routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ostinato.profile_format import PHASES, RoutingProfile

PLANNING_PHASES = ("decode", "short_prefill")


def top_k_mask(profile: RoutingProfile, k: int, phases: tuple[str, ...] = PLANNING_PHASES) -> torch.Tensor:
    """[L, E] bool: each layer's k most-routed experts (ties: lower expert id first)."""
    counts = profile.phase_counts(phases)                                   # [L, E]
    E = counts.shape[1]
    key = counts.double() * (E + 1) - torch.arange(E, dtype=torch.float64)  # count desc, id asc
    mask = torch.zeros_like(counts, dtype=torch.bool)
    if k > 0:
        mask.scatter_(1, key.topk(min(k, E), dim=1).indices, True)
    return mask


def coverage(profile: RoutingProfile, hot: torch.Tensor, phase: str) -> float | None:
    """Share of `phase` routes in `profile` that land on `hot` experts (None: no routes in that phase)."""
    counts = profile.phase_counts((phase,))
    total = int(counts.sum())
    return float(counts[hot].sum()) / total if total else None


def layer_coverage(profile: RoutingProfile, hot: torch.Tensor, phases: tuple[str, ...]) -> list[float | None]:
    counts = profile.phase_counts(phases)
    return [float(counts[l][hot[l]].sum()) / float(counts[l].sum()) if counts[l].sum() else None
            for l in range(profile.n_layers)]


def cold_distinct_per_short_prefill(profile: RoutingProfile, hot: torch.Tensor) -> dict | None:
    """Distinct cold experts (summed over layers) a recorded short prefill touched: median, p90, tokens."""
    short = profile.pass_phase == PHASES.index("short_prefill")
    if not short.any():
        return None
    touched = profile.touched()[short]                                       # [P, L, E]
    cold = (touched & ~hot).sum(dim=(1, 2)).double().numpy()                 # [P]
    per_layer = (touched & ~hot).sum(-1).double().mean(-1).numpy()           # [P]
    return {"passes": int(short.sum()), "median_tokens": float(np.median(profile.pass_tokens[short].numpy())),
            "median_cold": float(np.median(cold)), "p90_cold": float(np.percentile(cold, 90)),
            "median_cold_per_layer": float(np.median(per_layer))}


@dataclass(frozen=True)
class Report:
    ks: list
    rows: list            # per k: {phase: (in_sample, held_out)}
    budget: int
    layers: list          # per layer at the budget: (in_sample, held_out)
    cold: dict | None
    text: str


def build_report(profile: RoutingProfile, holdout: RoutingProfile | None, budget: int) -> Report:
    E = profile.n_experts
    ks = sorted({max(1, E * f // 32) for f in (1, 2, 4, 8, 12, 16, 20, 24, 28)} | {budget})
    rows = []
    for k in ks:
        hot = top_k_mask(profile, k)
        rows.append({p: (coverage(profile, hot, p), coverage(holdout, hot, p) if holdout else None) for p in PHASES})
    hot = top_k_mask(profile, budget)
    ins = layer_coverage(profile, hot, PLANNING_PHASES)
    out = layer_coverage(holdout, hot, PLANNING_PHASES) if holdout else [None] * len(ins)
    cold = cold_distinct_per_short_prefill(holdout or profile, hot)
    text = _format(profile, holdout, ks, rows, budget, list(zip(ins, out)), cold)
    return Report(ks, rows, budget, list(zip(ins, out)), cold, text)


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{100 * x:5.1f}%"


def _format(profile, holdout, ks, rows, budget, layers, cold) -> str:
    E = profile.n_experts
    lines = [f"routing profile: {profile.source}; {profile.n_layers} layers x {E} experts, top-{profile.top_k}",
             f"sessions: {len(profile.sessions)} in-sample" + (f", {len(holdout.sessions)} held out" if holdout else
                                                                 " (no --holdout: in-sample only)"),
             "hot set per layer = its k most-routed experts in the planning phases (decode + short prefill)", "",
             "share of routes on the hot set (in-sample | held out)",
             "   k  " + "".join(f"{p:>22s}" for p in PHASES)]
    for k, row in zip(ks, rows):
        mark = "  <- budget" if k == budget else ""
        lines.append(f"{k:4d}  " + "".join(f"      {_pct(a)} | {_pct(b)}" for a, b in (row[p] for p in PHASES)) + mark)
    uniform = profile.top_k / E
    lines += ["", f"(uniform routing would give k/{E}: {_pct(budget / E)} at k = {budget}; top-{profile.top_k} of {E} "
                  f"means each expert sees {uniform:.1%} of tokens)", "",
              f"per layer at k = {budget} (decode + short prefill): in-sample | held out"]
    for l, (a, b) in enumerate(layers):
        lines.append(f"  layer {l:3d}  {_pct(a)} | {_pct(b)}")
    lines.append("")
    if cold is None:
        lines.append("distinct cold experts per short prefill: n/a (the profile has no recorded short prefills)")
    else:
        lines.append(f"distinct cold experts per short prefill at k = {budget} ({cold['passes']} passes, median "
                     f"{cold['median_tokens']:.0f} tokens): median {cold['median_cold']:.0f} over all layers "
                     f"({cold['median_cold_per_layer']:.1f} per layer), p90 {cold['p90_cold']:.0f}")
    if profile.mtp_acceptance is not None:
        lines.append(f"MTP draft acceptance (depth 1, greedy): {profile.mtp_acceptance:.1%} ({profile.mtp_agreed} of "
                     f"{profile.mtp_drafts} decode-step drafts equal to the model's own pick)")
    elif profile.mtp_layers:
        lines.append("MTP draft acceptance: not measured (ostinato-compile assumes the published figure)")
    return "\n".join(lines)


def plot_report(report: Report, profile: RoutingProfile, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colors = {"decode": "tab:blue", "short_prefill": "tab:orange", "long_prefill": "tab:green"}
    for phase in PHASES:
        ins = [r[phase][0] for r in report.rows]
        if all(v is None for v in ins):
            continue
        ax.plot(report.ks, [100 * (v or 0) for v in ins], "-o", ms=3, color=colors[phase], label=f"{phase} in-sample")
        out = [r[phase][1] for r in report.rows]
        if any(v is not None for v in out):
            ax.plot(report.ks, [100 * (v or 0) for v in out], "--s", ms=3, color=colors[phase],
                    label=f"{phase} held out")
    E = profile.n_experts
    ax.plot([0, E], [0, 100], ":", color="gray", label="uniform routing")
    ax.axvline(report.budget, color="black", lw=0.8)
    ax.set_xlabel(f"hot experts per layer (of {E})")
    ax.set_ylabel("routes on the hot set (%)")
    ax.set_xlim(0, E)
    ax.set_ylim(0, 100)
    ax.set_title("hot-set coverage", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
