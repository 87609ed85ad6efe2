"""Ostinato as its plan says (runtime/engine/session.py): the plan's hot experts resident on the GPUs;
prefills of up to the largest of `policy.prefill_buckets` run as captured bucket steps, longer ones
of up to `policy.prefill_threshold` tokens split-route (hot routes on the GPU, cold routes on
the host, concurrently), longer ones upload each distinct cold expert once, over every GPU's link past
`policy.shard_threshold` (a 1/G slice each: runtime/engine/sharded_upload.py); decode splits too. The mode is
chosen once per prompt from its whole length (runtime/engine/session.py prefill_mode) and every chunk of the plan's
prefill chunk runs in it (runtime/model/session.py), as the cost model prices a prompt (CostModel.prefill). Its decode,
bucket and verify steps are fixed-shape (runtime/model/static_decode): their attention reads the rows of their
buffers (CostModel.step_context), the eager prefills the rows visible at the turn's position.
With `mtp_acceptance`, decode steps are speculative (runtime/model/speculative.py, depth 1): the MTP block
drafts one token, one two-token forward verifies it (priced as the plan runs any two-token forward: a
bucket step when 2 is a bucket, else an eager split-route prefill) and a rejected draft re-runs the token
alone (cost_model.speculative_step)."""

from __future__ import annotations

import numpy as np

from ostinato.compiler.cost_model import MTP_ACCEPTANCE, CostModel

from .ktransformers import with_gpu_set
from .policy import (
    Forward,
    Policy,
    bucket_pass,
    chunk_starts,
    sharded_pass,
    speculative_decode,
    split_pass,
    static_decode,
    summed,
    upload_pass,
)

MTP_NAME = f"Ostinato + MTP ({MTP_ACCEPTANCE:.0%} acceptance)"


def is_ostinato(name: str) -> bool:
    """Whether a table row is one of Ostinato's own variants (not a baseline to compare against)."""
    return name.startswith("Ostinato")


class Ostinato(Policy):
    name = "Ostinato"

    def __init__(self, cost: CostModel, hot: np.ndarray, threshold: int | None, buckets: list[int] = (),
                 decode_graphs: bool = True, name: str | None = None, mtp_acceptance: float | None = None,
                 shard_threshold: int | None = None):
        """`decode_graphs` False: decode steps dispatched op by op (an ablation); `name`: the row's label;
        `mtp_acceptance`: speculative decoding with the MTP block at that acceptance (None: plain decode);
        `shard_threshold`: uploads of longer prefills sharded over every GPU's link (None: never)."""
        super().__init__(cost)
        self.hot, self.threshold, self.buckets = hot, threshold, sorted(buckets)  # hot [L, E] bool
        self.shard_threshold = shard_threshold
        self.decode_graphs = decode_graphs
        self.name = name or self.name
        self.mtp_acceptance = mtp_acceptance
        self._draft_s = with_gpu_set(cost, hot).mtp_draft() if mtp_acceptance is not None else 0.0

    def mode(self, prompt: int) -> str:
        """How the plan runs a prompt of `prompt` tokens, every chunk of it (runtime/engine/session.py prefill_mode,
        CostModel.prefill): bucket steps within the largest bucket, else CostModel.eager_mode's split, upload or
        sharded."""
        if self.buckets and 0 < prompt <= self.buckets[-1]:
            return "bucket"
        return self.cost.eager_mode(prompt, self.threshold, self.shard_threshold)

    def prefill(self, counts: np.ndarray, n: int, position: int = 0, prompt: int | None = None) -> Forward:
        """One forward of n tokens, a chunk of a prompt of `prompt` tokens (None: n, the whole prompt) in that
        prompt's mode."""
        mode = self.mode(n if prompt is None else prompt)
        if mode == "bucket":
            return bucket_pass(self.cost, counts, n, self.hot, self.buckets, position)
        if mode == "sharded":
            return sharded_pass(self.cost, counts, n, self.hot, position)
        if mode == "upload":
            return upload_pass(self.cost, counts, n, (counts > 0) & ~self.hot, "upload", position=position)
        return split_pass(self.cost, counts, n, self.hot, position=position)

    def prefill_prompt(self, passes: list[tuple[np.ndarray, int]], position: int = 0) -> Forward:
        """Every chunk in the mode of the whole prompt (mode), as the runtime runs it."""
        prompt = sum(n for _, n in passes)
        return summed([self.prefill(counts, n, at, prompt)
                       for (counts, n), at in zip(passes, chunk_starts(passes, position))])

    def resident(self) -> np.ndarray:
        return self.hot

    def batched_step(self, sessions: int, position: int) -> float:
        """The runtime's batched decode step (runtime/model/static_decode/batch_step.py), as the cost model prices it
        (CostModel.batched_decode_step): fixed-shape, one captured graph per batch size and GPU (op by op without
        `decode_graphs`). Speculation in a batch is not modeled."""
        if self.mtp_acceptance is not None:
            raise ValueError(f"{self.name}: speculative decoding of several sessions at once is not modeled")
        return self.cost.batched_decode_step([position] * sessions, eager=None if self.decode_graphs else True)

    def decode(self, ids: np.ndarray, position: int = 0) -> tuple[np.ndarray, Forward]:
        eager = None if self.decode_graphs else True
        if self.mtp_acceptance is None:
            return static_decode(self.cost, self.hot, ids, eager=eager, position=position, fixed_shape=True)
        # the verify: the engine's fixed-shape 2-token step, made whether or not 2 is a prefill bucket
        return speculative_decode(self.cost, self.hot, ids, self.mtp_acceptance, self._draft_s, (True, False),
                                  eager=eager, position=position, fixed_shape=True)
