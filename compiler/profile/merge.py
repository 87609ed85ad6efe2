"""Merging profiles: counts add up, recorded passes concatenate, sessions are listed once each; the MTP
block's measured drafts and agreements add up too (a profile that measured none adds nothing). Profiles
merge only with the same rows: an MTP row recorded for some sessions only would misstate its routes."""

from __future__ import annotations

import torch

from ostinato.profile_format import ProfileError, RoutingProfile


def merge_profiles(profiles: list[RoutingProfile]) -> RoutingProfile:
    if not profiles:
        raise ProfileError("nothing to merge")
    first = profiles[0]
    for i, p in enumerate(profiles[1:], start=1):
        for name in ("n_layers", "n_experts", "top_k", "phase_boundary", "mtp_layers"):
            if getattr(p, name) != getattr(first, name):
                raise ProfileError(f"profile {i}: field '{name}' is {getattr(p, name)}, profile 0 has "
                                   f"{getattr(first, name)}: profiles of different models or phase boundaries "
                                   "cannot be merged, nor one with the MTP block's routes (mtp_layers) and one "
                                   "without")
    fingerprints = {p.model_fingerprint for p in profiles}
    sessions: list[str] = []
    for p in profiles:
        sessions += [s for s in p.sessions if s not in sessions]
    return RoutingProfile(
        counts=torch.stack([p.counts for p in profiles]).sum(0),
        top_k=first.top_k, phase_boundary=first.phase_boundary,
        source="merge(" + ", ".join(p.source for p in profiles) + ")",
        model_fingerprint=first.model_fingerprint if len(fingerprints) == 1 else "",
        sessions=tuple(sessions),
        pass_tokens=torch.cat([p.pass_tokens for p in profiles]),
        pass_phase=torch.cat([p.pass_phase for p in profiles]),
        pass_touched=torch.cat([p.pass_touched for p in profiles]), mtp_layers=first.mtp_layers,
        mtp_drafts=sum(p.mtp_drafts for p in profiles), mtp_agreed=sum(p.mtp_agreed for p in profiles))
