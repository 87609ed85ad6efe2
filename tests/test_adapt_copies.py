"""Re-placement's copies as a GPU would run them (runtime/engine/adapter.py), checked on the CPU twin:

- the adapt stream's copy into a freed hot-pool slot waits on an event recorded after the last forward
  that read the pool (the stream twin's log, tests/stream_order.py): nothing but that event orders them;
- a copy that fails is dropped at the next forward boundary with one warning: its expert stays cold,
  the later forwards run and compute what the model computes (the slot's half-written bytes unread);
- with the pinned-arena path forced (tests/test_pinned_arena.py's Pins), every copy source of the upload
  and re-placement pipelines lies in a pinned arena, the rows of experts hot at load included: an
  upload-once of one after its eviction and its re-promotion; the arenas and the held memory are the
  memory model's host rows of experts (compiler/memory_model.py host_expert_bytes).

The adapter copies in a background thread; here `InlineCopier` runs each copy in the calling thread, so
the stream log (whose current stream is per thread) and the dispatch modes see it in order.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import numpy as np
import pytest
import torch
from engine_helpers import IDS, _close, _variant
from graph_safety import storage_of
from stream_order import StreamWork, races
from test_pinned_arena import force_pinning
from torch.utils._python_dispatch import TorchDispatchMode

from ostinato.adaptation import AdaptPolicy
from ostinato.compiler.memory_model import host_expert_bytes
from ostinato.runtime.engine import adapter as adapter_module
from ostinato.runtime.engine.adapter import WEIGHTS, SessionRoutes
from ostinato.runtime.engine.held_memory import held_memory
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.streams import CPU_STREAMS, TwinStream

# every swap the session's own routes ask for (prior 0, no least gain), no budget in the way
EAGER = AdaptPolicy(mode="idle", max_experts=1000, max_bytes=10**12, decay=0.5, prior=0.0, min_gain=0.0)


class InlineCopier:
    """Stands in for the adapter's copy thread: runs each copy at once in the calling thread and hands back
    its outcome as a finished Future."""

    def submit(self, fn, *args) -> Future:
        done = Future()
        try:
            done.set_result(fn(*args))
        except Exception as e:  # what the thread pool would keep in its future
            done.set_exception(e)
        return done

    def shutdown(self, wait: bool = True) -> None:
        pass


def _adapting(compiled, tiny_ckpt, threshold=None, inline=True, **kw):
    """The mixed placement re-placing between turns (EAGER)."""
    plan = _variant(compiled[0], "mixed", threshold)
    engine = load_engine(plan.replace(policy=plan.policy.replace(adapt=EAGER)), tiny_ckpt, device="cpu", **kw)
    if inline:
        engine.adapter._copier.shutdown()
        engine.adapter._copier = InlineCopier()
    return engine


def _swaps_to(engine, wanted: dict[int, tuple[int, int]]) -> SessionRoutes:
    """Route counts under which the rule (prior 0) swaps exactly `wanted` {layer: (promote, evict)}: the
    promoted expert routed most, the evicted one least of the hot ones, the rest of the hot ones alike."""
    hot = engine.adapter.hot()
    routes = SessionRoutes(*hot.shape)
    routes.counts[hot] = 1.0
    for layer, (promote, evict) in wanted.items():
        routes.counts[layer, evict] = 0.0
        routes.counts[layer, promote] = 5.0
    return routes


# ----- the copy waits for the slot's last reader ---------------------------------------------------
@pytest.mark.slow  # every op of the forwards logged
def test_the_adapt_copy_waits_on_an_event_after_the_last_forward_that_read_the_pool(compiled, tiny_ckpt, reference):
    """The torch hot backend: its reads of the pools are torch ops, which the stream log sees."""
    engine = _adapting(compiled, tiny_ckpt, hot_backend="torch", static_decode=False)
    try:
        pools = {storage_of(t) for le in engine.executor.layers for t in vars(le.hot_pool).values()}
        adapt = CPU_STREAMS.named("cpu", "adapt")
        es, ref = engine.new_session(), reference.new_session()
        with CPU_STREAMS.recording() as log, StreamWork(CPU_STREAMS, pools):
            _close(es.prefill(IDS[:8]), ref.prefill(IDS[:8]))    # forwards that read every layer's pool
            swaps = engine.adapter.after_turn(es.routes)         # evict, then copy into the freed slots
            _close(es.prefill(IDS[8:12]), ref.prefill(IDS[8:12]))  # the promoted experts computed from their slots
        assert swaps and engine.adapter.stats.swapped == len(swaps)
        writes = [n for n, e in enumerate(log) if e.op == "write"]
        assert writes and {log[n].stream for n in writes} == {adapt}, "the promoted experts are not copied on the " \
                                                                      "adapt stream"
        found = races(log)
        assert not found, f"{len(found)} unordered pairs, first: {found[0]}"
        # and explicitly: before its first write into a pool, the adapt stream waits on an event recorded on
        # the forwards' stream after their last read of that pool
        recorded = {e.what: n for n, e in enumerate(log) if e.op == "record"}
        for storage in {log[n].what for n in writes}:
            first = next(n for n in writes if log[n].what == storage)
            last_read = max(n for n, e in enumerate(log[:first]) if e.op == "read" and e.what == storage)
            waits = [e.what for e in log[:first] if e.stream == adapt and e.op == "wait_event"]
            assert any(log[recorded[ev]].stream == TwinStream(0) and recorded[ev] > last_read for ev in waits), \
                f"the copy into pool storage {storage:#x} waits on no event after its last read (log[{last_read}])"
    finally:
        engine.close()


# ----- a failed copy -----------------------------------------------------------------------------
def test_a_failed_copy_is_dropped_once_and_its_expert_stays_cold(compiled, tiny_ckpt, reference, monkeypatch, caplog):
    """The first copy writes half an expert into its slot and fails; the other swaps land. Later forwards run,
    compute what the model does (the slot's half-written bytes are read by no route), and say it once."""
    real = adapter_module.Adapter._copy
    failed = []

    def flaky(le, expert, slot, *after):  # after: the event the copy waits on
        if not failed:
            failed.append((id(le), expert))
            le.hot_pool.w1[slot].fill_(0x77)  # a partial copy: garbage in the slot
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(le, expert, slot, *after)
    monkeypatch.setattr(adapter_module.Adapter, "_copy", staticmethod(flaky))
    engine = _adapting(compiled, tiny_ckpt, inline=False)  # the real copy thread: its future holds the error
    try:
        es, ref = engine.new_session(), reference.new_session()
        _close(es.prefill(IDS[:24]), ref.prefill(IDS[:24]))
        with caplog.at_level(logging.WARNING, logger=adapter_module.__name__):
            swaps = engine.adapter.after_turn(es.routes)
            assert len(swaps) >= 2
            engine.adapter.settle(wait=True)  # as a forward boundary does once the copies are done
            token = int(IDS[24])
            for _ in range(4):  # forwards after the failure: none of them raises, each settles again
                a, b = es.decode(token), ref.decode(token)
                _close(a, b)
                token = int(b.argmax())
            _close(es.prefill(IDS[30:40]), ref.prefill(IDS[30:40]))
        [bad] = [s for s in swaps if (id(engine.executor.layers[s.layer]), s.promote) == failed[0]]
        le = engine.executor.layers[bad.layer]
        assert int(le.slot_of[bad.promote]) == -1 and int(le.cold_of[bad.promote]) == bad.promote  # still cold
        assert int(le.slot_of[bad.evict]) == -1 and int(le.cold_of[bad.evict]) == bad.evict    # evicted, cold
        assert not engine.adapter.hot()[bad.layer, bad.promote]
        assert engine.adapter.stats.failed == 1 and engine.adapter.stats.swapped == len(swaps) - 1
        assert not engine.adapter.pending
        lines = [r for r in caplog.records if r.name == adapter_module.__name__]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert f"layer {bad.layer}'s expert {bad.promote} stays cold" in lines[0].getMessage()
        assert "illegal memory access" in lines[0].getMessage()
    finally:
        engine.close()


# ----- every copy source pinned ------------------------------------------------------------------
class CopySources(TorchDispatchMode):
    """Every aten copy_ into a watched storage (the hot pools, the staging buffers): (destination storage,
    source pointer, source bytes)."""

    def __init__(self, watched: set[int]):
        super().__init__()
        self.watched, self.copies = watched, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default and storage_of(args[0]) in self.watched:
            src = args[1]
            self.copies.append((storage_of(args[0]), src.data_ptr(), src.numel() * src.element_size()))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def forced(monkeypatch):
    """Engines load as if on GPUs, over 2 pretend NUMA nodes (test_pinned_arena.force_pinning)."""
    return force_pinning(monkeypatch)


def _row_of(engine) -> dict[int, tuple[int, int]]:
    """Every expert row's tensors by data pointer -> (layer, expert)."""
    return {getattr(p, name).data_ptr(): (layer, e) for layer, le in enumerate(engine.executor.layers)
            for e, p in enumerate(le.cold) for name in WEIGHTS}


@pytest.mark.slow  # the compiled plan (C++ kernels), three engines' worth of forwards
def test_every_copy_source_of_uploads_and_swaps_is_pinned(compiled, tiny_ckpt, forced, reference):
    """Experts hot at load are evicted, uploaded once while cold, then promoted back: each copy, of the
    upload pipeline (into the staging buffers) and of re-placement (into the pools), reads a pinned arena."""
    engine = _adapting(compiled, tiny_ckpt, threshold=16)  # prefills of more than 16 tokens upload
    try:
        ex = engine.executor
        pools = {storage_of(t) for le in ex.layers for t in vars(le.hot_pool).values()}
        staging = {storage_of(t) for le in ex.layers for p in le.staging for t in vars(p).values()}
        at_load = engine.adapter.hot()
        rows = _row_of(engine)
        arenas = forced.arenas
        es, ref = engine.new_session(), reference.new_session()
        with CopySources(pools | staging) as seen:
            _close(es.prefill(IDS[:60]), ref.prefill(IDS[:60]))  # upload: the cold-at-load experts
            routed = es.routes.counts.copy()                       # [L, E] what that prefill routed
            # per layer, evict its most routed hot expert for its most routed cold one
            out = {l: (int(np.flatnonzero(~at_load[l])[routed[l, ~at_load[l]].argmax()]),
                       int(np.flatnonzero(at_load[l])[routed[l, at_load[l]].argmax()])) for l in range(len(ex.layers))}
            assert engine.adapter.after_turn(_swaps_to(engine, out))
            engine.adapter.settle(wait=True)
            assert all(not engine.adapter.hot()[l, h] for l, (_, h) in out.items())
            es2, ref2 = engine.new_session(), reference.new_session()
            _close(es2.prefill(IDS[:60]), ref2.prefill(IDS[:60]))  # upload: the evicted experts too
            back = {l: (h, c) for l, (c, h) in out.items()}  # promote each evicted expert again
            assert engine.adapter.after_turn(_swaps_to(engine, back))
            engine.adapter.settle(wait=True)
            assert (engine.adapter.hot() == at_load).all()
            _close(es2.prefill(IDS[60:70]), ref2.prefill(IDS[60:70]))
        assert seen.copies
        outside = [(dst, ptr) for dst, ptr, n in seen.copies
                   if not any(a <= ptr and ptr + n <= a + size for a, size in arenas)]
        assert not outside, f"{len(outside)} of {len(seen.copies)} copies read memory outside the pinned arenas, " \
                            f"first from row {rows.get(outside[0][1])}"
        uploaded = {rows[ptr] for dst, ptr, _ in seen.copies if dst in staging and ptr in rows}
        promoted = {rows[ptr] for dst, ptr, _ in seen.copies if dst in pools and ptr in rows}
        hot_at_load = {(l, h) for l, (_, h) in out.items()}
        assert hot_at_load & uploaded, "no expert hot at load was uploaded after its eviction"
        assert hot_at_load <= promoted  # every re-promotion copied from its pinned row
        assert {(l, c) for l, (c, _) in out.items()} <= promoted
    finally:
        engine.close()


def test_the_arenas_and_held_memory_are_the_models_host_rows_of_experts(compiled, tiny_ckpt, forced):
    """A re-placing engine pins every expert of its layers, an engine that does not only the cold ones; the
    held memory files them as the memory model counts them, before and after swaps."""
    plan = compiled[0]
    eb = plan.model.expert_bytes
    n_hot = sum(len(lp.hot_experts) for lp in plan.layers)
    n_cold = len(plan.layers) * plan.model.routed_experts - n_hot
    for mode in ("off", "idle"):
        forced.arenas.clear()
        engine = load_engine(_variant(plan, "mixed", None), tiny_ckpt, device="cpu", adapt=mode)
        try:
            want = host_expert_bytes(n_cold, n_hot, eb, mode)
            assert sum(n for _, n in forced.arenas) == sum(want.values())
            host = held_memory(engine, []).rows["host"]
            assert {k: host[k] for k in ("cold_experts", "hot_expert_rows") if k in host} == want
            if mode == "idle":
                engine.adapter._copier.shutdown()
                engine.adapter._copier = InlineCopier()
                hot = engine.adapter.hot()
                swap = {l: (int(np.flatnonzero(~hot[l])[0]), int(np.flatnonzero(hot[l])[0]))
                        for l in range(len(plan.layers))}
                assert len(engine.adapter.after_turn(_swaps_to(engine, swap))) == len(plan.layers)
                engine.adapter.settle(wait=True)
                host = held_memory(engine, []).rows["host"]
                assert {k: host[k] for k in ("cold_experts", "hot_expert_rows")} == want  # one for one
        finally:
            engine.close()
