"""An engine session: the model's session, with the executor's mode chosen per forward by the plan.

Prefills of more tokens than the plan's threshold run upload-once, shorter ones split-route; with
a StepRunner, prefills of up to its largest bucket (that only need the last token's logits) run
as its fixed-shape bucket steps instead, and decode steps as its decode step (a CUDA graph per
GPU, eager on the CPU); without one, the dynamic model with the executor in decode mode.
Everything else (cache kept across turns, truncate, fork) is the model session's; before any of it
the decode runner stores back what its steps added to this session's cache.
"""

from __future__ import annotations

import torch

from ..model.session import Session
from .executor import PlacementExecutor
from .step_runner import StepRunner


class EngineSession:
    def __init__(self, session: Session, executor: PlacementExecutor, threshold: int | None,
                 runner: StepRunner | None = None):
        self.session, self.executor, self.threshold, self.runner = session, executor, threshold, runner

    def __len__(self) -> int:
        return len(self.session)

    def prefill_mode(self, n: int, last_only: bool = False) -> str:
        """How a prefill of n tokens runs: bucket steps (only the last logits wanted, n within the largest
        bucket), else split-route up to the plan's threshold, upload-once above."""
        if last_only and self.runner is not None and 0 < n <= self.runner.largest_bucket:
            return "bucket"
        return "upload" if self.threshold is not None and n > self.threshold else "split"

    def prefill(self, token_ids, last_only: bool = False) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if self.prefill_mode(ids.numel(), last_only) == "bucket":
            return self.runner.prefill(self.session, ids)
        self._release()
        self.executor.set_mode(self.prefill_mode(ids.numel()))
        return self.session.prefill(ids, last_only)

    def decode(self, token_id) -> torch.Tensor:
        if self.runner is not None:
            return self.runner.decode(self.session, int(token_id))
        self.executor.set_mode("decode")
        return self.session.decode(token_id)

    def rewind_point(self, n: int) -> int:
        self._release()
        return self.session.rewind_point(n)

    def truncate(self, n: int) -> None:
        self._release()
        self.executor.set_mode(self.prefill_mode(max(0, n - len(self.session))))
        self.session.truncate(n)

    def fork(self) -> EngineSession:
        self._release()
        return EngineSession(self.session.fork(), self.executor, self.threshold, self.runner)

    def state(self) -> Session:
        """The model session with everything the decode steps added stored back: what a session file
        writes (model/session_file.py). Read it, do not change it."""
        self._release()
        return self.session

    def adopt(self, session: Session) -> None:
        """Continue from `session` (one read from a session file) instead of the one this holds."""
        self._release()
        self.session = session

    def _release(self) -> None:
        if self.runner is not None:
            self.runner.release(self.session)
