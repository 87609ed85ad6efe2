"""The engine's decode step, lent to one session at a time.

One `StaticDecodeStep` (fixed-shape buffers for the plan's context) serves every session of an
engine: a session's decode binds it (loads that session's cache into the static buffers, after
storing the previous owner's), prefill / truncate / fork release it first (store back what the
decode steps added), so the dynamic cache is always current when anything else reads it. Decode
steps in a row pay nothing for this; each bind (a session's first decode after a prefill, or
another session's turn) copies its compressed rows into the buffers, O(context).

On GPUs each segment of the step is captured once as a CUDA graph (decode_graphs.py) and replayed
per token; on the CPU the same step runs eagerly. Counters get the step's routes afterwards.
"""

from __future__ import annotations

import time

import torch

from ..model.session import Session
from ..model.static_decode.step import StaticDecodeStep
from .decode_graphs import SegmentGraphs
from .executor import PlacementExecutor


class DecodeRunner:
    def __init__(self, model, executor: PlacementExecutor, max_context: int, graphs: bool = True,
                 layer_gpus: list[int] | None = None):
        """`layer_gpus`: the plan's GPU of each layer (the step's segments, see StaticDecodeStep)."""
        self.step = StaticDecodeStep(model, max_context, layer_gpus)
        self.executor = executor
        self.owner: Session | None = None
        self.use_graphs = graphs and any(s.device.type == "cuda" for s in self.step.segments)
        self.graphs = SegmentGraphs(self.step)

    def bind(self, session: Session) -> None:
        """Make `session`'s cache the one the step works on (host side)."""
        if self.owner is session:
            return
        self.release()
        if self.use_graphs and not self.graphs.captured:
            self.graphs.capture()  # its runs leave stale state: the load replaces it (same buffers: graphs stay valid)
        self.step.load(session.cache)
        self.owner = session

    def release(self, session: Session | None = None) -> None:
        """Store the steps' additions into the owner's cache (only if it is `session`, when given)."""
        if self.owner is None or (session is not None and self.owner is not session):
            return
        self.step.store(self.owner.cache)
        self.owner = None

    @torch.no_grad()
    def decode(self, session: Session, token_id: int) -> torch.Tensor:
        """One token of `session` -> its logits [V] float32 (a copy: the step's buffer is reused)."""
        self.bind(session)
        start = time.perf_counter()
        self.step.set_token(int(token_id))
        logits = self.graphs.run().clone()  # segments without a captured graph run eagerly
        self.executor.count_decode(self.step.route_ids(), time.perf_counter() - start)
        session.tokens.append(int(token_id))
        return logits
