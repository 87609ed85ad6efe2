"""The routing profile: per layer and expert, route counts by phase, stored as safetensors.

Tensors (L layers, M MTP blocks, E experts, P forward passes):
  counts         int64 [L+M, 3, E]  routes per phase (PHASES order) and expert
  pass_tokens    int64 [P]          tokens of each recorded forward pass
  pass_phase     int64 [P]          its phase (index into PHASES)
  pass_touched   uint8 [P, L+M, B]  which experts it touched per layer, as bits (B = ceil(E/8) bytes,
                                    expert e is bit e % 8 of byte e // 8); distinct counts derive from it
Metadata (strings): format, version, model fingerprint and hashes, n_layers, n_experts, top_k,
phase_boundary (a prefill of more tokens than this is "long"), source, sessions (JSON list), and in
version 2 mtp_layers (M) and, when the recording measured it, mtp_drafts and mtp_agreed (below).

Version 2 (M > 0): rows L..L+M-1 are the MTP blocks' routes (block K is layer L + K, as the runtime's
routing observer numbers it), recorded by ostinato-record when the checkpoint has the block: it follows
the prompt and every decoded token as speculative decoding runs it. `n_layers` stays the main model's
count, and everything that reads the main layers (phase_counts, touched, reports) sees them alone; the
compiler places the MTP block's hot experts from `mtp_counts`. A profile without MTP rows is written as
version 1, byte for byte as before, and version 1 files load as profiles without them (M = 0): the
compiler then gives the MTP block no hot experts and says so.

The MTP block's draft acceptance (version 2, metadata `mtp_drafts` and `mtp_agreed`, decimal counts,
written only when mtp_drafts > 0): at every decode step of the recorded sessions, the MTP block's greedy
draft for the next position (the argmax of its logits from the pair (streams of the token before, the
token decoded)) was compared with the main model's own greedy pick there, teacher-forced along the
recorded greedy path: `mtp_drafts` drafts, `mtp_agreed` of them equal, i.e. kept by depth-1 greedy
speculative decoding. Prompts are not counted (their tokens are not the model's picks). Merging adds
the counts; imported, synthetic and uniform profiles have none, and the compiler then assumes the
published acceptance (compiler/cost_model/speculation.py, MTP_ACCEPTANCE).

A profile made elsewhere (another engine, a synthetic generator) has no passes (P = 0) and may
have no fingerprint; its shape must still match the model it is used for.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

PHASES = ("decode", "short_prefill", "long_prefill")
FORMAT = "ostinato-routing-profile"
VERSION = "1"          # written for profiles without MTP rows (and read)
MTP_VERSION = "2"      # written for profiles with them: readers of version 1 refuse them by name
READS = (VERSION, MTP_VERSION)


class ProfileError(ValueError):
    """A profile file is malformed or does not fit the model; the message names the file and field."""


@dataclass(frozen=True)
class RoutingProfile:
    counts: torch.Tensor                 # int64 [L+M, 3, E]
    top_k: int
    phase_boundary: int
    source: str
    model_fingerprint: str = ""
    sessions: tuple[str, ...] = ()
    pass_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    pass_phase: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    pass_touched: torch.Tensor | None = None
    mtp_layers: int = 0                  # M: the last M rows of counts and pass_touched are MTP blocks
    mtp_drafts: int = 0                  # depth-1 greedy drafts the recording checked (0: not measured)
    mtp_agreed: int = 0                  # of them, equal to the main model's own pick (kept)

    def __post_init__(self) -> None:
        if self.counts.dim() != 3 or self.counts.shape[1] != len(PHASES) or self.counts.dtype != torch.int64:
            raise ProfileError(f"counts must be int64 [layers, {len(PHASES)}, experts], got "
                               f"{self.counts.dtype} {list(self.counts.shape)}")
        if self.mtp_layers < 0 or (self.mtp_layers and self.mtp_layers >= self.counts.shape[0]):
            raise ProfileError(f"field 'mtp_layers' is {self.mtp_layers}: between 0 and the counts' "
                               f"{self.counts.shape[0]} rows less one")
        if not 0 <= self.mtp_agreed <= self.mtp_drafts:
            raise ProfileError(f"fields 'mtp_agreed' ({self.mtp_agreed}) and 'mtp_drafts' ({self.mtp_drafts}): "
                               "the agreed drafts must be between 0 and the drafts")
        if self.mtp_drafts and not self.mtp_layers:
            raise ProfileError(f"field 'mtp_drafts' is {self.mtp_drafts} but the profile has no MTP rows "
                               "(mtp_layers 0): drafts come from the MTP block")
        if (self.counts < 0).any():
            raise ProfileError("counts must be non-negative")
        rows = self.counts.shape[0]
        if self.pass_touched is None:
            object.__setattr__(self, "pass_touched",
                               torch.zeros(0, rows, (self.n_experts + 7) // 8, dtype=torch.uint8))
        P = self.pass_tokens.numel()
        if self.pass_phase.numel() != P or self.pass_touched.shape != (P, rows, (self.n_experts + 7) // 8):
            raise ProfileError(f"per-pass tensors disagree: {P} pass_tokens, {self.pass_phase.numel()} pass_phase, "
                               f"pass_touched {list(self.pass_touched.shape)}")

    @property
    def n_layers(self) -> int:
        """The main model's layers (the MTP rows not included)."""
        return self.counts.shape[0] - self.mtp_layers

    @property
    def n_experts(self) -> int:
        return self.counts.shape[2]

    def phase_counts(self, phases: tuple[str, ...]) -> torch.Tensor:
        """[L, E] the main layers' routes summed over the given phases."""
        idx = [PHASES.index(p) for p in phases]
        return self.counts[: self.n_layers, idx, :].sum(dim=1)

    @property
    def mtp_acceptance(self) -> float | None:
        """The measured share of the MTP block's greedy drafts the main model agreed with; None: not measured."""
        return self.mtp_agreed / self.mtp_drafts if self.mtp_drafts else None

    def mtp_counts(self, phases: tuple[str, ...], k: int = 0) -> torch.Tensor | None:
        """[E] MTP block k's routes summed over the given phases; None when the profile has no row for it."""
        if k >= self.mtp_layers:
            return None
        idx = [PHASES.index(p) for p in phases]
        return self.counts[self.n_layers + k, idx, :].sum(dim=0)

    def touched(self) -> torch.Tensor:
        """[P, L, E] bool: the experts each recorded forward pass touched in the main layers."""
        packed = self.pass_touched[:, : self.n_layers]
        bits = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [P, L, B, 8]
        return bits.reshape(*packed.shape[:2], -1)[..., : self.n_experts].bool()

    @property
    def pass_distinct(self) -> torch.Tensor:
        """[P, L] int64: distinct experts touched per pass and layer."""
        return self.touched().sum(-1)

    def check_fits(self, n_layers: int, n_experts: int, top_k: int, where: str = "profile") -> None:
        for name, mine, model in (("n_layers", self.n_layers, n_layers), ("n_experts", self.n_experts, n_experts),
                                  ("top_k", self.top_k, top_k)):
            if mine != model:
                raise ProfileError(f"{where}: field '{name}' is {mine} but the model has {model}: "
                                   "this profile was recorded for another model")

    # ----- storage ------------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        return {"counts": self.counts.contiguous(), "pass_tokens": self.pass_tokens.contiguous(),
                "pass_phase": self.pass_phase.contiguous(), "pass_touched": self.pass_touched.contiguous()}

    def metadata(self) -> dict[str, str]:
        meta = {"format": FORMAT, "version": MTP_VERSION if self.mtp_layers else VERSION,
                "n_layers": str(self.n_layers), "n_experts": str(self.n_experts), "top_k": str(self.top_k),
                "phase_boundary": str(self.phase_boundary), "source": self.source,
                "model_fingerprint": self.model_fingerprint, "sessions": json.dumps(list(self.sessions))}
        if self.mtp_layers:  # version 1's metadata (and hash) unchanged for profiles without MTP rows
            meta["mtp_layers"] = str(self.mtp_layers)
        if self.mtp_drafts:  # version 2 only (drafts need the MTP row); absent when not measured
            meta["mtp_drafts"], meta["mtp_agreed"] = str(self.mtp_drafts), str(self.mtp_agreed)
        return meta

    def sha256(self) -> str:
        """Content hash: the tensors and metadata, independent of file layout."""
        h = hashlib.sha256(json.dumps(self.metadata(), sort_keys=True).encode())
        for name, t in sorted(self.tensors().items()):
            h.update(name.encode())
            h.update(t.numpy().tobytes())
        return h.hexdigest()

    def save(self, path: str | Path) -> Path:
        """Write atomically: a reader sees the old file or the whole new one, never a partial one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            save_file(self.tensors(), tmp, metadata=self.metadata())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def load_profile(path: str | Path) -> RoutingProfile:
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: profile file not found")
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(n)).get("__metadata__", {})
    except (SafetensorError, json.JSONDecodeError, OSError) as e:
        raise ProfileError(f"{path}: not a safetensors profile ({e})") from None
    if meta.get("format") != FORMAT:
        raise ProfileError(f"{path}: field 'format' is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") not in READS:
        raise ProfileError(f"{path}: field 'version' is {meta.get('version')!r}; this Ostinato reads "
                           f"{' and '.join(map(repr, READS))}")
    v2 = meta["version"] == MTP_VERSION
    mtp = {}
    for name in ("mtp_layers", "mtp_drafts", "mtp_agreed"):
        try:
            mtp[name] = int(meta.get(name, "0")) if v2 else 0
        except ValueError:
            raise ProfileError(f"{path}: field '{name}' is {meta.get(name)!r}, not a count") from None
    for name in ("counts", "pass_tokens", "pass_phase", "pass_touched"):
        if name not in tensors:
            raise ProfileError(f"{path}: tensor '{name}' is missing")
    try:
        profile = RoutingProfile(counts=tensors["counts"], top_k=int(meta["top_k"]),
                                 phase_boundary=int(meta["phase_boundary"]), source=meta.get("source", ""),
                                 model_fingerprint=meta.get("model_fingerprint", ""),
                                 sessions=tuple(json.loads(meta.get("sessions", "[]"))),
                                 pass_tokens=tensors["pass_tokens"], pass_phase=tensors["pass_phase"],
                                 pass_touched=tensors["pass_touched"], **mtp)
    except (KeyError, ValueError) as e:  # ProfileError is a ValueError: re-raised with the file name
        raise ProfileError(f"{path}: {e}") from None
    for name, value in (("n_layers", profile.n_layers), ("n_experts", profile.n_experts)):
        if meta.get(name) != str(value):
            raise ProfileError(f"{path}: field '{name}' ({meta.get(name)}) disagrees with the counts tensor ({value})")
    return profile


def pack_touched(mask: torch.Tensor) -> torch.Tensor:
    """[..., E] bool -> [..., ceil(E/8)] uint8 bits (expert e = bit e % 8 of byte e // 8)."""
    E = mask.shape[-1]
    padded = torch.zeros(*mask.shape[:-1], (E + 7) // 8 * 8, dtype=torch.uint8)
    padded[..., :E] = mask.to(torch.uint8)
    weights = (1 << torch.arange(8, dtype=torch.int32)).to(torch.uint8)
    return (padded.reshape(*mask.shape[:-1], -1, 8) * weights).sum(-1, dtype=torch.int32).to(torch.uint8)
