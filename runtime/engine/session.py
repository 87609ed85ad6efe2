"""An engine session: the model's session, with the executor's mode chosen per forward by the plan.

Prefills of more tokens than the plan's threshold run upload-once, shorter ones split-route;
decode steps run the fixed-shape decode step. Everything else (cache kept across turns,
truncate, fork) is the model session's.
"""

from __future__ import annotations

import torch

from ..model.session import Session
from .executor import PlacementExecutor


class EngineSession:
    def __init__(self, session: Session, executor: PlacementExecutor, threshold: int | None):
        self.session, self.executor, self.threshold = session, executor, threshold

    def __len__(self) -> int:
        return len(self.session)

    def prefill_mode(self, n: int) -> str:
        return "upload" if self.threshold is not None and n > self.threshold else "split"

    def prefill(self, token_ids) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        self.executor.set_mode(self.prefill_mode(ids.numel()))
        return self.session.prefill(ids)

    def decode(self, token_id) -> torch.Tensor:
        self.executor.set_mode("decode")
        return self.session.decode(token_id)

    def truncate(self, n: int) -> None:
        self.executor.set_mode(self.prefill_mode(max(0, n - len(self.session))))
        self.session.truncate(n)

    def fork(self) -> "EngineSession":
        return EngineSession(self.session.fork(), self.executor, self.threshold)
