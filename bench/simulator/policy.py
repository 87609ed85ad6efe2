"""What a policy answers for one forward pass, and the per-layer arithmetic the policies share.

Every time comes from the project's cost model (compiler/cost_model.py) fed with a trace's explicit
counts: the simulator has no hardware model of its own.
Legend: T tokens (or decode steps), L layers, E experts, k routes per token.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ostinato.buckets import bucket_pieces
from ostinato.compiler.cost_model import CostModel


@dataclass(frozen=True)
class Forward:
    """One forward pass (a prefill, or a run of decode steps summed): seconds and where they went.
    The parts are summed work, not wall time: concurrent parts overlap inside `seconds`."""
    seconds: float
    gpu_experts_s: float = 0.0
    cpu_experts_s: float = 0.0
    upload_s: float = 0.0
    mode: str = ""
    uploaded: int = 0            # experts that crossed the link


class Policy:
    """A system's rule for where each route runs. Subclasses cite the documented rule they follow."""
    name = "policy"
    reuses_prefix = True   # False: the server keeps no prefix cache, so every turn prefills the whole context

    def __init__(self, cost: CostModel):
        self.cost = cost
        self.k = cost.cfg.num_experts_per_tok
        self.L = len(cost.layers)

    def reset(self) -> None:
        """A new session (caches start cold)."""

    def prefill(self, counts: np.ndarray, n: int) -> Forward:   # counts [L, E]
        raise NotImplementedError

    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, Forward]:   # ids [T, L, k] -> step seconds [T]
        raise NotImplementedError


def _split_sums(counts: np.ndarray, gpu: np.ndarray) -> tuple[list[float], ...]:
    """Per layer (as floats): distinct GPU experts touched, their routes, distinct host experts touched, theirs.
    All layers at once; the sums are of integer counts, so exact in any order."""
    touched = counts > 0
    return tuple((x.sum(axis=1).astype(float).tolist()) for x in (
        touched & gpu, np.where(gpu, counts, 0), touched & ~gpu, np.where(gpu, 0, counts)))


def split_pass(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, mode: str = "split",
               eager: bool = True) -> Forward:
    """Routes to experts with gpu[l, e] run on the layer's GPU, the others on the host kernels,
    concurrently (cost.split_layer with the trace's counts instead of expectations). `eager`: the
    system issues the forward's ops one by one from Python (cost.dispatch_time)."""
    total = g_sum = c_sum = 0.0
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)
    for l in range(counts.shape[0]):
        g = cost.gpu_experts_time(hot_d[l], hot_r[l])
        h = cost.cpu_experts_time(n, cold_d[l], cold_r[l])
        total += cost.overlap(cost.attention_time(l, n) + g, h)
        g_sum, c_sum = g_sum + g, c_sum + h
    return Forward(float(cost.forward_time(total, n, False, eager)), g_sum, c_sum, 0.0, mode)


def upload_pass(cost: CostModel, counts: np.ndarray, n: int, upload: np.ndarray, mode: str,
                eager: bool = True, links: int = 1) -> Forward:
    """Each layer's `upload[l]` experts cross the link once (over `links` GPUs' links at once),
    double-buffered against the previous layer's compute, and every route runs on the GPU
    (cost.upload_prefill with explicit counts)."""
    per, g_sum, u_sum = [], 0.0, 0.0
    k = cost.cfg.num_experts_per_tok
    touched, uploads = (counts > 0).sum(axis=1).tolist(), upload.sum(axis=1).tolist()  # per layer, all at once
    for l in range(counts.shape[0]):
        g = cost.gpu_experts_time(float(touched[l]), float(n * k))
        u = cost.upload_time(float(uploads[l]), links=links)
        per.append((u, cost.attention_time(l, n) + g))
        g_sum, u_sum = g_sum + g, u_sum + u
    return Forward(float(cost.forward_time(cost.pipelined(per), n, False, eager)), g_sum, 0.0, u_sum, mode,
                   int(upload.sum()))


def bucket_pass(cost: CostModel, counts: np.ndarray, n: int, gpu: np.ndarray, buckets: list[int]) -> Forward:
    """A short prefill as fixed-shape bucket steps (cost.bucket_step with the trace's counts): each step
    of T tokens gets T / n of every expert's routes; on a GPU each hot route reads its expert (the step's
    per-route launch), the host's cold part is split-route's; replayed graphs (eager on a cpu-only spec)."""
    total = g_sum = c_sum = 0.0
    hot_d, hot_r, cold_d, cold_r = _split_sums(counts, gpu)   # the same for every step
    for T in bucket_pieces(n, buckets):
        share, step = T / n, 0.0
        for l in range(counts.shape[0]):
            hot_routes, cold_routes = share * hot_r[l], share * cold_r[l]
            hot_reads = min(hot_routes, hot_d[l]) if cost.hw.cpu_only else hot_routes
            g = cost.gpu_experts_time(hot_reads, hot_routes)
            h = cost.cpu_experts_time(T, min(cold_routes, cold_d[l]), cold_routes)
            step += cost.overlap(cost.attention_time(l, T) + g, h)
            g_sum, c_sum = g_sum + g, c_sum + h
        total += float(cost.forward_time(step, T, True, cost.decode_is_eager()))
    return Forward(total, g_sum, c_sum, 0.0, "bucket")


# decode_table's memo per cost model object: a pure function of the model, which is not changed once built
# (with_host_kernel and the like return copies), so each policy's table is computed once, not per decode
_DECODE_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decode_table(cost: CostModel, k: int) -> np.ndarray:
    """[L, k+1] seconds of one decode step's layer when h of its k routes hit GPU-resident experts
    (read-only: remembered per cost model)."""
    tables = _DECODE_TABLES.setdefault(cost, {})
    if k not in tables:
        tables[k] = _decode_table(cost, k)
        tables[k].flags.writeable = False
    return tables[k]


def _decode_table(cost: CostModel, k: int) -> np.ndarray:
    L = len(cost.layers)
    t = np.empty((L, k + 1))
    for l in range(L):
        for h in range(k + 1):
            t[l, h] = cost.overlap(cost.attention_time(l, 1) + cost.gpu_experts_time(h, h),
                                   cost.cpu_experts_time(1, k - h, k - h))
    return t


def static_decode(cost: CostModel, gpu: np.ndarray, ids: np.ndarray, eager: bool | None = None
                  ) -> tuple[np.ndarray, Forward]:
    """Decode steps with a fixed GPU-resident set: per step and layer, the routes that hit it; the step
    is a replayed graph (eager only on a cpu-only spec, or when `eager` says so)."""
    k = ids.shape[2]
    hits = np.take_along_axis(gpu[None], ids, axis=2).sum(axis=2)         # [T, L]
    steps = decode_table(cost, k)[np.arange(ids.shape[1])[None], hits].sum(axis=1)  # [T]
    steps = cost.forward_time(steps, 1, True, cost.decode_is_eager() if eager is None else eager)
    gtab = np.array([cost.gpu_experts_time(h, h) for h in range(k + 1)])
    ctab = np.array([cost.cpu_experts_time(1, k - h, k - h) for h in range(k + 1)])
    return steps, Forward(float(steps.sum()), float(gtab[hits].sum()), float(ctab[hits].sum()), 0.0, "decode")
