"""Several sessions decode together: one token each through one BatchStep, each session on a slot of its own.

    batcher = BatchRunner(runner, slots=4)                  # engine.batcher when the server runs --parallel 4
    logits = decode_together([s1, s2, s3], [t1, t2, t3])    # EngineSessions -> [V] each, in one step

The step runner (step_runner.py) lends its one DecodeState to one session at a time. A batch needs a state per
session, so the batcher keeps `slots` more (each a T = 1 StaticStep sized for the plan's context; the plan's
`policy.sessions` counts their memory with the sessions' KV caches) and binds each session it decodes to one:
its cache is loaded there once and stays until the session does anything else (prefill, truncate, fork, a
solo decode, a session file: EngineSession._settle releases it, storing back what the steps added) or its
slot is needed by a session of a later batch. So a session moves between solo and batched decoding exactly:
the buffers it leaves are stored into its cache, the ones it enters are loaded from it.

Each slot decodes at the smallest of the runner's decode contexts that holds its next token (StaticStep.within),
as the solo step does, so every session's token runs the solo step's attention; the other ops run once over
the batch (static_decode/batch_step.py). Route counts: the executor counts the step's routes as any step's;
each session's own routes (re-placement follows the session whose turn ended, adapter.py) are added to it
from the step's route buffer, row by row. A speculating session's drafter follows the batched tokens too
(their residual streams), so it drafts again as soon as the session decodes alone.

Each batch size's step is built before it first runs, as the runner's decode steps are: per decode context, on
the CPU compiled into one call (engine/cpu_step.py), on GPUs captured as a CUDA graph per segment
(decode_graphs.py), in the runner's graph pool (steps never run at the same time). `build()` builds every size
at the smallest context at load; a larger context's step is built when a batch first needs it, between two steps
(a compile takes a minute the first time, a capture about a second).
"""

from __future__ import annotations

import sys
import time

import torch

from ..model.session import Session
from ..model.static_decode.batch_step import BatchStep
from ..model.static_decode.step import StaticStep
from .cpu_step import CompileFailed
from .decode_graphs import SegmentGraphs
from .step_runner import StepRunner, handed_out
from .ticker import Ticker


class BatchRunner:
    def __init__(self, runner: StepRunner, slots: int):
        if slots < 2:
            raise ValueError(f"a batch runner decodes at least 2 sessions at once, not {slots}")
        step = runner.step
        self.runner, self.executor = runner, runner.executor
        gpus = [i for i, seg in enumerate(step.segments) for _ in range(seg.first_layer, seg.end_layer)]
        self.slots = [StaticStep(step.model, step.max_context, gpus) for _ in range(slots)]
        self.owners: list[Session | None] = [None] * slots
        self.contexts = [context for context, _ in runner.decode_steps]  # ascending, the last the plan's
        self.steps = {B: BatchStep(self.slots[:B]) for B in range(2, slots + 1)}  # a batch of B: the first B slots
        self.graphs: dict[tuple[int, int], SegmentGraphs] = {}  # (B, context) -> its step (built when first run)
        self.compiled = runner.cpu_step == "compiled"  # CPU segments compiled into one call each
        self.captured = runner.use_graphs  # GPU segments captured as CUDA graphs
        self.pool = runner.pool  # the steps never run at the same time: one pool
        self.note = ""  # why batches run eagerly after a compile failed ("": they do not, or none was tried)
        self.steps_run = dict.fromkeys(self.steps, 0)  # batch size -> batched steps run (the server's metrics)
        self.last_ids: torch.Tensor | None = None  # the last step's expert ids [L, B, k] on the CPU

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def nbytes(self) -> int:
        """The slots' static buffers (what the plan's policy.sessions counts beside the KV caches)."""
        return sum(slot.state.nbytes for slot in self.slots)

    @property
    def builds(self) -> bool:
        """Whether the steps are compiled (CPU) or captured (GPU) before they run, rather than run eagerly."""
        return self.compiled or self.captured

    def build(self, on_step=lambda B: None) -> None:
        """Compile or capture every batch size's step at the smallest decode context (at load, as the runner's
        decode step; the larger contexts when a batch first needs one). A compile failure leaves batches eager,
        said in `note`; a capture failure raises, as the runner's does."""
        for B in self.steps:
            self._graphs(B, self.contexts[0])
            on_step(B)

    def release(self, session: Session) -> None:
        """Store what the batch steps added into `session`'s cache and free its slot (nothing if it has none)."""
        for i, owner in enumerate(self.owners):
            if owner is session:
                self.slots[i].store(session.cache)
                self.owners[i] = None

    @torch.no_grad()
    def decode(self, sessions: list[Session], token_ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One token of each session (2..size distinct sessions) in one step -> (their logits [V] each, copies;
        the tokens' last-layer residual streams [B, N, D], a copy); every session's tokens grow by one."""
        B = len(sessions)
        if not 2 <= B <= self.size or len({id(s) for s in sessions}) != B:
            raise ValueError(f"a batch decodes 2..{self.size} distinct sessions, got {B}")
        self._seat(sessions)
        after = max(slot.position for slot in self.slots[:B]) + 1
        graphs = self._graphs(B, next((c for c in self.contexts if after <= c), self.contexts[-1]))
        step = graphs.step
        start = time.perf_counter()
        step.set_tokens([int(t) for t in token_ids])
        graphs.run()
        self.last_ids = step.route_ids()  # [L, B, k] on the CPU: counted here, each session's added by decode_together
        self.executor.count_decode(self.last_ids, time.perf_counter() - start)
        self.steps_run[B] += 1
        for s, t in zip(sessions, token_ids):
            s.tokens.append(int(t))
        return [handed_out(row) for row in step.all_logits], step.streams.clone()

    def _seat(self, sessions: list[Session]) -> None:
        """Session b in slot b: a session already there stays (its buffers are current), any other is stored
        back from wherever it sat (a slot, the solo step) and loaded into its slot."""
        for b, session in enumerate(sessions):
            if self.owners[b] is session:
                continue
            if self.owners[b] is not None:
                self.release(self.owners[b])
            self.release(session)
            self.runner.release(session)  # the solo step's buffers may hold its latest tokens
            self.slots[b].load(session.cache)
            self.owners[b] = session

    def _graphs(self, B: int, context: int) -> SegmentGraphs:
        """The step of B sessions within `context` tokens; compiled the first time it is needed, on a compiling
        engine (as the runner's larger decode contexts: between two steps, the slots stored back and loaded again)."""
        graphs = self.graphs.get((B, context))
        if graphs is not None:
            return graphs
        step = self.steps[B] if context == self.steps[B].max_context else self.steps[B].within(context)
        graphs = self.graphs[(B, context)] = SegmentGraphs(step, self.pool)
        if not self.builds:
            return graphs
        # a build runs the step from a rewound state (as the runner's): the seated sessions are stored first
        seated = list(self.owners)
        for owner in seated:
            if owner is not None:
                self.release(owner)
        if self.captured:
            graphs.capture()
        if self.compiled:
            try:
                with Ticker(f"building the decode step of {B} sessions for positions up to {context:,d}",
                            "the first time traced, generated as C++ and compiled; then found in the cache"):
                    graphs.compile_cpu()
            except CompileFailed as e:
                self.compiled, self.note = False, str(e)
                for g in self.graphs.values():
                    g.compiled = {}
                print(f"ostinato: batched decode steps run eagerly: {e}", file=sys.stderr, flush=True)
        for b, owner in enumerate(seated):
            if owner is not None:
                self.slots[b].load(owner.cache)
                self.owners[b] = owner
        return graphs


def decode_together(sessions: list, token_ids: list[int]) -> list[torch.Tensor]:
    """One token of each EngineSession in one batched step when they share a batcher (else each alone, in order)
    -> each session's logits [V]. A session's drafter follows its token; its own routes are added to it."""
    if not sessions:
        return []
    batcher = sessions[0].batcher
    if len(sessions) == 1 or batcher is None or any(s.batcher is not batcher for s in sessions):
        return [s.decode(t) for s, t in zip(sessions, token_ids)]
    for s in sessions:
        s.room_for(1)
        s.begin_batched()
    logits, streams = batcher.decode([s.session for s in sessions], token_ids)
    routes = batcher.last_ids if any(s.adapter is not None for s in sessions) else None
    for b, (s, t) in enumerate(zip(sessions, token_ids)):
        if s.drafter is not None:
            s.drafter.ran([int(t)], streams[b:b + 1])
        if routes is not None:
            s.routes.add(0, routes[:, b])  # [L, k]: this session's own routes
    return logits
