"""A fixed-shape step's CPU segment as one compiled call: the CPU's analogue of a CUDA graph.

On a GPU each segment of a step is captured once and replayed (decode_graphs.py). On the CPU the
same segment runs eagerly op by op: ~195 dispatched torch ops per layer per token, whose Python and
dispatcher overhead is most of a small model's decode step. Here the segment (`StaticStep._run_segment`)
is compiled with torch.compile into one call of generated C++ (Inductor, its C++ wrapper: no Python
between the kernels it generates); what it cannot generate stays an opaque op called from that code:
the expert task (`ostinato::expert_step`, the executor's host_decode_step: ctypes into the plan's
kernel) and the LM head (the plan's dense-op kernel over its bf16 rows). The norms, the mHC mixing and
rope (its real-arithmetic twin) are left to Inductor, which fuses them with their neighbours (fused.py,
inductor_generates).

    compiled = compile_segment(step, i)    # at load: traced, generated, built (or found in the cache)
    compiled()                             # each step: the segment, one call

A CPU engine has one decode step per context size (step_runner.py, `decode_steps`); each is a build of its own
(the compressed rows it reads are part of its shapes).

Each call goes straight to the generated code, past Dynamo's per-call check of its guards (`_without_guards`):
that check re-reads, on every token, what the step's own construction fixes for its life (the dtypes,
shapes and strides of its ~150 tensors, its constants, the grad mode and thread count its calls set):
0.6-0.8 ms a token on the real-vocab preset, where the whole step takes ~9. The guards are checked once,
at load, and the guard-free call must give the Dynamo call's output bit for bit, else the Dynamo call stays.

The build is cached by content: Inductor keys its generated code by the traced graph and its inputs'
shapes, so a second load of the same plan finds it (TORCHINDUCTOR_CACHE_DIR, by default a folder in
Ostinato's cache, see `inductor_cache`). Like a capture, the compile runs on a rewound state from
position 0 and checks itself: the compiled segment's logits (or output streams) must equal the eager
segment's to CHECK_TOLERANCE of their scale (1e-5 in float32), else the engine keeps the eager step and says why
(`CompileFailed`: no C++ compiler, a torch without Inductor, a graph break, a mismatch).
Threads: one OpenMP runtime (torch's; the plan's kernels load against it). The head gets the plan's CPU
threads and each experts' task one per megabyte it may read, up to the plan's (executor.task_threads;
both say so in their calls, whatever torch's count is); the generated loops run
single-threaded (INDUCTOR_OPTIONS). The matmuls Inductor leaves to torch get the plan's threads too,
unless every dense matrix of the model is small enough to be read as row dots in the generated code
(model/fp8_matrix.py, ROW_DOT_MAX_ELEMENTS): then only the attention's products over the cache are left,
a few KB to a few hundred KB each, and those run on the calling thread (`graph_threads`).
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch

from ostinato.checkpoint.digest_cache import cache_folders

from ..model.fp8_matrix import ROW_DOT_MAX_ELEMENTS
from ..model.fused import compiled_with, using
from ..model.static_decode.step import StaticStep
from .held_memory import tensors_in

# The check at load, of the output's scale (max |x|): in float32 the compiled segment must equal the eager one
# to 1e-5. In bf16 the two round their intermediates differently (Inductor keeps a fused chain in float32;
# eager rounds every op's result to bf16), which alone moves the logits by about 1e-2 of their scale
# (measured: 8.3e-3 on a V4-Flash slice, 1.3e-2 on the tiny model), so there the check catches a wrong
# build (garbage, a wrong buffer), not rounding.
CHECK_TOLERANCE = {torch.float32: 1e-5}
LOW_PRECISION_CHECK = 0.05
# The generated loops run on the calling thread: a decode step's elementwise work and reductions are a few
# thousand values each, where an OpenMP fork and join costs more than the loop (measured on the real-vocab
# preset, 2 threads: 17 ms a step with them single-threaded, 25 ms parallel). The matmuls, the experts'
# tasks and the head keep the plan's threads.
# C++ wrapper: the generated step calls its kernels from C++, not Python.
INDUCTOR_OPTIONS = {"cpp_wrapper": True, "cpp.threads": 1}
RECOMPILE_LIMIT = 64  # compiled steps per process (Dynamo's default, 8, is below a test run's engines)


class CompileFailed(RuntimeError):
    """The step could not be compiled here, or compiled to something inexact: the reason, for the log."""


def inductor_cache() -> Path:
    """Where Inductor keeps generated steps: $TORCHINDUCTOR_CACHE_DIR if set, else `inductor` beside the
    other caches (digest_cache.cache_folders: $OSTINATO_CACHE_DIR, $XDG_CACHE_HOME/ostinato, ...)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    for folder in cache_folders():
        root = folder.parent / "inductor"
        try:
            root.mkdir(parents=True, exist_ok=True)
            return root
        except OSError:
            continue
    raise CompileFailed("no writable cache folder for Inductor's generated code")


def compile_segment(step: StaticStep, i: int) -> Callable[[], None]:
    """Segment i of `step` (a CPU segment) compiled into one call, checked against the eager segment.
    Leaves the state rewound and stale, as a capture does: the caller loads a cache afterwards."""
    if step.segments[i].device.type != "cpu":
        raise CompileFailed(f"segment {i} is on {step.segments[i].device}: GPU segments are captured, not compiled")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache()))
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    kernels = step.model.dense_ops
    threads = graph_threads(step.model.weights.layers, torch.get_num_threads())
    compiled = torch.compile(step._run_segment, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)

    # what every call of the segment runs in (its guards check the grad mode and the threads)
    context = functools.partial(_in_step, kernels, threads)

    def run() -> None:
        with context():
            compiled(i)

    eager = _output_after(step, i, lambda: step.run_segment(i))
    try:
        got = _output_after(step, i, run)  # the first call traces, generates and builds
    except Exception as e:  # Dynamo / Inductor / the C++ compiler: any of them may refuse
        raise CompileFailed(f"torch.compile of the {step.tokens}-token step's segment {i}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    unguarded = _without_guards(step, i, context)
    if unguarded is not None and torch.equal(_output_after(step, i, unguarded), got):
        run = unguarded
    scale = max(float(eager.abs().max()), 1e-30)
    error = float((got - eager).abs().max()) / scale
    allowed = CHECK_TOLERANCE.get(step.model.dtype, LOW_PRECISION_CHECK)
    if not error <= allowed:
        raise CompileFailed(f"the compiled {step.tokens}-token step's segment {i} differs from the eager one by "
                            f"{error:.2e} of the output's scale (allowed {allowed:g} in {step.model.dtype})")
    return run


def _without_guards(step: StaticStep, i: int, context: Callable[[], AbstractContextManager]
                    ) -> Callable[[], None] | None:
    """The compiled segment i called without Dynamo's per-call check (see the module docstring), or None
    where this torch does not expose it. Dynamo keeps, per code object, its compiled entries, each a guard
    set and the code that calls its generated graph; the entry whose guards pass for (step, i) in the
    step's context is the one every later call would find (the steps of all contexts and engines share
    `_run_segment`'s code), and its code is called straight, with a snapshot of the globals it reads."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        with context():
            entries = [e for e in _debug_get_cache_entry_list(type(step)._run_segment)
                       if e.guard_manager.check({"self": step, "i": i})]
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return None
    if not entries or entries[0].code.co_freevars:
        return None
    call = types.FunctionType(entries[0].code, dict(type(step)._run_segment.__globals__))

    def run() -> None:
        with context():
            call(step, i)
    return run


@contextmanager
def _in_step(kernels, threads: int):
    with torch.no_grad(), compiled_with(kernels), intra_op_threads(threads):
        yield


def _output_after(step: StaticStep, i: int, run_segment: Callable[[], None]) -> torch.Tensor:
    """Segment i's output (the logits, or the streams handed on) after one run from a rewound state on
    token 0 (segment 0) or zero streams: the same input for the eager and the compiled run."""
    step.rewind()
    step.token_in[i].zero_()
    if step.streams_in[i] is not None:
        step.streams_in[i].zero_()
    with using(step.model.dense_ops):
        run_segment()
    out = step.all_logits if i + 1 == len(step.segments) else step.streams_out[i]
    step.rewind()
    return out.clone()


def graph_threads(layer_weights, threads: int) -> int:
    """torch's intra-op threads inside a compiled step (module docstring): 1 when every 2-D matrix of the
    layers is at most ROW_DOT_MAX_ELEMENTS (in a float32 plan: all read as row dots), else `threads`. The
    rule is by size whatever the dtype; it was measured in float32. An aten product called from the step
    costs a fork and join on 2 threads that a small one does not repay (measured on the real-vocab preset,
    eager step, 2 threads against 1: the sliding window's [1, 4, 128] x [128, 16] product 125 against 19 us, a
    [1, 256] x [256, 256] matmul 76 against 52 us)."""
    return 1 if small_matrices(layer_weights) else threads


def small_matrices(layer_weights) -> bool:
    """Whether every 2-D matrix of the layers is at most ROW_DOT_MAX_ELEMENTS (graph_threads' rule)."""
    return max((t.numel() for _, t in tensors_in(layer_weights) if t.dim() == 2), default=0) <= ROW_DOT_MAX_ELEMENTS


# Short prefills on such a model (graph_threads' rule) run their torch ops on one thread too: they are the
# dynamic model's, op by op, each a few hundred microseconds of work. Measured on the real-vocab preset (2-core
# AMD EPYC Zen 4, 2026-12-03, a CPU engine, prefills after 400 tokens, 5 each), ms on 1 / 2 threads: 16 tokens
# 18-24 / 31-37, 60 26-37 / 34-46, 128 37-53 / 48-59, 256 78-91 / 98-154, 512 162-290 / 228-284, 1,024
# 411-848 / 422-647 (no longer a difference). Longer prompts keep the plan's threads.
# (engine/loader.py, Engine.prefill_threads)
ONE_THREAD_PREFILL_TOKENS = 512


@contextmanager
def intra_op_threads(n: int):
    """torch's intra-op thread count set to n for the block (a call costs well under a microsecond)."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
