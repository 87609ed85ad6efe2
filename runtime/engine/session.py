"""An engine session: the model's session, with the executor's mode chosen per forward by the plan.

Prefills of more tokens than the plan's threshold run upload-once, shorter ones split-route; with
a StepRunner, prefills of up to its largest bucket (that only need the last token's logits) run
as its fixed-shape bucket steps instead, and decode steps as its decode step (a CUDA graph per
GPU, on the CPU one compiled call or eager, engine/cpu_step.py); without one, the dynamic model
with the executor in decode mode.
Everything else (cache kept across turns, truncate, fork) is the model session's; before any of it
the decode runner stores back what its steps added to this session's cache.

Speculation (a `drafter`, engine/drafter.py; the plan's policy.speculative "mtp"): the MTP block
follows every token the session runs, and a caller that has decided the next token can instead

    d_logits = session.draft(token)            # [V] the MTP block's logits for the token after it (or None)
    logits = session.verify(token, d)          # [2, V]: token and its draft d in one step
    logits = session.reject()                  # [V] d was wrong: back to before verify, token runs alone

A rejection leaves the session exactly as plain decoding of `token` leaves it (the model session's
or the static state's mark, then the same one-token step). `drafted` / `accepted` count drafts.

A session never grows past the plan's context (`context`: policy.context): the memory model counts the KV
cache and the fixed-shape steps' state for that many tokens, so a forward that would pass it raises
ContextFull, naming both numbers and the compile option, before it runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..model.session import Session
from .adapter import Adapter, SessionRoutes
from .batch_runner import BatchRunner
from .cpu_step import intra_op_threads
from .drafter import MtpDrafter
from .executor import PlacementExecutor
from .step_runner import StepRunner


class ContextFull(ValueError):
    """A forward would take a session past the plan's context."""


class EngineSession:
    def __init__(self, session: Session, executor: PlacementExecutor, threshold: int | None,
                 runner: StepRunner | None = None, speculative: bool = False, adapter: Adapter | None = None,
                 prefill_threads: Callable[[int], int] | None = None, context: int | None = None,
                 batcher: BatchRunner | None = None):
        """`prefill_threads`: torch's intra-op threads for a dynamic prefill of n tokens (Engine.prefill_threads);
        None: torch's count as it is. `context`: the plan's tokens per session (None: unbounded, a bare model).
        `batcher`: the engine's BatchRunner when sessions decode together (batch_runner.decode_together)."""
        self.session, self.executor, self.threshold, self.runner = session, executor, threshold, runner
        self.batcher = batcher
        self.context = context
        self.adapter, self.prefill_threads = adapter, prefill_threads
        # this session's routes, per main layer and expert (engine/adapter.py re-places the hot set from them)
        self.routes = SessionRoutes(session.model.config.n_layers, session.model.config.n_routed_experts)
        self.drafter = MtpDrafter(session.model, executor, len(session), runner) if speculative else None
        self._mark = None  # the state before the last verify (what reject() goes back to)
        self._verified: int | None = None  # the token the last verify ran first
        self.drafted = self.accepted = 0

    def __len__(self) -> int:
        return len(self.session)

    def prefill_mode(self, n: int, last_only: bool = False) -> str:
        """How a prefill of n tokens runs: bucket steps (only the last logits wanted, n within the largest
        bucket), else split-route up to the plan's threshold, upload-once above: sharded over every GPU's link
        past the plan's shard threshold (policy.shard_threshold, held by the executor's slice staging), else
        over the layer's own (the executor runs it sharded all the same under OSTINATO_UPLOAD=sharded)."""
        if last_only and self.runner is not None and 0 < n <= self.runner.largest_bucket:
            return "bucket"
        if self.threshold is None or n <= self.threshold:
            return "split"
        sharded = self.executor.sharded
        return "sharded" if sharded is not None and sharded.threshold is not None and n > sharded.threshold \
            else "upload"

    def room_for(self, n: int) -> None:
        """Raise ContextFull unless n more tokens fit the plan's context."""
        if self.context is not None and len(self.session) + n > self.context:
            raise ContextFull(f"{len(self.session):,d} tokens in the session and {n:,d} more would pass the plan's "
                              f"context of {self.context:,d} tokens (policy.context): compile a plan with a longer "
                              f"one (ostinato-compile --context {len(self.session) + n})")

    def prefill(self, token_ids, last_only: bool = False) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        self.room_for(ids.numel())
        self._settle()
        follow = None if self.drafter is None else self._follow
        if self.prefill_mode(ids.numel(), last_only) == "bucket":
            return self.runner.prefill(self.session, ids, follow)
        self._release()
        mode = self.prefill_mode(ids.numel())
        threads = torch.get_num_threads() if self.prefill_threads is None else self.prefill_threads(ids.numel())
        if follow is None:
            self.executor.set_mode(mode)
            with intra_op_threads(threads):
                return self.session.prefill(ids, last_only)

        def chunk(chunk_ids, streams):  # the drafter's MTP forwards set their own mode
            follow(chunk_ids, streams)
            self.executor.set_mode(mode)
        self.executor.set_mode(mode)
        with intra_op_threads(threads):
            return self.session.prefill(ids, last_only, on_chunk=chunk)

    def decode(self, token_id) -> torch.Tensor:
        self.room_for(1)
        self._settle()
        if self.drafter is not None:
            logits, streams = self._extend([int(token_id)])
            self.drafter.ran([int(token_id)], streams)
            return logits[0]
        if self.runner is not None:
            return self.runner.decode(self.session, int(token_id))
        self.executor.set_mode("decode")
        return self.session.decode(token_id)

    # ----- speculation ---------------------------------------------------------------------------
    def draft(self, token: int) -> torch.Tensor | None:
        """The MTP block's logits [V] for the token after `token` (decided, to be run next); None without a
        drafter or while it has no streams to draft from (the first token after a restart)."""
        self._settle()
        return None if self.drafter is None else self.drafter.draft(int(token))

    def verify(self, token: int, draft: int) -> torch.Tensor:
        """Run `token` and its draft in one step -> logits [2, V] (token's, the draft's). The session holds
        both until reject(); anything else called next keeps them (the draft was accepted)."""
        if self.drafter is None:
            raise ValueError("verify() needs a speculative session (the plan's policy.speculative: mtp)")
        self.room_for(2)
        self._settle()
        self.drafted += 1
        self.accepted += 1  # until reject() says otherwise
        ids = [int(token), int(draft)]
        self._mark = self.runner.mark(self.session) if self.runner is not None else self.session.mark()
        self._verified = int(token)
        logits, streams = self._extend(ids)
        self.drafter.ran(ids, streams)
        return logits

    def reject(self) -> torch.Tensor:
        """The last verify's draft was wrong: back to before it, and its first token alone -> logits [V]."""
        if self._mark is None:
            raise ValueError("reject() follows a verify()")
        mark, token = self._mark, self._verified
        self._mark = self._verified = None
        self.accepted -= 1
        if self.runner is not None:
            self.runner.back_to(self.session, mark)
        else:
            self.session.back_to(mark)
        self.drafter.cut(len(self.session))
        return self.decode(token)

    def _settle(self) -> None:
        """Before any forward or cache operation (anything but reject() after a verify keeps its draft: the
        mark is no longer needed): this session's routes are the ones counted, finished uploads of a
        re-placement take effect (between forwards: engine/adapter.py), and a batch slot holding this session
        stores it back (its cache is current again for whatever runs next)."""
        self._mark = self._verified = None
        if self.batcher is not None:
            self.batcher.release(self.session)
        self._begin()

    def begin_batched(self) -> None:
        """Before a batched decode step (batch_runner.decode_together): as _settle, but the session keeps its
        batch slot, and nothing listens to the executor's routes (the batch adds each session's own)."""
        self._mark = self._verified = None
        self.executor.route_sink = None
        if self.adapter is not None:
            self.adapter.settle()

    def _begin(self) -> None:
        # routes are counted only where something re-places from them: no host work on other engines' steps
        self.executor.route_sink = self.routes.add if self.adapter is not None else None
        if self.adapter is not None:
            self.adapter.settle()

    def _follow(self, ids, streams) -> None:
        self.drafter.ran(ids, streams)
        self.drafter.catch_up()

    def _extend(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.runner is not None:
            return self.runner.extend(self.session, ids)
        self.executor.set_mode("decode")
        return self.session.extend(ids)

    def rewind_point(self, n: int) -> int:
        self._settle()
        self._release()
        return self.session.rewind_point(n)

    def truncate(self, n: int) -> None:
        self._settle()
        self._release()
        self.executor.set_mode(self.prefill_mode(max(0, n - len(self.session))))
        self.session.truncate(n)
        if self.drafter is not None:  # the streams it holds below n stand
            self.drafter.cut(n)

    def fork(self) -> EngineSession:
        self._settle()
        self._release()
        other = EngineSession(self.session.fork(), self.executor, self.threshold, self.runner, adapter=self.adapter,
                              prefill_threads=self.prefill_threads, context=self.context, batcher=self.batcher)
        other.drafter = None if self.drafter is None else self.drafter.fork()
        other.routes.counts = self.routes.counts.copy()
        return other

    def state(self) -> Session:
        """The model session with everything the decode steps added stored back: what a session file
        writes (model/session_file.py; the MTP block's cache is not in it). Read it, do not change it."""
        self._settle()
        self._release()
        return self.session

    def adopt(self, session: Session) -> None:
        """Continue from `session` (one read from a session file) instead of the one this holds."""
        self._settle()
        self._release()
        self.session = session
        if self.drafter is not None:
            self.drafter.restart(len(session))

    def _release(self) -> None:
        if self.runner is not None:
            self.runner.release(self.session)
