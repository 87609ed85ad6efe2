"""The paper's abstract claims (arXiv 2611.11533; shared as PUBLISHED.md's "The paper") beside the model's direction.

Each claim is one published row of plans/published/ whose figure is a ratio between two systems; the paper states
which side of 1 it falls on (e.g. layer placement waits less than the expert cache: below 1). The model is right
on a claim when its whole band lies on that side, and the table says so beside its figure and the paper's. Where
it is wrong, the row's `why_off` is the cited reason (it names the source that shows the limit). The magnitude is
scored separately, in the validation table (bench/validate.py band_ratio); a claim here is a direction only.

bench/validate.py writes the table with --doc between CLAIMS_BEGIN and CLAIMS_END, and a one-line summary
(claims_summary) between README_BEGIN and README_END with --readme.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CLAIMS_BEGIN = "<!-- paper claims: written by python -m ostinato.bench.validate --doc; do not edit -->"
CLAIMS_END = "<!-- end of the paper claims -->"
README_BEGIN = "<!-- paper claims summary: written by python -m ostinato.bench.validate --readme; do not edit -->"
README_END = "<!-- end of the paper claims summary -->"


@dataclass(frozen=True)
class Claim:
    row: str                                  # the published row (plans/published/<row>.yaml) it is priced by
    claim: str                                # the abstract's claim, in short
    ratio: str                                # what the row's figure divides, so the direction reads plainly
    side: Literal["below 1", "above 1"]       # where the paper puts the ratio


CLAIMS = (
    Claim("paper-llamacpp-layers-wait", "llama.cpp's layer placement shortens the expert cache's wait",
          "layers' median wait / the cache's", "below 1"),
    Claim("paper-llamacpp-layers-decode", "layer placement decodes 1.5-1.6x slower than the expert cache",
          "the cache's decode tok/s / layers'", "above 1"),
    Claim("paper-ostinato-wait", "Ostinato cuts the median wait after a tool output by 22-55% against llama.cpp "
          "and KTransformers", "Ostinato's median wait / each baseline's", "below 1"),
    Claim("paper-ostinato-sessions", "Ostinato finishes sessions 1.4-2.5x sooner, every session sooner than all "
          "six baselines", "each baseline's median session / Ostinato's", "above 1"),
)


def direction_right(side: str, model: tuple[float, float]) -> bool:
    """The model's whole band [lo, hi] lies on the paper's side of 1."""
    lo, hi = model
    if side == "below 1":
        return hi < 1.0
    if side == "above 1":
        return lo > 1.0
    raise ValueError(f"side {side!r}: 'below 1' or 'above 1'")


def _band(model: tuple[float, float]) -> str:
    lo, hi = model
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"


def _published(value) -> str:
    if isinstance(value, list):
        return f"{value[0]:.3g}-{value[1]:.3g}"
    below = getattr(value, "below", None)
    return f"< {below:.3g}" if below is not None else f"{value:.3g}"


@dataclass(frozen=True)
class ClaimVerdict:
    claim: Claim
    model: tuple[float, float]
    right: bool
    within: bool          # the magnitude, by the validation table's score
    why: str              # the row's why_off: the cited reason where the model misses it


def verdicts(rows: dict, model_bands: dict, within: dict) -> list[ClaimVerdict]:
    """One verdict per claim whose row is among `rows` (row id -> bench/published.py Row); `model_bands` and
    `within`: the validation's model band and within-1.5x flag per row id."""
    return [ClaimVerdict(c, model_bands[c.row], direction_right(c.side, model_bands[c.row]), within[c.row],
                         rows[c.row].why_off)
            for c in CLAIMS if c.row in rows]


def claims_table(rows: dict, found: list[ClaimVerdict]) -> str:
    out = ["| the paper's claim | ratio | paper | model | direction | magnitude (validation table) | "
           "where the model differs, and why |", "|---|---|---|---|---|---|---|"]
    for v in found:
        c = v.claim
        direction = f"right ({c.side})" if v.right else f"**wrong** (the paper: {c.side})"
        magnitude = "within 1.5x" if v.within else "off by more than 1.5x"
        why = v.why if (v.why and not (v.right and v.within)) else ""
        out.append(f"| {c.claim} ([{c.row}](../plans/published/{c.row}.yaml)) | {c.ratio} | "
                   f"{_published(rows[c.row].value)} | {_band(v.model)} | {direction} | {magnitude} | {why} |")
    out.append("")
    out.append(claims_summary(found))
    return "\n".join(out)


def claims_summary(found: list[ClaimVerdict]) -> str:
    right = sum(v.right for v in found)
    wrong = [v.claim.row for v in found if not v.right]
    line = (f"The model's direction is right on {right} of {len(found)} of the paper's abstract claims "
            f"(layer placement against the expert cache on wait and on decode, Ostinato's wait cut, sessions "
            f"sooner); {sum(v.within for v in found)} of them also within 1.5x of the paper's figure.")
    if wrong:
        line += f" Wrong: {', '.join(wrong)} (docs/validation.md gives the cited reason)."
    return line
