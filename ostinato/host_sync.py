"""How the CPU expert pool's per-layer hand-off grows with its threads (issue #58, "Many cores").

A hardware spec's host.task_handoff_s holds the pool's share measured at MEASURED_THREADS threads
(bench/measured/handoff.yaml: omp_pool_wake_barrier, the OpenMP skeleton of one kernel call at 2 threads against 1).
A host with more cores runs the pool with more threads, and its synchronizations cost more. The rule, a bound:

    handoff(T) = task_handoff_s + CHECK_INS_PER_CALL x PER_THREAD_S x max(0, T - MEASURED_THREADS)

Why linear in T. The kernel is built with the system compiler's OpenMP, libgomp, whose barrier is centralized: each
arriving thread decrements one shared counter (config/linux/bar.h, gomp_barrier_wait_start:
`__atomic_add_fetch (&bar->awaited, -1, MEMMODEL_ACQ_REL)`), an atomic read-modify-write that must own the counter's
cache line, so T threads arriving together take T transfers of that line one after another; the last one bumps the
generation, which the others spin on (one broadcast). Threads that arrive early because their share of the work
ended early hide their transfer, so T line transfers per check-in is the most it costs: a bound, not a fit.
(A tree or dissemination barrier, libomp's default "hyper" or GOMP_BARRIER_TYPE=tree, grows as log2 T instead.)

The constants, each with its source:
- CHECK_INS_PER_CALL = 4: the check-ins of all threads on one kernel call's critical path, as bench/handoff_pingpong.c
  builds the call's skeleton: two parallel regions, the first's join, the second's two work-sharing loops' implicit
  barriers and its join (a fork only releases threads that checked in at the dock while idle, off the path).
- PER_THREAD_S = 163.5 ns: llama.cpp PR #9598 (ggml-org/llama.cpp, comment of 2024-09-23, "Here is a run from
  EPYC"): tests/test-barrier (2000 graph nodes, each a tiny Q4_0 matrix-vector product with a barrier after it) in
  the OpenMP build took 2504.67 ns per node at 4 threads and 3158.78 ns at 8, so (3158.78 - 2504.67) / 4 = 163.5 ns
  per added thread per node. All of it is charged to one check-in (a node has at least the barrier after it; the
  shrinking per-thread share of its tiny product offsets little): an upper bound per check-in.
  Cross-check, the mechanism's own cost: a CAS on one shared cache line between two cores of a 64-core Threadripper
  PRO 5995WX takes 70.9 ns on average, 95 ns at most (nviennot/core-to-core-latency, issue #133), and between cores
  of an AMD EPYC 7453 24-30 ns within a core complex, 136-243 ns across (issue #125): the bound sits at the top of
  one-socket figures, and a node of test-barrier holding two check-ins (its product's own barrier and the one
  after it) would give 82 ns, about the 5995WX's mean. So the growth may be half the rule's; not more on one socket.

At 32 threads the rule adds 19.6 us a layer, at 64 threads 40.5 us (the 2-thread pool's own share measured: 2.6 us).

Not covered: oversubscription. With a pool thread descheduled (another process on its core, or more threads than
cores) a check-in waits for the scheduler to run that thread again, a time slice rather than a line transfer: with
another process busy on one of 2 cores the project's 2-thread kernel took 27.5 ms per 1-token call against 2.9 ms
alone (5.8 ms at 1 thread). That is no property of the thread count; runtime/engine/cpu_threads.py keeps the pool
within the cores for that reason, and the rule prices a pool with a core per thread.
"""

from __future__ import annotations

MEASURED_THREADS = 2        # the threads bench/handoff.py measured the pool's share of task_handoff_s at
CHECK_INS_PER_CALL = 4      # all-thread check-ins on one kernel call's critical path (handoff_pingpong.c's skeleton)
PER_THREAD_S = 163.5e-9     # one more arriving thread at one check-in, bound (llama.cpp PR #9598, EPYC, OpenMP)


def barrier_growth_s(threads: int) -> float:
    """Seconds a layer's hand-off adds over the measured one when the expert pool runs `threads` threads (module
    docstring); 0 up to the threads it was measured at."""
    if threads < 1:
        raise ValueError(f"threads {threads}: the expert pool's threads, at least 1")
    return CHECK_INS_PER_CALL * PER_THREAD_S * max(0, threads - MEASURED_THREADS)
