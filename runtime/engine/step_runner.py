"""The engine's fixed-shape steps, lent to one session at a time: the decode step and the short-prefill buckets.

One `StaticStep` per token count serves every session of an engine: T = 1 (decode) and each of the
plan's prefill buckets (`policy.prefill_buckets`, powers of two), all on one `DecodeState` (the
static KV buffers for the plan's context). A session binds the state (loads its cache into the
buffers, after storing the previous owner's); a dynamic prefill, truncate or fork releases it first
(stores back what the steps added), so the dynamic cache is always current when anything else reads it.

A short prefill of n tokens (n <= the largest bucket) runs as exact-size bucket steps, largest
first: 120 tokens = 64 + 32 + 16 + 8, at most one step per bucket size plus the decode step for an
odd n. Chunking a prefill is exact (the model attends causally over the cache either way) and no
token is padded, so the steps give the dynamic model's logits; the price is up to log2(largest) + 1
replays instead of one. After the steps the state is stored into the session's cache (which stays
bound) and the session snapshots there, as a dynamic prefill does, so truncate and fork see the same
cache and snapshots either way. Longer prompts run on the dynamic model (split-route or upload-once
by the plan's threshold): at those lengths experts and attention, not dispatch, set the time.

With speculation (the plan's policy.speculative "mtp", engine/drafter.py) every step also keeps its
tokens' last-layer residual streams (the MTP block drafts from the streams of every token the model
runs) and a 2-token step, which keeps both tokens' logits, verifies each draft: `mark()` before it
and `back_to()` after a rejection put the buffers back exactly (static_decode/rollback.py, captured
too), so the pending token runs alone as plain decoding would have run it. The drafts themselves run
as the MTP block's fixed-shape steps of 1 and 2 pairs (static_decode/mtp_step.py, captured like the
others), on one MTP state lent to one drafter at a time as the main state is lent to sessions
(`draft()`, `release_drafter()`).

Each position decodes with the step of the smallest context that holds it (`decode_steps`: the plan's context
divided by powers of 4, buckets.decode_contexts; StaticStep.within; the 2-token step, a speculative verify or
the bucket of 2, likewise: `pair_steps`): the same buffers, but attention and the
indexer read the compressed rows of that context, not of the plan's whole one (8,192 tokens' 2,048 CSA rows where
a session holds 600 tokens' 150; at an agent's 20k tokens of a 262,144-token plan, a quarter of them). On GPUs
each context's decode step is captured at load (a graph per context, in the one pool: only one runs at a time).

On GPUs each segment of each step is captured once as a CUDA graph (decode_graphs.py, all in one
memory pool on one capture stream per device: the steps never run at the same time) and replayed; on
the CPU the decode steps are compiled into one call each (the plan's policy.cpu_step "compiled",
engine/cpu_step.py; `compile_cpu_step()`: the smallest context's at load, falling back to the eager steps
with the reason in `cpu_step_note`, the larger ones when a position first needs them) and the other steps
run eagerly. The capture runs when the engine loads (`capture_graphs()`, a
few seconds for V4-Flash's buckets, said on stderr), not on the first request, whose wait it would
add to. Counters get each step's routes afterwards.
"""

from __future__ import annotations

import sys
import time

import torch

from ostinato.buckets import bucket_pieces
from ostinato.buckets import decode_contexts as plan_decode_contexts

from ..model.session import Session
from ..model.static_decode.mtp_step import MtpState, StaticMtpStep
from ..model.static_decode.rollback import RollbackPass, StepRollback
from ..model.static_decode.step import StaticStep
from .cpu_step import CompileFailed
from .decode_graphs import SegmentGraphs, graph_pool
from .executor import PlacementExecutor
from .streams import streams_for
from .ticker import Ticker

VERIFY_TOKENS = 2  # a verify step: the pending token and one draft (depth 1)


def handed_out(logits: torch.Tensor) -> torch.Tensor:
    """A copy of a step's logits [V] float32 for the caller (the step's buffer is written again by the next step).
    On the CPU numpy's copy, on one thread: torch's clone of V4's 129,280 logits splits the copy between the
    plan's threads, whose wake-up costs more than the copy (measured after a real-vocab decode step, 2 Zen 4
    cores: 122 us against 34-47)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().copy())
    return logits.clone()


def on_gpu(step: StaticStep) -> bool:
    """Whether the step has GPU segments to capture (tests replace it to run the capture path on the CPU)."""
    return any(s.device.type == "cuda" for s in step.segments)


class StepRunner:
    def __init__(self, model, executor: PlacementExecutor, max_context: int, graphs: bool = True,
                 layer_gpus: list[int] | None = None, buckets: list[int] = (), speculative: bool = False,
                 cpu_step: str = "eager", decode_contexts: list[int] | None = None, eager_why: str = ""):
        """`layer_gpus`: the plan's GPU of each layer (the steps' segments, see StaticStep);
        `buckets`: the prefill buckets' token counts (> 1; the decode step is T = 1); `speculative`: every
        step keeps its tokens' streams, the 2-token step (made if no bucket is one) every token's logits;
        `cpu_step`: "compiled" to compile the decode step's CPU segments (compile_cpu_step), else "eager";
        `decode_contexts`: on an engine without GPU segments, the contexts of its decode steps (ascending, the
        last max_context; default buckets.decode_contexts): each position decodes with the smallest that holds
        it (StaticStep.within); `eager_why`: why cpu_step is "eager" (the caller's choice: cpu_step_note)."""
        if cpu_step not in ("compiled", "eager"):
            raise ValueError(f"cpu_step must be 'compiled' or 'eager', got {cpu_step!r}")
        if any(b < 2 for b in buckets):
            raise ValueError(f"prefill buckets take at least 2 tokens, got {list(buckets)}")
        self.step = StaticStep(model, max_context, layer_gpus, streams=speculative)  # T = 1: the decode step
        sizes = sorted(set(buckets) | ({VERIFY_TOKENS} if speculative else set()))
        self.steps = {1: self.step} | {T: StaticStep(model, max_context, layer_gpus, tokens=T, state=self.step.state,
                                                     streams=speculative,
                                                     all_logits=speculative and T == VERIFY_TOKENS)
                                       for T in sizes}
        self.speculative = speculative
        self.drafts: dict[int, StaticMtpStep] = {}  # pairs -> the MTP block's step (speculative runners)
        if speculative:
            mtp_state = MtpState(model, max_context)
            self.drafts = {P: StaticMtpStep(model, max_context, P, mtp_state) for P in (1, VERIFY_TOKENS)}
        self.drafter = None  # the drafter whose MTP cache the MTP state holds
        self.rollback = StepRollback(self.step.state, self.step.segments, VERIFY_TOKENS) if speculative else None
        self.buckets = sorted(set(buckets))
        self.executor = executor
        self.owner: Session | None = None
        self.use_graphs = graphs and on_gpu(self.step)
        for seg in self.step.segments:  # every step's capture stream, made at load
            streams_for(seg.device).named(seg.device, "capture")
        self.pool = pool = graph_pool() if self.use_graphs else None  # every step's graphs (batch_runner.py's too)
        self.graphs = {T: SegmentGraphs(step, pool) for T, step in self.steps.items()}
        self.draft_graphs = {P: SegmentGraphs(step, pool) for P, step in self.drafts.items()}
        self.rollback_graphs = {name: SegmentGraphs(RollbackPass(self.rollback, name == "restore"), pool)
                                for name in ("save", "restore")} if speculative else {}
        contexts = list(decode_contexts or plan_decode_contexts(max_context))
        if contexts[-1] != max_context or contexts != sorted(set(contexts)) or contexts[0] < 1:
            raise ValueError(f"decode contexts {contexts}: ascending, each once, the last max_context={max_context}")
        # (context, the decode step within it), ascending: on GPUs each is captured (capture_graphs)
        self.decode_steps = ([(c, SegmentGraphs(self.step.within(c), pool)) for c in contexts[:-1]]
                             + [(max_context, self.graphs[1])])
        # the 2-token step (a speculative verify, or the bucket of 2) likewise: a decoding session's other step
        self.pair_steps = ([(c, SegmentGraphs(self.steps[VERIFY_TOKENS].within(c), pool)) for c in contexts[:-1]]
                           + [(max_context, self.graphs[VERIFY_TOKENS])]) if VERIFY_TOKENS in self.steps else []
        cpu = any(s.device.type == "cpu" for s in self.step.segments)
        self.cpu_step = cpu_step if cpu else "eager"
        # why the decode step runs eagerly on the CPU ("": it does not, or compile_cpu_step will say)
        self.cpu_step_note = ("" if self.cpu_step == "compiled" else eager_why) if cpu else "no CPU segments"
        self.unbuilt: set[int] = set()  # contexts whose compiled decode step is built when first needed

    def compile_cpu_step(self, on_step=lambda context: None) -> bool:
        """Compile the CPU segments of the decode step of the smallest context (at load, as capture_graphs) ->
        whether it is compiled; when it cannot be, every step stays eager and `cpu_step_note` says why (it is
        logged by the caller). The larger contexts' steps are compiled when a position first needs one
        (`_run`): each build is a minute on 2 cores the first time, and a plan reserving an agent's context
        (262,144 tokens: five sizes) would pay for all of them at every first load, most never used by a
        short session. A speculative runner builds them all now (its drafter holds state a build would have
        to rebind). `on_step(context)`: called after each build (a progress bar); while one builds, a line
        every few seconds says so (ticker.py: on a terminal, or with $OSTINATO_PROGRESS=1)."""
        if self.cpu_step != "compiled":
            return False
        self.release()
        self.release_drafter()
        now = self.decode_steps if self.speculative else self.decode_steps[:1]
        try:
            for context, graphs in now:
                self._build(context, graphs)
                on_step(context)
        except CompileFailed as e:
            for _, graphs in self.decode_steps:
                graphs.compiled = {}
            self.cpu_step, self.cpu_step_note = "eager", str(e)
            return False
        self.unbuilt = {context for context, _ in self.decode_steps[len(now):]}
        return True

    def _build(self, context: int, graphs: SegmentGraphs) -> None:
        """Compile one decode step's CPU segments (raises CompileFailed); leaves the state to be loaded again."""
        n = next(i for i, (c, _) in enumerate(self.decode_steps, 1) if c == context)
        # one blocking call per step: the ticker says it is alive (a terminal, or $OSTINATO_PROGRESS=1)
        with Ticker(f"building decode step {n}/{len(self.decode_steps)} for positions up to {context:,d}",
                    "the first time traced, generated as C++ and compiled; then found in the cache"):
            graphs.compile_cpu()

    def _build_when_first_needed(self, context: int, graphs: SegmentGraphs) -> None:
        """The first position past the smaller contexts: compile its step now, between two steps of the bound
        session (stored back before the build, loaded again after it). A build that fails leaves this and the
        larger steps eager (each is exact; the smaller compiled ones stay), said once on stderr."""
        owner = self.owner
        self.release()
        try:
            self._build(context, graphs)
            self.unbuilt.discard(context)
        except CompileFailed as e:
            graphs.compiled = {}
            self.unbuilt = set()
            self.cpu_step_note = str(e)
            print(f"ostinato: decoding positions past {context // 4:,d} with the eager CPU step: {e}",
                  file=sys.stderr, flush=True)
        finally:
            if owner is not None:
                self.bind(owner)

    def capture_graphs(self, on_step=lambda T: None) -> None:
        """Capture every step's graphs (at load: a no-op without GPU segments or with graphs off).
        Their warm-up runs leave stale state in the buffers, so no session stays bound: the next bind loads
        its cache. `on_step(T)`: called after each step's capture (a progress bar)."""
        if not self.use_graphs:
            return
        self.release()
        self.release_drafter()
        for T, graphs in self.graphs.items():
            graphs.capture()
            on_step(T)
        for graphs in (*(g for _, g in self.decode_steps[:-1]), *(g for _, g in self.pair_steps[:-1]),
                       *self.draft_graphs.values(), *self.rollback_graphs.values()):
            graphs.capture()

    @property
    def largest_bucket(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    def bind(self, session: Session) -> None:
        """Make `session`'s cache the one the steps work on (host side)."""
        if self.owner is session:
            return
        self.release()
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
        logits = handed_out(self._run(1, [int(token_id)]))
        session.tokens.append(int(token_id))
        return logits

    @torch.no_grad()
    def extend(self, session: Session, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """T tokens of `session` in one step (T = 1, or 2 to verify a draft; speculative steps only) ->
        (logits [T, V], last-layer residual streams [T, N, D]), copies; no snapshot, as decode."""
        ids = [int(t) for t in torch.as_tensor(token_ids).reshape(-1)]
        if not self.speculative or len(ids) not in (1, VERIFY_TOKENS):
            raise ValueError(f"extend() takes 1 or {VERIFY_TOKENS} tokens on a speculative runner, got {len(ids)}")
        self.bind(session)
        self._run(len(ids), ids)
        step = self.steps[len(ids)]
        session.tokens.extend(ids)
        return step.all_logits.clone(), step.streams.clone()

    def mark(self, session: Session) -> int:
        """Save `session`'s state now, for back_to() after steps of up to VERIFY_TOKENS tokens -> its length."""
        self.bind(session)
        self.rollback.mark(self.rollback_graphs["save"].run)
        return len(session.tokens)

    def back_to(self, session: Session, mark: int) -> None:
        """Exactly the state of mark(): the steps since did not happen (the buffers, and the tokens)."""
        if self.owner is not session:
            raise ValueError("back_to: the session's steps were stored since its mark (a prefill, truncate or fork)")
        self.rollback.back_to(self.rollback_graphs["restore"].run)
        del session.tokens[mark:]

    @torch.no_grad()
    def prefill(self, session: Session, token_ids, on_piece=None) -> torch.Tensor:
        """n tokens of `session` (1 <= n <= the largest bucket) as bucket steps -> the last one's logits
        [1, V] float32; the session's cache is current afterwards and snapshotted, as after a dynamic prefill.
        on_piece(ids [t], streams [t, N, D]): after each step, with its tokens' residual streams (speculative
        runners only: the MTP block follows the prompt)."""
        ids = [int(t) for t in torch.as_tensor(token_ids).reshape(-1)]
        if not 1 <= len(ids) <= self.largest_bucket:
            raise ValueError(f"a bucketed prefill takes 1..{self.largest_bucket} tokens, not {len(ids)}")
        self.bind(session)
        self.step.check_room(len(ids))  # all or nothing: no step runs if the whole prompt does not fit
        done = 0
        for T in bucket_pieces(len(ids), self.buckets):
            logits = self._run(T, ids[done:done + T])
            if on_piece is not None:
                on_piece(torch.tensor(ids[done:done + T]), self.steps[T].streams.clone())
            done += T
        logits = logits.clone()[None]  # [1, V]
        self.step.store(session.cache)  # stays bound: the next decode goes on without a reload
        session.tokens.extend(ids)
        session.snapshot()
        return logits

    # ----- the MTP block's drafts ----------------------------------------------------------------
    @torch.no_grad()
    def draft(self, drafter, streams: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """The draft of `drafter` (engine/drafter.py) from P = 1 or 2 pairs (streams [P, N, D], next ids [P])
        at its position -> the last pair's draft logits [V] (a copy); its MTP cache stays in the buffers."""
        if self.drafter is not drafter:
            self.release_drafter()
            self.drafts[1].state.load(drafter.cache, drafter.next - drafter.origin)
            self.drafter = drafter
        step = self.drafts[streams.shape[0]]
        start = time.perf_counter()
        step.set_pairs(streams, next_ids)
        logits = self.draft_graphs[streams.shape[0]].run()
        self.executor.count_decode(step.route_ids(), time.perf_counter() - start, step.segments[0].first_layer)
        return logits.clone()

    def release_drafter(self, drafter=None, keep: bool = True) -> None:
        """Store the MTP buffers' additions into the lending drafter's cache (only if it is `drafter`, when
        given); keep=False: drop them (the drafter restarts)."""
        if self.drafter is None or (drafter is not None and self.drafter is not drafter):
            return
        if keep:
            self.drafts[1].state.store(self.drafter.cache)
        self.drafter = None

    def _run(self, T: int, ids: list[int]) -> torch.Tensor:
        """One step of T tokens -> its logits buffer [V]; counts its routes."""
        graphs = (self._decode_graphs() if T == 1 else self._within(self.pair_steps, T) if T == VERIFY_TOKENS
                  and self.pair_steps else self.graphs[T])
        if T == 1 and self.unbuilt:
            context = next((c for c, g in self.decode_steps if g is graphs), None)
            if context in self.unbuilt:
                self._build_when_first_needed(context, graphs)
        step = graphs.step
        start = time.perf_counter()
        step.set_tokens(ids)
        logits = graphs.run()  # segments without a captured graph run eagerly
        self.executor.count_decode(step.route_ids(), time.perf_counter() - start)
        return logits

    def _within(self, steps: list[tuple[int, SegmentGraphs]], T: int) -> SegmentGraphs:
        """Of `steps` (context, graphs), ascending, the smallest context that holds the next T tokens."""
        after = self.step.position + T
        return next((graphs for context, graphs in steps if after <= context), steps[-1][1])

    def _decode_graphs(self) -> SegmentGraphs:
        """The decode step of the smallest context that holds the next token."""
        after = self.step.position + 1
        return next((graphs for context, graphs in self.decode_steps if after <= context), self.graphs[1])
