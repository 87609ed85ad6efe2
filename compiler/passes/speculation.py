"""speculation: whether the plan decodes with the MTP block (policy.speculative).

Unless --speculative off, the memory and placement passes place the block beside the head (its dense part,
cache and hot experts on the last GPU, chosen from the profile's MTP row like any layer's; its cold experts
on the host), so the cost model prices its draft as placed. This pass keeps it where the cost model says
speculation pays (auto) or where it is forced (mtp); where it does not pay, the plan is placed again without
it (compile.py's re-plan loop), its memory going back to the layers' hot experts."""

from __future__ import annotations

from ostinato.plan import SpeculativePrediction

from ..cost_model import MTP_ACCEPTANCE
from .build import Build, mtp_counts
from .predictions import predictions_position, rounded

# The fewest measured drafts (a recorded profile's mtp_drafts) whose acceptance replaces the published one
# (MTP_ACCEPTANCE). A rate measured on n drafts has a standard error of at most 0.5 / sqrt(n): 5 points at
# 100, well inside the gap between the published 90% and where speculation stops paying (about 68% in
# docs/benchmarks.md), while a handful of drafts (a short test recording) could land anywhere by chance.
MIN_MEASURED_DRAFTS = 100


def speculation(b: Build) -> str | None:
    """From the cost model's price of a speculative step with the block as placed (--speculative auto), or
    as forced (mtp, off) -> why the placement passes run again (without the block), or None."""
    o, pl = b.options, b.placement
    if not b.has_mtp:
        b.speculative = _speculative(b, "")
        return None
    p = b.profile
    if p.mtp_drafts >= MIN_MEASURED_DRAFTS:
        b.notes.append(f"speculation is priced at the MTP block's draft acceptance measured on the routing profile: "
                       f"{_percent(p.mtp_acceptance)} ({p.mtp_agreed} of {p.mtp_drafts} depth-1 greedy drafts kept), "
                       f"not the published {MTP_ACCEPTANCE:.0%}")
    elif p.mtp_drafts:
        b.notes.append(f"the routing profile measured the MTP block's draft acceptance on only {p.mtp_drafts} drafts "
                       f"(fewer than {MIN_MEASURED_DRAFTS}): speculation is priced at the published "
                       f"{MTP_ACCEPTANCE:.0%}")
    if o.speculative == "off":
        b.speculative = _speculative(b, "; --speculative off: the plan leaves the MTP block out")
        return None
    if not b.mtp_placed:  # auto, and placement found no room for it
        b.speculative = _speculative(b, "; no room for the MTP block beside the head: the plan leaves it out "
                                        "(policy.speculative: off)")
        return None
    on = (f"the plan places the MTP block on {b.hardware.device_name(pl.layer_gpu[-1])} and decodes with it "
          f"(policy.speculative: mtp)")
    if o.speculative == "mtp":
        b.speculative = _speculative(b, f"; --speculative mtp: {on}")
    elif _speculative(b, "").pays:
        b.speculative = _speculative(b, f"; {on}")
    else:
        b.speculative = _speculative(b, "; the plan leaves the MTP block out (policy.speculative: off; "
                                        "--speculative mtp forces it)")
        b.mtp_placed = False
        return "without the MTP block"
    if mtp_counts(b) is None:
        b.notes.append("the routing profile has no row for the MTP block: its experts are all cold (record a "
                       "profile with ostinato-record to place the MTP block's experts)")
    return None


def _acceptance(b: Build) -> tuple[float, str]:
    """The draft acceptance speculation is priced at, and where it comes from: the profile's measured rate
    (ostinato-record: depth-1 greedy drafts kept) on at least MIN_MEASURED_DRAFTS drafts, else the
    published MTP_ACCEPTANCE ("90% until real weights say otherwise")."""
    p = b.profile
    if p is not None and p.mtp_drafts >= MIN_MEASURED_DRAFTS:
        return p.mtp_acceptance, f"measured on the profile's {p.mtp_drafts} drafts"
    if p is not None and p.mtp_drafts:
        return MTP_ACCEPTANCE, (f"the published figure; the profile's {p.mtp_drafts} measured drafts are fewer "
                                f"than {MIN_MEASURED_DRAFTS}")
    return MTP_ACCEPTANCE, "the published figure; the profile measured none"


def _percent(x: float) -> str:
    """90% as 90%, 0.5859% as 0.6%."""
    return f"{x:.0%}" if round(x * 100, 1) == round(x * 100) else f"{x:.1%}"


def _speculative(b: Build, then: str) -> SpeculativePrediction:
    """Does depth-1 MTP speculation pay here (cost_model.speculative_decode at the acceptance _acceptance
    gives: measured on the profile or published, at the position the plan's decode is priced) with the MTP
    block as now placed, and why; `then`: what the plan does about it (appended to the reason)."""
    a, source = _acceptance(b)
    if not b.has_mtp:
        return SpeculativePrediction(pays=False, acceptance=rounded(a), decode_tokens_per_s=None, gain=None,
                                     reason="the checkpoint has no MTP block (mtp.0.*) to draft with")
    plain, step = b.cost.speculative_decode(a, predictions_position(b))  # where the plan's decode is priced
    gain = step.tokens_per_s / plain
    parts = (f"a step of {step.tokens:.2f} tokens: draft {step.draft_s * 1e3:.3g} ms + 2-token verify "
             f"{step.verify_s * 1e3:.3g} ms + re-run on rejection {step.rerun_s * 1e3:.3g} ms, against "
             f"{1e3 / plain:.3g} ms a token decoding plainly")
    verdict = "pays" if gain > 1 else "does not pay"
    hot = len(b.placement.mtp_hot)
    experts = (f"{hot} of the MTP block's experts hot" if b.mtp_placed else "none of the MTP block's experts hot")
    return SpeculativePrediction(
        pays=gain > 1, acceptance=rounded(a), decode_tokens_per_s=rounded(step.tokens_per_s), gain=rounded(gain),
        reason=f"speculation {verdict} here: {gain:.2f}x decode at {_percent(a)} acceptance ({source}) with "
               f"{experts} ({parts})"
               + then)
