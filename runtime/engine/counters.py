"""Counters of the placement executor: what every forward routed where, and how long each part took.

Some of the counts arrive late: a fixed-shape step's routes are held and counted in batches
(route_tally.py) and a GPU span's time is known only once its end event has passed (span_timer.py).
So callers never see the running totals themselves, only `LiveCounters`, a view that settles what is
pending before every read: a caller may keep the view and read it again (`before = c.copy()`, work,
`c.minus(before)`) and always sees every step that ran before the read.
"""

from __future__ import annotations

from collections.abc import Callable
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


class LiveCounters:
    """The executor's counters as its callers read them: every read settles what is pending first.

        view = LiveCounters(totals, settle)   # settle(): adds the held steps and spans to `totals`
        before = view.copy()                  # a settled snapshot (Counters)
        ... forwards, fixed-shape steps ...
        view.minus(before).routes             # every route since the snapshot, held ones included
        view.hot_share, view.routes_cold      # any field or property of Counters, current
    """

    def __init__(self, totals: Counters, settle: Callable[[], None]):
        self._totals, self._settle = totals, settle

    def copy(self) -> Counters:
        """A snapshot of the totals now, with everything pending settled."""
        self._settle()
        return self._totals.copy()

    def minus(self, earlier: Counters) -> Counters:
        return self.copy().minus(earlier)

    def __getattr__(self, name: str):  # fields and properties of Counters, read settled
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.copy(), name)
