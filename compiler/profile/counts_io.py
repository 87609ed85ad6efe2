"""Plain route counts in and out: CSV (layer,expert,phase,count) or NPZ, for profiles from other engines.

CSV: a header line `layer,expert,phase,count`, then one row per non-zero count; `phase` is a
name from PHASES. NPZ: either a dense `counts` array [L, 3, E], or four equal-length arrays
`layer`, `expert`, `phase` (index or name), `count`. The model's shape must be given: counts
alone cannot say how many experts have none. Layers L..L+M-1 are the model's MTP blocks (as a
profile numbers them, ostinato/profile_format.py): a file with rows for them gives a profile with MTP
rows, a file without gives one without (not rows of zeros: the compiler must know they were not counted).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from ostinato.profile_format import PHASES, ProfileError, RoutingProfile

CSV_COLUMNS = ["layer", "expert", "phase", "count"]


def export_csv(profile: RoutingProfile, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for layer, phase, expert in torch.nonzero(profile.counts).tolist():
            w.writerow([layer, expert, PHASES[phase], int(profile.counts[layer, phase, expert])])


def import_counts(path: str | Path, n_layers: int, n_experts: int, top_k: int,
                  phase_boundary: int = 0, mtp_layers: int = 0) -> RoutingProfile:
    """`mtp_layers`: the model's MTP blocks (its config's num_nextn_predict_layers), rows the file may have."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: file not found")
    rows_allowed = n_layers + mtp_layers
    counts = torch.zeros(rows_allowed, len(PHASES), n_experts, dtype=torch.int64)
    if path.suffix == ".npz":
        rows = _npz_rows(path, counts, mtp_layers)
    elif path.suffix == ".csv":
        rows = _csv_rows(path)
    else:
        raise ProfileError(f"{path}: unknown counts format '{path.suffix}' (use .csv or .npz)")
    mtp_seen = False
    for line, (layer, expert, phase, count) in rows:
        where = f"{path}:{line}"
        if not 0 <= layer < rows_allowed:
            raise ProfileError(f"{where}: field 'layer' is {layer}; the model has {n_layers} layers"
                               + (f" and {mtp_layers} MTP block(s) (layers {n_layers}..{rows_allowed - 1})"
                                  if mtp_layers else ""))
        mtp_seen |= layer >= n_layers
        if not 0 <= expert < n_experts:
            raise ProfileError(f"{where}: field 'expert' is {expert}; the model has {n_experts} experts")
        if count < 0:
            raise ProfileError(f"{where}: field 'count' is negative ({count})")
        counts[layer, phase, expert] += count
    M = mtp_layers if mtp_seen else 0
    return RoutingProfile(counts=counts[: n_layers + M], top_k=top_k, phase_boundary=phase_boundary,
                          source=f"import {path.name}", mtp_layers=M)


def _phase_index(value: object, where: str) -> int:
    if isinstance(value, str) and value in PHASES:
        return PHASES.index(value)
    try:
        i = int(value)
    except (TypeError, ValueError):
        i = -1
    if not 0 <= i < len(PHASES):
        raise ProfileError(f"{where}: field 'phase' is {value!r}; allowed: {list(PHASES)}")
    return i


def _csv_rows(path: Path):
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != CSV_COLUMNS:
            raise ProfileError(f"{path}:1: header must be {','.join(CSV_COLUMNS)}, got {header}")
        for line, row in enumerate(reader, start=2):
            if len(row) != 4:
                raise ProfileError(f"{path}:{line}: expected 4 fields, got {len(row)}")
            try:
                layer, expert, count = int(row[0]), int(row[1]), int(row[3])
            except ValueError:
                raise ProfileError(f"{path}:{line}: layer, expert and count must be integers: {row}") from None
            yield line, (layer, expert, _phase_index(row[2].strip(), f"{path}:{line}"), count)


def _npz_rows(path: Path, counts: torch.Tensor, mtp_layers: int):
    data = np.load(path, allow_pickle=False)
    if "counts" in data:
        dense = data["counts"]
        shapes = [(n, *counts.shape[1:]) for n in sorted({counts.shape[0], counts.shape[0] - mtp_layers})]
        if tuple(dense.shape) not in shapes:
            raise ProfileError(f"{path}: array 'counts' has shape {list(dense.shape)}, the model needs "
                               f"{' or '.join(str(list(s)) for s in shapes)} [layers (+ MTP blocks), phases, experts]")
        for (layer, phase, expert) in zip(*np.nonzero(dense)):
            yield (f"counts[{layer},{phase},{expert}]",
                   (int(layer), int(expert), int(phase), int(dense[layer, phase, expert])))
        return
    missing = [k for k in CSV_COLUMNS if k not in data]
    if missing:
        raise ProfileError(f"{path}: array '{missing[0]}' is missing (need 'counts' or {CSV_COLUMNS})")
    n = len(data["layer"])
    for i in range(n):
        yield f"row {i}", (int(data["layer"][i]), int(data["expert"][i]),
                           _phase_index(data["phase"][i].item(), f"{path}: row {i}"), int(data["count"][i]))
