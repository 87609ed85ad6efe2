"""The placement executor: the model's MoE block hands it a layer's routes; the plan says where they run.

Modes (set per forward by the engine session, from the plan's policy):
- `split` (prefills up to the plan's threshold): routes to the layer's resident hot experts run on
  its device; routes to cold experts run on the CPU kernel over host memory, in a worker thread
  started as soon as the routing is known, so both sides work at once; the device side adds the
  CPU's result only when it needs the layer's output.
- `upload` (longer prefills): the layer's distinct cold experts are copied once into two staging
  buffers of `upload_group` experts (the next group's copy overlapping this group's compute on a
  side stream, engine/streams.py; in order on the CPU) and every route runs on the device.
- `sharded` (longer prefills, on an engine loaded with shard staging: engine/sharded_upload.py): as
  `upload`, but each of the plan's G GPUs uploads and computes a 1/G slice of every distinct cold expert
  over its own link; the partial outputs come back to the layer's device, added in GPU order. An engine
  loaded with a plan that shards (policy.shard_threshold) or with OSTINATO_UPLOAD=sharded holds the slices;
  the session picks `sharded` past the plan's threshold, and under OSTINATO_UPLOAD=sharded every `upload`
  runs sharded (`upload_as`).
- `decode` (one token through the dynamic model): fixed-shape hot launch (top_k route slots,
  padding masked), cold routes on the CPU worker.
`decode_step` is the expert part of the fixed-shape decode step (model/static_decode) that a CUDA
graph captures: no host reads, cold routes through the layer's ColdBridge (a host node in the
graph, a direct call without CUDA); the host counts its routes after the step (`count_decode`).
A compiled CPU step (engine/cpu_step.py) calls it as one opaque op, `torch.ops.ostinato.expert_step`
(`decode_op`): traced as Python it would freeze the ColdTask's trace-time pointers into the graph.
Legend: T tokens, k routes per token, R routes, E experts, D hidden.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ostinato.checkpoint.reader import PackedExpert

from ..kernels.cold_task import ColdBridge, ColdStaging, run_on_host
from ..kernels.cpu_experts import CpuExpertKernel, ExpertTable
from ..kernels.routes import group_flat_routes
from ..kernels.torch_ops import define, handle_tensor, loaded, register
from ..kernels.triton_experts import HotPool
from .counters import Counters, LiveCounters
from .route_tally import RouteTally
from .sharded_upload import ShardedUpload
from .span_timer import SpanTimer
from .streams import streams_for

MODES = ("split", "upload", "sharded", "decode")

define("expert_step(Tensor x, Tensor ids, Tensor w, int layer, Tensor executor) -> Tensor",
       lambda x, ids, w, layer, executor: loaded(executor).host_decode_step(layer, x, ids, w),
       lambda x, ids, w, layer, executor: torch.empty_like(x))


@dataclass
class LayerExperts:
    """Where one layer's experts live under the plan."""
    device: torch.device
    slot_of: torch.Tensor          # [E] int64 on device: hot pool slot, or -1
    cold_of: torch.Tensor          # [E] int64 on CPU: the expert's row in the cold table (its id), or -1 (hot)
    hot_pool: HotPool              # packed hot experts on the device (the only copy: no dequantized one)
    cold: list[PackedExpert]       # [E] every expert in host memory, by id: views of the checkpoint's mmap
                                   # (the cold ones' pinned copies when a GPU is used); a hot expert's row
                                   # is what it is computed from once it is evicted (engine/adapter.py)
    cold_table: ExpertTable | None # their pointers for the CPU kernel (None: every expert hot)
    staging: list[HotPool]         # two upload buffers of `upload_group` experts each, on the device,
                                   # shared by every layer on that device (layers run one at a time)


# A host task's threads by what it reads (its routes x an expert's bytes): a second thread pays only when its
# share outlasts waking it. Measured on the real-vocab preset (2-core AMD EPYC, compiled step): the 8 expert
# tasks of a decode token (~200 KB each) took 1.73 ms on 2 threads against 0.95 ms on one, ~100 us a task to
# wake the second thread; one thread streams ~6 GB/s (bench/row_dots.py, a 16 MB matrix), so a 1 MB share
# (~170 us) is about where a second thread starts to repay its wake-up.
MIN_TASK_BYTES_PER_THREAD = 1 << 20


class PlacementExecutor:
    def __init__(self, layers: list[LayerExperts], pool_compute, cpu_kernel: CpuExpertKernel | None, cpu_threads: int,
                 upload_group: int, expert_bytes: int, compute_dtype: torch.dtype, top_k: int,
                 step_tokens: list[int] = (1,), sharded: ShardedUpload | None = None, decode_threads: int | None = None,
                 decode_tokens=(1,)):
        """`step_tokens`: the token counts of the fixed-shape steps (1: decode; the plan's prefill buckets),
        what the cold bridges' staging is sized and laid out for. `sharded`: every planned GPU's staging of
        expert slices (mode `sharded`); None: uploads go over the layer's own GPU's link only. `decode_threads`:
        the CPU kernel's threads in calls of `decode_tokens` tokens (the decode-sized ones: cpu_threads.py;
        None: cpu_threads in every call)."""
        self.layers, self.compute, self.cpu_kernel = layers, pool_compute, cpu_kernel
        self.cpu_threads, self.upload_group, self.expert_bytes = cpu_threads, upload_group, expert_bytes
        self.decode_threads = cpu_threads if decode_threads is None else min(decode_threads, cpu_threads)
        self.decode_tokens = frozenset(decode_tokens)
        self.dtype, self.top_k = compute_dtype, top_k
        self.mode = "split"
        self.sharded = sharded
        # what the session's `upload` prefills run as: "upload" (one link) or "sharded" (every planned GPU's
        # link); the plan's choice per prompt length is to be wired in here
        self.upload_as = "upload" if sharded is None else "sharded"
        self._counters = Counters()
        self.handle = handle_tensor(register(self))  # for the expert_step op (decode_op)
        self._host_sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # T -> host_decode_step's scratch
        self.timer = SpanTimer(self._counters)  # device time of the hot compute and the uploads
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ostinato-cold")
        self._read_done: dict = {}     # id(staging buffer) -> event after the last compute that read it
        # Decode-step buffers, made before any graph capture (pinned memory and streams cannot be made in one).
        self.max_step_tokens = max_step_tokens = max(step_tokens)
        for le in layers:  # the upload copies' stream, made now rather than inside a forward
            streams_for(le.device).named(le.device, "copy")
        self.staging = {le.device: ColdStaging(cpu_kernel.D, top_k, list(step_tokens), compute_dtype, le.device)
                        for le in layers if le.cold_table is not None}  # one per device, shared by its layers
        self.bridges = [ColdBridge(cpu_kernel, le.cold_table, le.cold_of, self.staging[le.device], self.pool_threads)
                        if le.cold_table is not None else None for le in layers]
        # device -> [max_step_tokens * k] int64: route slot r's token, r // k; a T-token step uses its first T * k
        self._route_token = {le.device: torch.arange(max_step_tokens, device=le.device).repeat_interleave(top_k)
                             for le in layers}
        self._hot_of = torch.stack([le.cold_of < 0 for le in layers])  # [L, E] bool on CPU: counts decode steps
        self._tally = RouteTally(self._hot_of)
        # route_sink(first_layer, expert ids [n, R] int64 on the CPU): told every forward's routes (a session's
        # routing counts, engine/adapter.py); None: nobody listens
        self.route_sink = None
        self.counters = LiveCounters(self._counters, self._settle_counters)  # what callers read (counters.py)

    def _settle_counters(self) -> None:
        """Count the held steps' routes and add the finished spans' times to the running totals."""
        self._tally.flush(self._counters)
        self.timer.settle()

    def hot_mask(self, layers: int) -> torch.Tensor:
        """[layers, E] bool on the CPU, a copy: which experts of the first `layers` layers are hot now."""
        return self._hot_of[:layers].clone()

    def mark_hot(self, layer: int, expert: int, hot: bool) -> None:
        """Count `expert` of `layer` as hot or cold from now on (a re-placement, engine/adapter.py, moved it)."""
        self._tally.flush(self._counters)  # the steps before it, with the hot sets they ran with
        self._hot_of[layer, expert] = hot

    @property
    def upload_shards(self) -> int:
        """How many GPUs share a sharded upload (1: this engine holds no shard staging)."""
        return 1 if self.sharded is None else self.sharded.shards

    def set_mode(self, mode: str) -> None:
        """The mode of the next forwards; `upload` runs as `upload_as`."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        mode = self.upload_as if mode == "upload" else mode
        if mode == "sharded" and self.sharded is None:
            raise ValueError("sharded upload: this engine holds no shard staging (load a plan that shards its "
                             "uploads, policy.shard_threshold, or set OSTINATO_UPLOAD=sharded on a plan of 2+ GPUs)")
        self.mode = mode

    # ----- the contract of the model's MoE block ----------------------------------------------
    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        le = self.layers[layer]
        t, k = expert_ids.shape
        token = torch.arange(t, device=expert_ids.device).repeat_interleave(k)  # [R]
        ids, w = expert_ids.reshape(-1), weights.reshape(-1).float()  # [R]
        slot = le.slot_of[ids]  # [R]
        hot = slot >= 0
        cold = ~hot
        cold_ids = ids[cold]
        c = self._counters
        c.forwards += 1
        c.routes_cold += cold_ids.numel()  # a host read of the mask's count, not another op
        c.routes_hot += ids.numel() - cold_ids.numel()
        c.distinct_cold += int(cold_ids.unique().numel())
        if self.route_sink is not None:
            self.route_sink(layer, ids.reshape(1, -1).cpu())
        out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=le.device)  # [T, D]
        if self.mode in ("upload", "sharded"):
            self._hot(le.hot_pool, x, token[hot], slot[hot], w[hot], out)
            if self.mode == "upload":
                self._upload_and_compute(le, x, token[cold], cold_ids, w[cold], out)
            else:
                n = self.sharded.run(layer, le.cold, le.cold_of, x, token[cold], cold_ids, w[cold], out,
                                     self.timer)
                self._counters.experts_uploaded += n  # each expert once, whole, over the G links
                self._counters.bytes_uploaded += n * self.expert_bytes
            return out.to(x.dtype)
        pending = self._submit_cold(le, x, token[cold], cold_ids, w[cold]) if cold_ids.numel() else None
        if self.mode == "decode":
            self._hot_decode(le, x, token, slot, w, out)
        else:
            self._hot(le.hot_pool, x, token[hot], slot[hot], w[hot], out)
        if pending is not None:
            out += pending.result().to(le.device)
        return out.to(x.dtype)

    # ----- the fixed-shape decode step ---------------------------------------------------------
    def decode_step(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, D], expert_ids / weights [T, k] -> [T, D]: all T * k route slots launched on the device
        (cold ones masked as slot -1) while the CPU computes the cold ones; no host reads, fixed shapes."""
        le, bridge = self.layers[layer], self.bridges[layer]
        T = x.shape[0]
        ids, w = expert_ids.reshape(-1), weights.reshape(-1).float()  # [T * k]
        if bridge is not None:
            bridge.start(x, ids, w)
        out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=le.device)  # [T, D]
        if le.hot_pool.w1.shape[0]:
            self.compute.decode(le.hot_pool, x, le.slot_of[ids], self._route_token[le.device][:ids.numel()], w, out)
        if bridge is not None:
            out = out + bridge.finish(T)
        return out.to(x.dtype)

    def host_decode_step(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
                         ) -> torch.Tensor:
        """decode_step for a layer whose pools are in host memory (the cpu hot backend), in as few torch ops
        as it takes (a compiled step calls it once per layer, engine/cpu_step.py): the kernel's task runs
        twice on x and the routes in place, once over the hot pool (its map: slot_of) and once over the
        cold table (cold_of), and the two sums are added: decode_step's arithmetic, in its order (zero,
        plus the hot sum, plus the cold sum). Other layers go to decode_step."""
        le = self.layers[layer]
        if (le.device.type != "cpu" or not hasattr(self.compute, "pool_table") or not x.is_contiguous()
                or not expert_ids.is_contiguous() or not weights.is_contiguous() or weights.dtype != torch.float32):
            return self.decode_step(layer, x, expert_ids, weights)
        T, D = x.shape
        sums = self._host_sums.get(T)
        if sums is None:  # [hot, cold] float32 [T, D] each, overwritten by each call's tasks
            sums = self._host_sums[T] = tuple(torch.empty(2, T, D).unbind(0))
        hot_table = self.compute.pool_table(le.hot_pool) if le.hot_pool.w1.shape[0] else None
        threads = self.task_threads(expert_ids.numel(), self.pool_threads(T))
        for part, (row_of, table) in enumerate(((le.slot_of, hot_table), (le.cold_of, le.cold_table))):
            if table is None:
                sums[part].zero_()
                continue
            run_on_host(self.cpu_kernel, x, expert_ids, weights, row_of, table, sums[part], threads,
                        f"layer {layer}'s {('hot', 'cold')[part]} expert task")
        out = torch.add(*sums)  # [T, D] float32, a new tensor (the op's result)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def task_threads(self, routes: int, pool: int | None = None) -> int:
        """Threads for a host task over `routes` routes: one per MIN_TASK_BYTES_PER_THREAD of experts it may
        read, at least 1, at most `pool` (None: the plan's, clamped: cpu_threads)."""
        pool = self.cpu_threads if pool is None else pool
        return max(1, min(pool, routes * self.expert_bytes // MIN_TASK_BYTES_PER_THREAD))

    def pool_threads(self, tokens: int) -> int:
        """The CPU kernel's threads in a call of `tokens` tokens: the plan's decode threads in decode-sized calls
        (a decode step, a batched one, the verify step: decode_tokens), the whole pool otherwise (prefill)."""
        return self.decode_threads if tokens in self.decode_tokens else self.cpu_threads

    def decode_op(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """decode_step as one torch op (what a compiled step calls)."""
        return torch.ops.ostinato.expert_step(x, expert_ids, weights, layer, self.handle)

    def count_decode(self, expert_ids: torch.Tensor, seconds: float, first_layer: int = 0) -> None:
        """Host side, after a fixed-shape step: its routes (expert_ids [L, T, k] or [L, k] on the CPU, of layers
        first_layer ..) held for counting (route_tally.py: counted in batches, before the counters are read),
        told to the route sink, and every cold task checked."""
        self._tally.add(first_layer, expert_ids, self._counters)
        if self.route_sink is not None:
            self.route_sink(first_layer, expert_ids)
        for bridge in self.bridges:
            if bridge is not None:
                bridge.check()
        self._counters.decode_step_s += seconds

    # ----- device side ------------------------------------------------------------------------
    def _hot(self, pool: HotPool, x, token, slot, weight, out) -> None:
        with self.timer.span("hot_s", out.device):
            self.compute.prefill(pool, x, token, slot, weight, out)

    def _hot_decode(self, le: LayerExperts, x, token, slot, weight, out) -> None:
        """Fixed shapes: all k route slots are launched; cold ones are padding (slot -1, weight masked)."""
        if le.hot_pool.w1.shape[0]:
            with self.timer.span("hot_s", out.device):
                self.compute.decode(le.hot_pool, x, slot, token, weight, out)

    def _upload_and_compute(self, le: LayerExperts, x, token, expert, weight, out) -> None:
        """The layer's distinct cold experts in groups through the two staging buffers: group i+1's copy
        (on the device's copy stream) overlaps group i's compute (on the current stream). A compute
        waits for its group's copy; a copy into a buffer waits for the last compute that read it (this
        layer's group i-1, or an earlier layer's: the buffers are shared)."""
        distinct = expert.unique()  # sorted cold expert ids touched by this layer
        if distinct.numel() == 0:
            return
        g, s = self.upload_group, streams_for(le.device)
        main, copy = s.current(le.device), s.named(le.device, "copy")
        # One host read of the ids for the whole upload: a read per group would hold each group's copy
        # back until the compute queued before it had finished.
        ids = distinct.tolist()
        groups = [distinct[i:i + g] for i in range(0, distinct.numel(), g)]  # on the device: the compute's
        listed = [ids[i:i + g] for i in range(0, len(ids), g)]                # on the host: the copies
        ready = [self._copy_group(le, listed[0], le.staging[0], copy)]
        for i, group in enumerate(groups):
            if i + 1 < len(groups):  # double buffering: start the next group's copy before computing this one
                ready.append(self._copy_group(le, listed[i + 1], le.staging[(i + 1) % 2], copy))
            pool = le.staging[i % 2]
            s.wait_event(main, ready[i])
            local = torch.full((le.slot_of.numel(),), -1, dtype=torch.int64, device=expert.device)
            local[group] = torch.arange(group.numel(), device=expert.device)
            mine = local[expert] >= 0
            self._hot(pool, x, token[mine], local[expert[mine]], weight[mine], out)
            self._read_done[id(pool)] = s.record(main)
        self._counters.experts_uploaded += distinct.numel()
        self._counters.bytes_uploaded += distinct.numel() * self.expert_bytes

    def _copy_group(self, le: LayerExperts, experts: list[int], pool: HotPool, stream):
        """Copy the cold `experts` into `pool`'s first slots: on `stream` once the pool's last reader is
        done -> an event after the copy; with stream None on the current stream, in order -> None."""
        s = streams_for(le.device)
        if stream is not None and id(pool) in self._read_done:
            s.wait_event(stream, self._read_done[id(pool)])
        with s.on(stream) if stream is not None else nullcontext(), self.timer.span("upload_s", le.device):
            for j, e in enumerate(experts):
                src = le.cold[int(le.cold_of[e])]
                for name in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"):
                    getattr(pool, name)[j].copy_(getattr(src, name).view(getattr(pool, name).dtype),
                                                 non_blocking=stream is not None)
        return s.record(stream) if stream is not None else None

    # ----- CPU side ---------------------------------------------------------------------------
    def _submit_cold(self, le: LayerExperts, x, token, expert, weight):
        x_host = x.detach().to("cpu", torch.float32 if x.dtype == torch.float32 else torch.bfloat16).contiguous()
        return self._worker.submit(self._cold, le, x_host, token.cpu(), expert.cpu(), weight.cpu())

    def _cold(self, le: LayerExperts, x_host, token, expert, weight) -> torch.Tensor:
        start = time.perf_counter()
        out = torch.zeros(x_host.shape[0], x_host.shape[1], dtype=torch.float32)  # [T, D] host
        routes = group_flat_routes(token, le.cold_of[expert], weight, len(le.cold))
        self.cpu_kernel(x_host, routes, le.cold_table, out, self.pool_threads(x_host.shape[0]))
        self._counters.cold_s += time.perf_counter() - start  # the worker thread's own time: the kernel is synchronous
        return out

    def close(self) -> None:
        self._worker.shutdown(wait=True)
