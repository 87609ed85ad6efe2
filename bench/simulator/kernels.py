"""Each system's CPU expert kernel as measured side by side, for the cost model's scaling rule.

bench/measured/cpu_expert_kernels.yaml (python -m ostinato.bench.kernel_side_by_side) holds, per system,
the bytes of expert weights per second per computing thread in whole-layer calls of V4-Flash's 256
experts with top-6 routing, at several tokens per expert, with the run's read bandwidth. The cost model
scales them to a host by one rule (compiler/host_kernel.py): per-core rate x the host's cores (less those
the system reserves), capped by the host's expert read bandwidth. Ostinato's own row prices Ostinato in
the simulator too, so every system is scaled the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ostinato.compiler.host_kernel import KernelRates

KERNELS_FILE = Path(__file__).resolve().parents[1] / "measured" / "cpu_expert_kernels.yaml"
OURS = "ostinato"


@dataclass(frozen=True)
class KernelTable:
    systems: dict[str, KernelRates]   # system -> its measured per-core rates
    read_bandwidth: float             # bytes/s, the run's streaming read with all its cores
    cores: int                        # cores of the measuring machine
    source: str                       # where and how they were measured

    def of(self, system: str) -> KernelRates:
        if system not in self.systems:
            raise KeyError(f"{system!r} has no kernel measurement; measured: {sorted(self.systems)}")
        return self.systems[system]


def load_kernel_table(path: Path = KERNELS_FILE) -> KernelTable:
    """The side-by-side table; errors name the file and what is wrong."""
    data = yaml.safe_load(Path(path).read_text())
    try:
        tokens = tuple(float(t) for t in data["tokens_per_expert"])
        systems = {name: KernelRates(name, tokens, tuple(float(v) for v in row["per_core"]),
                                     int(row.get("reserved_cores", 0)), str(row.get("driven", "")))
                   for name, row in data["systems"].items()}
        table = KernelTable(systems, float(data["read_bandwidth"]), int(data["cores"]), str(data.get("source", "")))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a kernel table (needs tokens_per_expert, read_bandwidth, cores and, under "
                         f"systems, per_core rows with one rate per token count): {type(e).__name__}: {e}") from None
    if OURS not in systems:
        raise ValueError(f"{path}: needs an '{OURS}' row under systems (has {sorted(systems)})")
    return table
