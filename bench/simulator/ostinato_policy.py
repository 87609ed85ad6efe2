"""Ostinato as its plan says (runtime/engine/session.py): the plan's hot experts resident on the GPUs;
prefills of up to the largest of `policy.prefill_buckets` run as captured bucket steps, longer ones
of up to `policy.prefill_threshold` tokens split-route (hot routes on the GPU, cold routes on
the host, concurrently), longer ones upload each distinct cold expert once; decode splits too."""

from __future__ import annotations

import numpy as np

from ostinato.compiler.cost_model import CostModel

from .policy import Forward, Policy, bucket_pass, split_pass, static_decode, upload_pass


class Ostinato(Policy):
    name = "Ostinato"

    def __init__(self, cost: CostModel, hot: np.ndarray, threshold: int | None, buckets: list[int] = (),
                 decode_graphs: bool = True, name: str | None = None):
        """`decode_graphs` False: decode steps dispatched op by op (an ablation); `name`: the row's label."""
        super().__init__(cost)
        self.hot, self.threshold, self.buckets = hot, threshold, sorted(buckets)  # hot [L, E] bool
        self.decode_graphs = decode_graphs
        self.name = name or self.name

    def prefill(self, counts: np.ndarray, n: int) -> Forward:
        if self.buckets and 0 < n <= self.buckets[-1]:
            return bucket_pass(self.cost, counts, n, self.hot, self.buckets)
        if self.threshold is not None and n > self.threshold:
            return upload_pass(self.cost, counts, n, (counts > 0) & ~self.hot, "upload")
        return split_pass(self.cost, counts, n, self.hot)

    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, Forward]:
        return static_decode(self.cost, self.hot, ids, eager=None if self.decode_graphs else True)
