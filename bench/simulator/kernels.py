"""Each system's CPU expert kernel, priced by its own measured speed relative to Ostinato's.

The cost model's host rates describe Ostinato's generated kernel (calibrated with ostinato-calibrate
or taken from the spec). A baseline's host expert time is that time times its kernel's slowdown at the
layer's tokens per expert: time per expert of its kernel over Ostinato's, measured side by side in one
run (bench/cpu_experts.py --kernels-out) at a few token counts and interpolated in log(tokens)
between them (the end values beyond). The same rule scales every system to the hardware spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

KERNELS_FILE = Path(__file__).resolve().parents[1] / "measured" / "cpu_expert_kernels.yaml"
OURS = "ostinato"


@dataclass(frozen=True)
class KernelSpeeds:
    tokens: tuple[int, ...]           # tokens per expert of the measurements, ascending
    ms: dict[str, tuple[float, ...]]  # system -> ms per expert at each token count
    source: str                       # where and how they were measured

    def slowdown(self, system: str, tokens_per_expert: float) -> float:
        """Time per expert of `system`'s kernel over Ostinato's at `tokens_per_expert` (1.0 for Ostinato)."""
        ratios = [a / b for a, b in zip(self.ms[system], self.ms[OURS])]
        x = math.log(max(tokens_per_expert, 1.0))
        xs = [math.log(t) for t in self.tokens]
        if x <= xs[0]:
            return ratios[0]
        for (x0, r0), (x1, r1) in zip(zip(xs, ratios), zip(xs[1:], ratios[1:])):
            if x <= x1:
                return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
        return ratios[-1]

    def of(self, system: str):
        """slowdown(system, .) as a one-argument function (what CostModel.with_host_kernel takes)."""
        if system not in self.ms:
            raise KeyError(f"{system!r} has no kernel measurement; measured: {sorted(self.ms)}")
        return lambda tokens_per_expert: self.slowdown(system, tokens_per_expert)


def load_kernel_speeds(path: Path = KERNELS_FILE) -> KernelSpeeds:
    data = yaml.safe_load(Path(path).read_text())
    tokens = tuple(int(t) for t in data["tokens"])
    ms = {name: tuple(float(v) for v in row) for name, row in data["ms"].items()}
    bad = [name for name, row in ms.items() if len(row) != len(tokens) or min(row) <= 0]
    if OURS not in ms or bad or list(tokens) != sorted(set(tokens)):
        raise ValueError(f"{path}: needs ascending 'tokens' and, under 'ms', an '{OURS}' row and one positive "
                         f"value per token count in every row (bad: {bad})")
    return KernelSpeeds(tokens, ms, str(data.get("source", "")))
