"""read_profile: the routing profile the hot sets are chosen from (a recorded file, a synthetic Zipf one, or
uniform routing), checked against the model's shape."""

from __future__ import annotations

from ..profile import load_profile, synthetic_profile, uniform_profile
from .build import Build
from .options import CompileError


def read_profile(b: Build) -> None:
    cfg, spec = b.config, b.options.profile
    if spec is None:
        b.profile = uniform_profile(cfg)
        b.notes.append("no routing profile given: planned from UNIFORM routing (every expert equally likely); "
                       "record one with ostinato-record for a useful hot set")
    elif spec.startswith("synthetic"):
        b.profile = synthetic_profile(cfg, alpha=synthetic_alpha(spec))
        b.notes.append(f"SYNTHETIC routing profile ({b.profile.source}); real routing was not measured")
    else:
        b.profile = load_profile(spec)
    b.profile.check_fits(cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok, where=str(spec))


def synthetic_alpha(spec: str) -> float:
    """ALPHA of a `synthetic[:ALPHA]` profile spec (1.0 when omitted)."""
    text = spec.split(":", 1)[1] if ":" in spec else "1.0"
    try:
        alpha = float(text)
    except ValueError:
        alpha = float("nan")
    if not alpha >= 0 or alpha == float("inf"):
        raise CompileError(f"--profile {spec}: ALPHA must be a number >= 0 (the Zipf exponent), got {text!r}")
    return alpha
