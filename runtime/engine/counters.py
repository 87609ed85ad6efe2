"""Counters of the placement executor: what every forward routed where, and how long each part took."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Counters:
    forwards: int = 0            # layer-forwards executed (one per layer per model forward)
    routes_hot: int = 0          # routes computed on the layer's device from its resident hot pool
    routes_cold: int = 0         # routes to non-resident experts (CPU in split/decode, GPU after upload)
    distinct_cold: int = 0       # distinct cold experts touched, summed over layer-forwards
    experts_uploaded: int = 0    # cold experts copied to the device (upload-once mode)
    bytes_uploaded: int = 0
    hot_s: float = 0.0           # time of the hot part: GPU time on a GPU (CUDA events, span_timer.py), else wall
    cold_s: float = 0.0          # wall time of the CPU cold part (overlaps hot_s in split mode)
    upload_s: float = 0.0        # time of copies into staging buffers: GPU time on a GPU, else wall
    decode_step_s: float = 0.0   # wall time of fixed-shape steps: decode and prefill buckets (hot and cold
                                 # parts not separable)

    def copy(self) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) for f in fields(self)})

    def minus(self, earlier: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    @property
    def routes(self) -> int:
        return self.routes_hot + self.routes_cold

    @property
    def hot_share(self) -> float:
        return self.routes_hot / self.routes if self.routes else 0.0
