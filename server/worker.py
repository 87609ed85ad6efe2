"""The one thread that runs the engine: jobs are served in arrival order, one forward at a time.

Owning the engine and the prefix cache from a single thread is what keeps the cache consistent:
a cancelled job stops between two forwards, so its session holds exactly the tokens it processed
and goes back into the cache; a job that fails inside a forward drops its session instead.

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

from ostinato.runtime.engine import Generation, Token

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
        self.running: Job | None = None  # the job in progress (stop() cancels it)
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
        """End the loop after the job in progress, which is cancelled: the server stops once it has waited
        its bound for replies in flight (background.py), so nobody reads the rest. Sessions are written."""
        self.stopping.set()
        running = self.running
        if running is not None:
            running.cancel.set()  # stops before its next forward; its session is kept, and written
        try:
            self.jobs.put_nowait(None)  # wakes the loop; a full queue wakes it anyway when the next job ends
        except queue.Full:
            pass

    def _next(self) -> Job | None:
        """The next job (None: stop). The cache's session store gets its writes here, between jobs: sessions
        the last job evicted at once, changed ones after idle_s without a job (prefix_cache.py)."""
        self.cache.write_evicted()
        while self.cache.unsaved() and not self.stopping.is_set():
            try:
                return self.jobs.get(timeout=self.cache.idle_s)
            except queue.Empty:
                self.cache.write_changed(busy=lambda: not self.jobs.empty())
        return self.jobs.get()

    def _loop(self) -> None:
        while not self.stopping.is_set() and (job := self._next()) is not None:
            self.running = job
            # the client left while queued (its slot is free), or the server stops: nothing runs. Checked after
            # `running` is set: a stop() that saw no running job has set `stopping` before this reads it
            if job.cancel.is_set() or self.stopping.is_set():
                self.running = None
                job.emit(Done("cancelled", 0))
                continue
            try:
                self._run(job)
            except Exception:  # a failed forward: logged with its traceback; the client gets a generic 500
                log.exception("the engine failed on a request of %d prompt tokens", len(job.ids))
                job.emit(Failed(ENGINE_ERROR))
            finally:
                self.running = None
        try:
            self.cache.close()  # the store (if any) gets every session it lacks
        except Exception:
            log.exception("writing the cached sessions to the session store failed")

    def _run(self, job: Job) -> None:
        counters = self.engine.executor.counters
        before = counters.copy()
        entry, reused = self.cache.acquire(job.ids)
        if job.started is not None:
            job.started(reused)
        logits = entry.logits_at(len(job.ids))  # the same prompt again: its logits are kept, nothing to compute
        if logits is None:
            # raises -> entry dropped, never cached half-done
            logits = entry.session.prefill(job.ids[reused:], last_only=True)[-1]
            # a copy: the engine may reuse its output buffer (a decode graph's), and the sampler reads it
            entry.end_logits = (len(job.ids), logits.clone())
        entry.tokens = list(job.ids)
        run = Generation(entry.session, logits, JobPicker(job, self.logits_hook), job.max_tokens, self.eos,
                         cancelled=job.cancel.is_set)
        try:
            for event in run:
                if not isinstance(event, Token):
                    continue  # Finished: read below
                if event.index == 0:
                    self.metrics.add_wait(time.perf_counter() - job.arrived)
                reply, stop = job.watch(event.id) if job.watch is not None else (None, False)
                if stop:  # a stop sequence or the end of the tool calls completed on this token
                    run.stop()
                job.emit(Generated(event.id, event.pick, reply))
        except Exception:
            entry = None  # the session may hold a half-processed token: never reuse it
            raise
        finally:
            gen = run.tokens
            reason = run.finished.reason if run.finished is not None else None
            if entry is not None:
                entry.tokens = list(job.ids) + gen[:len(entry.session) - len(job.ids)]  # what the session ran
                end_turn = getattr(self.engine, "end_turn", None)
                if end_turn is not None:  # the reply is out: the agent's tool runs; re-place for this session
                    end_turn(entry.session)
                self.cache.release(entry)
            d = counters.minus(before)
            with self.metrics.lock:
                m = self.metrics
                m.prompt_tokens += len(job.ids)
                m.prefilled_tokens += len(job.ids) - reused
                m.reused_tokens += reused
                m.generated_tokens += len(gen)
                m.routes_hot += d.routes_hot
                m.routes_cold += d.routes_cold
                adapter = getattr(self.engine, "adapter", None)
                if adapter is not None:
                    m.experts_swapped, m.adapt_bytes_uploaded = adapter.stats.swapped, adapter.stats.bytes_uploaded
                m.cancelled += reason == "cancelled"
                if entry is not None:
                    m.drafted_tokens += run.drafted
                    m.accepted_tokens += run.accepted
        job.emit(Done(reason, reused))


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
