"""Stream ordering of the CUDA paths, checked on the CPU through the stream twin's log.

No GPU has run these paths; on the CPU their work runs in program order, so a missing wait is
invisible unless the orderings are checked (tests/stream_order.py):
- the checkers themselves, on hand-made logs: an unordered write after a read on another stream, a
  stream not forked into a capture, a fork not joined back;
- upload prefill (executor.py): every copy into a staging buffer happens after the last compute that
  read it, every compute after the copy it reads (3+ groups per layer, so each buffer is reused);
- capture (decode_graphs.py) of a 2-GPU plan's two segments: warm-up on the device's capture stream
  (one device on the CPU, so one stream), inside each capture only that stream and the cold routes'
  side streams forked from it and joined back; afterwards the session decodes exactly;
- the warm-up of a session at max_context - 1 stays within the buffers and the step then decodes
  that last position exactly;
- the engine takes one stream per device and role (capture, cold, copy), distinct from each other and
  from the default stream, however many layers and steps it has: the twin hands out streams from a
  wrapping pool of 32, as torch does; its current stream is per thread, as CUDA's.
"""

import threading

import pytest
import torch
from engine_helpers import IDS, _close, _variant, on_gpus, pipeline_engine
from graph_safety import storage_of
from stream_order import StreamWork, capture_problems, races

from ostinato.runtime.engine.decode_graphs import WARMUP_RUNS, SegmentGraphs
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.streams import CPU_STREAMS, POOL_SIZE, CpuStreams, TwinStream
from ostinato.runtime.model.static_decode import StaticStep


@pytest.fixture(scope="module")
def engine(compiled, tiny_ckpt):
    """Tiny on two planned GPUs (both the CPU), mixed placement, prefills above 16 tokens upload. The torch
    hot backend: its reads of the staging buffers are torch ops, which the stream log sees (the default
    cpu backend reads them inside the C kernel)."""
    e = pipeline_engine(compiled, tiny_ckpt, "mixed", gpus=2, threshold=16, hot_backend="torch")
    yield e
    e.close()


def test_the_checkers_catch_a_missing_wait_fork_or_join():
    s = CpuStreams()
    buf = torch.zeros(4)
    main, side = s.current(), s.new()
    with s.recording() as log, StreamWork(s, {storage_of(buf)}):
        buf.sum()                      # read on main
        with s.on(side):
            buf.fill_(1.0)             # write on side: may run before the read
    assert len(races(log)) == 1
    with s.recording() as log, StreamWork(s, {storage_of(buf)}):
        buf.sum()
        s.wait_event(side, s.record(main))
        with s.on(side):
            buf.fill_(1.0)
        s.wait_stream(main, side)
        buf.sum()
    found = races(log)
    assert not found, f"{len(found)} unordered pairs, first: {found[0]}"

    cap, other = s.new(), s.new()
    with s.recording() as log, StreamWork(s), s.capture(cap):
        buf.sum()
        with s.on(other):          # not forked from the capture stream
            buf.sum()
        s.wait_stream(side, cap)   # forked, never joined
        with s.on(side):
            buf.sum()
    problems = capture_problems(log)
    assert len(problems) == 2 and "not forked" in problems[0] and "not joined" in problems[1], problems


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_upload_copies_and_computes_are_ordered_per_staging_buffer(engine, reference):
    staging = {storage_of(t) for le in engine.executor.layers for pool in le.staging for t in vars(pool).values()}
    before = engine.executor.counters.copy()
    with CPU_STREAMS.recording() as log, StreamWork(CPU_STREAMS, staging):
        _close(engine.new_session().prefill(IDS[:100]), reference.new_session().prefill(IDS[:100]))
    c = engine.executor.counters.minus(before)
    assert c.experts_uploaded > 2 * engine.plan.policy.upload_group * c.forwards  # 3+ groups in some layer
    writers = {e.stream for e in log if e.op == "write"}
    readers = {e.stream for e in log if e.op == "read"}
    assert len(writers) == 1 and readers == {TwinStream(0)} and writers != readers  # copy stream, main stream
    found = races(log)
    assert not found, f"{len(found)} unordered pairs, first: {found[0]}"


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_capture_warms_up_on_its_stream_and_joins_what_it_forks(engine, reference):
    session, ref = engine.new_session(), reference.new_session()
    _close(session.prefill(IDS[:40]), ref.prefill(IDS[:40]))
    graphs = SegmentGraphs(engine.step_runner.step)
    with CPU_STREAMS.recording() as log, StreamWork(CPU_STREAMS):
        graphs.capture()
    assert graphs.captured and not graphs.graphs  # ran to its end; nothing to capture on the CPU
    begins = [n for n, e in enumerate(log) if e.op == "capture_begin"]
    assert len(begins) == len(engine.step_runner.step.segments) == 2
    for begin in begins:
        stream = log[begin].stream
        assert stream != TwinStream(0) and stream == CPU_STREAMS.named("cpu", "capture")
        warm_up = [e for e in log[:begin] if e.op == "run" and e.stream == stream]
        assert warm_up, "no warm-up on the capture stream"
        forks = [e for e in log[begin:] if e.op == "wait_stream" and e.what == stream]
        assert forks, "no side stream forked (the cold routes' host task)"
    problems = capture_problems(log)
    assert not problems, f"{len(problems)} problems, first: {problems[0]}"
    token = int(IDS[40])
    for _ in range(3):  # the runner loads the session again after the capture's runs
        a, b = session.decode(token), ref.decode(token)
        _close(a, b)
        token = int(b.argmax())


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_warm_up_from_a_session_at_max_context_minus_one(engine, reference):
    max_context = 128  # a multiple of every compressor ratio (4, 128): position 128 has no row
    session, ref = engine.new_session(), reference.new_session()
    session.prefill(IDS[:max_context - 1]), ref.prefill(IDS[:max_context - 1])
    step = StaticStep(engine.model, max_context, [lp.gpu for lp in engine.plan.layers])
    step.load(session.session.cache)
    graphs = SegmentGraphs(step)
    graphs.capture()  # WARMUP_RUNS + 1 runs of each segment
    step.load(session.session.cache)
    step.set_tokens([int(IDS[max_context - 1])])
    _close(graphs.run(), ref.decode(int(IDS[max_context - 1])))
    with pytest.raises(ValueError, match=f"max_context={max_context}"):
        graphs.run()
    small = StaticStep(engine.model, WARMUP_RUNS, [lp.gpu for lp in engine.plan.layers])
    with pytest.raises(ValueError, match="beyond max_context"):
        SegmentGraphs(small).capture()


def test_the_twin_current_stream_is_per_thread():
    """As CUDA's: a thread's on(stream) (re-placement's copy thread, engine/adapter.py) leaves the other
    threads' current stream alone, so the log files their work on their own streams."""
    s = CpuStreams()
    side = s.new()
    inside, release = threading.Event(), threading.Event()
    seen = []

    def copier():
        with s.on(side):
            seen.append(s.current())
            inside.set()
            release.wait(10)
    worker = threading.Thread(target=copier)
    worker.start()
    try:
        assert inside.wait(10)
        assert s.current() == TwinStream(0) and seen == [side]
    finally:
        release.set()
        worker.join()


def test_the_twin_pool_wraps_and_named_streams_stay_distinct():
    s = CpuStreams()
    first = s.new()
    for _ in range(POOL_SIZE - 1):
        s.new()
    assert s.new() == first  # torch.cuda.Stream() after 32 others: the same stream again
    s = CpuStreams()
    capture = s.named("cpu", "capture")
    for _ in range(POOL_SIZE - 1):  # someone else draws the rest of the pool: the next draw is `capture` again
        s.new()
    cold, copy = s.named("cpu", "cold"), s.named("cpu", "copy")
    assert len({capture, cold, copy, s.current()}) == 4
    assert s.named("cpu", "cold") is cold  # made once
    with pytest.raises(ValueError, match="role"):
        s.named("cpu", "side")


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_one_stream_per_role_for_every_layer_and_step(compiled, tiny_ckpt):
    """Every layer's cold bridge forks the device's one cold stream, and every step (decode and each bucket,
    over two planned GPUs) warms up and captures on its one capture stream: each capture on a new stream
    would keep its own allocator blocks and cuBLAS workspace, and a stream per layer wraps torch's pool."""
    plan = on_gpus(_variant(compiled[0], "mixed", None), 2)
    engine = load_engine(plan.replace(policy=plan.policy.replace(prefill_buckets=[2, 4])), tiny_ckpt, device="cpu")
    try:
        named = CPU_STREAMS.named_streams("cpu")
        bridges = [b for b in engine.executor.bridges if b is not None]
        assert len(bridges) > 1 and {b.side for b in bridges} == {named["cold"]}
        with CPU_STREAMS.recording() as log:
            for graphs in engine.step_runner.graphs.values():
                graphs.capture()
        assert sorted(engine.step_runner.graphs) == [1, 2, 4]
        assert {e.stream for e in log if e.op == "capture_begin"} == {named["capture"]}
        assert not [e for e in log if e.op == "new"]  # nothing made per step or segment
        assert len({named["capture"], named["cold"], named["copy"], TwinStream(0)}) == 4
    finally:
        engine.close()
