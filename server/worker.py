"""The one thread that runs the engine: jobs are admitted in arrival order, one forward at a time.

Owning the engine and the prefix cache from a single thread is what keeps the cache consistent:
a cancelled job stops between two forwards, so its session holds exactly the tokens it processed
and goes back into the cache; a job that fails inside a forward drops its session instead.

Up to `parallel` jobs are in progress at once (ostinato-serve --parallel N; the engine's batcher has a slot per
job, runtime/engine/batch_runner.py), more wait in the queue (503 + Retry-After past --max-queue). Each turn
of the loop admits waiting jobs into free places, runs one prefill piece of the first job still prefilling
(its whole prompt when no other job is generating, else `piece_tokens`: the plan's prefill chunk), then one
decode step for every job whose loop waits for a token: several in one batched step, whose logits are each
session's solo ones, one alone through its loop's own forward, which speculates. So a long prompt delays the
other jobs' next token by at most one piece's prefill, and each reply is token for token what it is alone.

A job's reply is the runtime's generation loop (runtime/engine/generation.py) over its cached session,
with the job's sampler as the picker (JobPicker: penalties, bias, forced tokens, constraints, the
test hook, and for sampled replies the per-token noise, sampling.py). With a speculative engine (the
plan's policy.speculative "mtp") the loop drafts, verifies and rejects through that same picker, so a
reply, greedy or sampled under a seed, is token for token the one plain decoding gives. The loop's
events become the request's (events.py): Started, Generated per token, then Done or Failed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ostinato.runtime.engine import Finished, Forward, Generation, decode_together

from .errors import ENGINE_ERROR
from .events import Done, Event, Failed, Generated
from .metrics import Metrics
from .prefix_cache import PrefixCache
from .sampling import Pick, Sampler, Sampling

log = logging.getLogger("ostinato.server")


@dataclass
class Job:
    ids: list[int]                       # the rendered prompt
    max_tokens: int
    # the request's events, in order (events.py): Generated per token, then Done or Failed
    emit: Callable[[Event], None]
    sampling: Sampling = Sampling()      # temperature, top_p, seed, penalties, logit_bias, banned, logprobs
    forced: tuple[int, ...] = ()         # generated first, whatever the logits say (tool_choice required/named)
    constraint: object | None = None     # structured output: .mask(logits) -> logits, .advance(id), .done()
    # on this thread, per token: (events for the client, stop now?): a stop sequence or the end of the tool
    # calls ends generation on the very token that completed it (reply.py)
    watch: Callable[[int], tuple[object, bool]] | None = None
    # called on this thread with the reused token count once the prefix cache has been searched, before
    # the prefill (the Messages API's message_start reports it)
    started: Callable[[int], None] | None = None
    arrived: float = field(default_factory=time.perf_counter)
    cancel: threading.Event = field(default_factory=threading.Event)


class Worker:
    def __init__(self, engine, cache: PrefixCache, metrics: Metrics, logits_hook=None, max_queue: int = 16):
        # logits_hook(generated_ids, logits) -> logits: a constrained-decode hook (tests force DSML with it)
        self.engine, self.cache, self.metrics, self.logits_hook = engine, cache, metrics, logits_hook
        self.eos = engine.model.config.eos_token_id
        if max_queue < 1:  # Queue(maxsize=0) would mean unbounded
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)  # waiting jobs; the running one is not in it
        self.reserved = 0  # slots held by requests still being prepared (reserve)
        self._slots = threading.Lock()
        # requests with large bodies are tokenized one at a time (app.py's accept): each costs seconds and
        # hundreds of MB, and eight at once took the memory of eight and both cores from small requests
        self.large_lane = asyncio.Semaphore(1)
        self.stopping = threading.Event()
        self.parallel = getattr(engine, "parallel", 1)  # jobs in progress at once (ostinato-serve --parallel)
        self.active: list[Active] = []  # the jobs in progress, in admission order (stop() cancels them)
        self.counted = None  # the engine's route counters as the metrics hold them (read when a job first runs)
        self.thread = threading.Thread(target=self._loop, name="ostinato-engine", daemon=True)
        self.thread.start()

    def reserve(self) -> bool:
        """Hold a queue slot for a request about to be checked and tokenized (seconds for a long prompt):
        that work counts against max_queue like waiting, so a burst of large requests is turned away
        (503) before it costs anything. False when every slot is taken; else submit(job, reserved=True)
        or unreserve() must follow."""
        with self._slots:
            if self.jobs.qsize() + self.reserved >= self.jobs.maxsize:
                return False
            self.reserved += 1
            return True

    def unreserve(self) -> None:
        with self._slots:
            self.reserved -= 1

    def submit(self, job: Job, reserved: bool = False) -> None:
        """Queue a job (in a slot reserve() held: it cannot be full); queue.Full when max_queue jobs are
        already waiting or being prepared (the server answers 503)."""
        with self._slots:
            if not reserved and self.jobs.qsize() + self.reserved >= self.jobs.maxsize:
                raise queue.Full
            self.jobs.put_nowait(job)
            self.reserved -= reserved

    def stop(self) -> None:
        """End the loop after the jobs in progress, which are cancelled: the server stops once it has waited
        its bound for replies in flight (background.py), so nobody reads the rest. Sessions are written."""
        self.stopping.set()
        for active in list(self.active):
            active.job.cancel.set()  # stops before its next forward; its session is kept, and written
        try:
            self.jobs.put_nowait(None)  # wakes the loop; a full queue wakes it anyway when the next job ends
        except queue.Full:
            pass

    @property
    def piece_tokens(self) -> int:
        """A prompt prefills in pieces of this many tokens while other jobs generate: the plan's prefill chunk."""
        return self.engine.model.prefill_chunk

    @property
    def running(self) -> Job | None:
        """The first job in progress (None: none is)."""
        return self.active[0].job if self.active else None

    def _next(self, wait: bool) -> Job | None:
        """The next job (None: stop, or with wait=False none is waiting). The cache's session store gets its
        writes here, between jobs: sessions the last job evicted at once, changed ones after idle_s without
        a job (prefix_cache.py); only while nothing runs."""
        if not wait:
            try:
                return self.jobs.get_nowait()
            except queue.Empty:
                return None
        self.cache.write_evicted()
        while self.cache.unsaved() and not self.stopping.is_set():
            try:
                return self.jobs.get(timeout=self.cache.idle_s)
            except queue.Empty:
                self.cache.write_changed(busy=lambda: not self.jobs.empty())
        return self.jobs.get()

    def _loop(self) -> None:
        """Each turn: admit waiting jobs up to `parallel`, run one prefill piece of one admitted job, then one
        decode step of every job waiting for its token (one batched step when several do)."""
        while True:
            if not self._admit():
                break
            self._prefill_piece()
            self._decode_step()
        for active in list(self.active):  # stopping: the jobs in progress end cancelled, their sessions kept
            self._finish(active)
        try:
            self.cache.close()  # the store (if any) gets every session it lacks
        except Exception:
            log.exception("writing the cached sessions to the session store failed")

    def _admit(self) -> bool:
        """Take jobs from the queue while fewer than `parallel` run (waiting for one when none runs) -> False
        when the loop must end (stop() was called and nothing runs)."""
        while len(self.active) < self.parallel and not self.stopping.is_set():
            job = self._next(wait=not self.active)
            if job is None:  # none waiting, or stop()'s wake-up
                break
            # the client left while queued (its slot is free), or the server stops: nothing runs
            if job.cancel.is_set() or self.stopping.is_set():
                job.emit(Done("cancelled", 0))
                continue
            active = Active(job)
            self.active.append(active)
            self._guarded(active, self._begin)
        return bool(self.active) or not self.stopping.is_set()

    def _begin(self, a: Active) -> None:
        if self.counted is None:
            self.counted = self.engine.executor.counters.copy()
        a.entry, a.reused = self.cache.acquire(a.job.ids)
        if a.job.started is not None:
            a.job.started(a.reused)
        a.logits = a.entry.logits_at(len(a.job.ids))  # the same prompt again: its logits are kept, nothing to compute
        a.unread = [] if a.logits is not None else a.job.ids[a.reused:]
        if a.logits is not None:
            self._start_reply(a)

    def _prefill_piece(self) -> None:
        """The first admitted job still prefilling runs its prompt: whole when it runs alone, else one piece of
        `piece_tokens` (the others' next tokens wait for at most one piece: README, Serving several agents)."""
        a = next((a for a in self.active if a.run is None and a.entry is not None), None)
        if a is None:
            return
        if a.job.cancel.is_set():  # the client left, or the server stops: the prompt so far stays cached
            self._finish(a)
            return

        def piece(a: Active) -> None:
            alone = all(b is a or b.run is None for b in self.active)
            n = len(a.unread) if alone else self.piece_tokens
            ids, a.unread = a.unread[:n], a.unread[n:]
            # raises -> entry dropped, never cached half-done
            logits = a.entry.session.prefill(ids, last_only=True)[-1]
            if not a.unread:
                # a copy: the engine may reuse its output buffer (a decode graph's), and the sampler reads it
                a.logits = logits
                a.entry.end_logits = (len(a.job.ids), logits.clone())
                self._start_reply(a)
        self._guarded(a, piece)

    def _start_reply(self, a: Active) -> None:
        a.entry.tokens = list(a.job.ids)
        a.run = Generation(a.entry.session, a.logits, JobPicker(a.job, self.logits_hook), a.job.max_tokens, self.eos,
                           cancelled=a.job.cancel.is_set)
        a.steps = a.run.steps()
        self._advance(a, None)

    def _decode_step(self) -> None:
        """Every job waiting for its token's forward: alone through its loop's own forward (which speculates),
        several in one batched step (their sessions' logits are their solo ones: batch_runner.py)."""
        waiting = [a for a in self.active if a.pending is not None]
        if not waiting:
            return
        if len(waiting) == 1:
            a = waiting[0]
            self._guarded(a, lambda a: self._advance(a, a.run.forward(a.pending.token)))
            return
        try:
            logits = decode_together([a.entry.session for a in waiting], [a.pending.token for a in waiting])
        except Exception:  # one failed step: every session in it may hold a half-processed token
            log.exception("the engine failed on a batched decode step of %d sessions", len(waiting))
            for a in waiting:
                a.entry = None
                self._fail(a)
            return
        with self.metrics.lock:
            self.metrics.batched_tokens += len(waiting)
        for a, row in zip(waiting, logits):
            self._guarded(a, lambda a, row=row: self._advance(a, (row, None)))

    def _advance(self, a: Active, sent) -> None:
        """Drive a's loop with what its last Forward asked for, through its events, until it asks for the next
        forward (a.pending) or finishes."""
        a.pending = None
        job = a.job
        while True:
            event = a.steps.send(sent)
            sent = None
            if isinstance(event, Forward):
                a.pending = event
                return
            if isinstance(event, Finished):
                self._finish(a)
                return
            if event.index == 0:
                self.metrics.add_wait(time.perf_counter() - job.arrived)
            reply, stop = job.watch(event.id) if job.watch is not None else (None, False)
            if stop:  # a stop sequence or the end of the tool calls completed on this token
                a.run.stop()
            job.emit(Generated(event.id, event.pick, reply))

    def _guarded(self, a: Active, work) -> None:
        """work(a); a failure fails the job alone (logged with its traceback; the client gets a generic 500)
        and drops its session (it may hold a half-processed token)."""
        try:
            work(a)
        except Exception:
            log.exception("the engine failed on a request of %d prompt tokens", len(a.job.ids))
            a.entry = None
            self._fail(a)

    def _fail(self, a: Active) -> None:
        self._finish(a, failed=True)

    def _finish(self, a: Active, failed: bool = False) -> None:
        """The job is over (its reply finished, cancelled by stop(), or failed): its session back into the cache,
        the metrics counted, its last event sent."""
        if a not in self.active:
            return
        self.active.remove(a)
        run, job, entry = a.run, a.job, a.entry
        gen = run.tokens if run is not None else []
        reason = run.finished.reason if run is not None and run.finished is not None else "cancelled"
        if entry is not None:
            if run is not None:
                entry.tokens = list(job.ids) + gen[:len(entry.session) - len(job.ids)]  # what the session ran
                end_turn = getattr(self.engine, "end_turn", None)
                if end_turn is not None:  # the reply is out: the agent's tool runs; re-place for this session
                    end_turn(entry.session)
            else:  # stopped before its reply began: the session holds the prompt's first tokens
                entry.tokens = list(job.ids[:len(entry.session)])
            self.cache.release(entry)
        d = None
        if self.counted is not None:  # else no job ever got as far as the engine
            counters = self.engine.executor.counters
            d = counters.minus(self.counted)  # the routes since the last job ended (running jobs share steps)
            self.counted = counters.copy()
        with self.metrics.lock:
            m = self.metrics
            m.prompt_tokens += len(job.ids)
            m.prefilled_tokens += len(job.ids) - a.reused
            m.reused_tokens += a.reused
            m.generated_tokens += len(gen)
            if d is not None:
                m.routes_hot += d.routes_hot
                m.routes_cold += d.routes_cold
            adapter = getattr(self.engine, "adapter", None)
            if adapter is not None:
                m.experts_swapped, m.adapt_bytes_uploaded = adapter.stats.swapped, adapter.stats.bytes_uploaded
            m.cancelled += reason == "cancelled" and not failed
            if entry is not None and run is not None:
                m.drafted_tokens += run.drafted
                m.accepted_tokens += run.accepted
        job.emit(Failed(ENGINE_ERROR) if failed else Done(reason, a.reused))


@dataclass(eq=False)
class Active:
    """A job in progress: admitted, prefilling its prompt, then generating."""
    job: Job
    entry: object | None = None          # its prefix-cache entry (None: dropped after a failure)
    reused: int = 0                      # prompt tokens the cache held
    unread: list[int] = field(default_factory=list)  # prompt tokens still to prefill
    logits: torch.Tensor | None = None   # the last prompt token's logits, once prefilled
    run: Generation | None = None        # its reply's loop, once prefilled
    steps: object | None = None          # run.steps(), driven by the worker
    pending: Forward | None = None       # the forward its loop waits for


class JobPicker:
    """The generation loop's picker for a job: its sampler, with its forced tokens first (tool_choice) and the
    server's logits hook (tests script replies with it) applied before every pick, drafts' included."""

    def __init__(self, job: Job, logits_hook=None):
        self.sampler = Sampler(job.sampling, job.constraint)
        self.forced, self.logits_hook = job.forced, logits_hook
        self.generated: list[int] = []  # the reply so far: what the hook sees

    def pick(self, logits: torch.Tensor, peek: bool = False) -> Pick:
        """The next token's Pick from `logits` (a pure function of them and the sampler's state); `peek`: the
        token only (a draft's), no logprobs."""
        if self.logits_hook is not None:
            logits = self.logits_hook(self.generated, logits)
        step = len(self.generated)
        return self.sampler.pick(logits, self.forced[step] if step < len(self.forced) else None, peek)

    def accept(self, token: int) -> None:
        self.generated.append(token)
        self.sampler.accept(token)

    def done(self) -> bool:
        return self.sampler.done()
