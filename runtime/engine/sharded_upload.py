"""Sharded upload-once: every planned GPU uploads and computes a 1/G slice of each distinct cold expert.

A single-link upload (executor.py, mode "upload") copies each distinct cold expert of a layer whole over
the layer's own GPU's link. Sharded, each of the G planned GPUs copies a slice of every such expert over
its own link, so a layer's upload takes all G links at once:
- the slice is along the expert's intermediate axis: GPU g holds rows g*W .. (g+1)*W of the gate/up
  matrices w1, w3 [I, D] and the same columns of the down matrix w2 [D, I], W = I/G. SwiGLU and its clamps
  act on each intermediate element alone (DSV4.md section 3: silu(min(x w1, 10)) * clamp(x w3, -10, 10),
  model/experts.py's swiglu), so each slice's output is exactly its part of the expert's, and the
  expert's output is their sum;
- MXFP4 blocks run along the input axis (32 values to a scale byte, packed low nibble first: w1/w3
  [I, D/2] + scales [I, D/32], w2 [D, I/2] + scales [D, I/32]); a w1/w3 slice is whole rows, a w2 slice
  whole blocks of each row only when W is a multiple of 32, so W must be (slice_width refuses otherwise);
- each GPU copies on its own copy stream into two staging buffers of slices (the plan's upload_group
  slices each), double-buffered as the single-link upload is: group i+1's copy overlaps group i's compute;
  with GPUs w1/w3 slices are contiguous runs of the pinned host row, and where the plan holds it
  (policy.shard_major_copy: the compiler's choice where the host has room) w2's come from a shard-major copy
  of the pinned rows' down matrices (shard_rows.py: host memory beyond the rows, a third of each pinned
  expert), so each copy is one contiguous run of pinned bytes; without it w2's slices are strided views of
  the rows, which torch gathers through a pageable temporary (a copy that holds the host thread);
- the hidden states x [T, D] reach every GPU (a copy: a peer copy on GPUs, a real copy on the CPU twin so
  the exchange costs what it moves); each GPU computes its partial [T, D] float32 over all the layer's
  cold routes; the partials come back to the layer's device and are added to its output in GPU order
  0, 1, .. (a fixed order: the same sums whatever finishes first).

The slices are computed by the engine's own pool compute where it takes any width (slice_compute): on
GPUs the plan's Triton prefill kernels, whose width I is a constexpr argument (templates/triton: Triton
compiles them once for I and once for W, the same code as a module rendered for W); the torch backend
otherwise (the cpu backend's kernel is compiled for the plan's I: the CPU twin's default computes its
slices with torch).

On the CPU twin every planned GPU is the one CPU device: the twin gives each planned GPU a copy stream of
its own (streams.py hands out one per device and role), so its log tells the links apart as a GPU's would.

The plan decides: a plan with policy.shard_threshold (the compiler sets it where the cost model predicts
sharding pays, and counts the slices' staging) loads with the staging, and the engine's prefills of more
tokens than the threshold run sharded (engine/session.py prefill_mode), those between policy.prefill_threshold
and it over the layer's own link. $OSTINATO_UPLOAD overrides the plan for experiments (upload_shards):
"single" loads no slices and never shards; "sharded" (a plan of 2+ GPUs) shards every prefill that uploads
(the executor's upload_as), whatever the plan's shard threshold.
Legend: G shards (planned GPUs), I expert intermediate, W = I/G, D hidden, T tokens, R routes, P slots.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from ostinato.checkpoint.formats import MXFP4_GROUP
from ostinato.checkpoint.reader import PackedExpert
from ostinato.plan import PlanError

from ..kernels.triton_experts import HotPool
from .hot_compute import TorchPoolCompute
from .span_timer import SpanTimer
from .streams import POOL_SIZE, streams_for

ENV = "OSTINATO_UPLOAD"  # "sharded": every planned GPU's link; "single": the layer's own; unset: the plan's
FIELDS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def upload_choice() -> str:
    """$OSTINATO_UPLOAD: "single", "sharded", or "" (unset: the plan decides)."""
    choice = os.environ.get(ENV, "")
    if choice not in ("", "single", "sharded"):
        raise PlanError(f"{ENV} is {choice!r}: one of single, sharded (or unset: the plan's policy.shard_threshold)")
    return choice


def upload_shards(gpus: int, shard_threshold: int | None = None) -> int:
    """How many GPUs share each upload: `gpus` (the plan's hardware.gpus.count) where the plan shards its
    uploads (`shard_threshold`: its policy.shard_threshold) or $OSTINATO_UPLOAD is "sharded", else 1."""
    choice = upload_choice()
    if choice == "single" or (choice == "" and shard_threshold is None):
        return 1
    if gpus < 2:
        why = f"{ENV}=sharded" if choice else f"policy.shard_threshold ({shard_threshold})"
        raise PlanError(f"{why} shares uploads among the plan's GPUs, and it plans {gpus} (hardware.gpus.count): "
                        + (f"unset {ENV} or compile for 2+ GPUs" if choice else "recompile the plan"))
    return gpus


def slice_width(intermediate: int, shards: int) -> int:
    """W = I / G, refused unless it is a whole number of MXFP4 blocks (w2's slices cut its rows' blocks)."""
    if shards < 1 or intermediate % (shards * MXFP4_GROUP):
        raise ValueError(f"moe_intermediate_size {intermediate} does not split into {shards} slices of whole "
                         f"MXFP4 blocks ({MXFP4_GROUP} values): it must be a multiple of {shards * MXFP4_GROUP}")
    return intermediate // shards


def slice_compute(compute, swiglu_limit: float):
    """What computes the slices: the engine's pool compute where it takes pools of any width (any_width:
    triton, torch), else the torch backend."""
    return compute if compute.any_width else TorchPoolCompute(swiglu_limit)


def expert_slice(expert: PackedExpert, shard: int, width: int) -> PackedExpert:
    """Views of shard `shard`'s slice of `expert`: w1/w3 rows [W, D/2] (+ scales [W, D/32]), w2 columns
    [D, W/2] (+ scales [D, W/32]; strided views of its rows)."""
    lo, hi = shard * width, (shard + 1) * width
    rows = [getattr(expert, n)[lo:hi] for n in ("w1", "w1_scale", "w3", "w3_scale")]
    return PackedExpert(*rows, expert.w2[:, lo // 2:hi // 2], expert.w2_scale[:, lo // MXFP4_GROUP:hi // MXFP4_GROUP])


def _on_device(device: torch.device):
    """Launches go to `device` (Triton launches on the current CUDA device, whatever its tensors' device)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def copy_streams(devices: list[torch.device]) -> list:
    """Each planned GPU's copy stream: its device's named "copy" stream (the single-link upload's too).
    Where planned GPUs share a device (the CPU twin), each later one gets a stream of its own, distinct
    from the device's named streams and from the current one, made once here."""
    streams = []
    for device in devices:
        s = streams_for(device)
        stream = s.named(device, "copy")
        if stream in streams:
            held = {*streams, *s.named_streams(device).values(), s.current(device)}
            for _ in range(POOL_SIZE + 1):
                stream = s.new(device)
                if stream not in held:
                    break
            else:
                raise RuntimeError(f"no stream on {device} distinct from the {len(held)} already in use")
        streams.append(stream)
    return streams


class ShardedUpload:
    """The G planned GPUs' staging of slices, and the sharded upload-and-compute of a layer's cold routes."""

    def __init__(self, devices: list[torch.device], staging: list[list[HotPool]], compute, layer_gpus: list[int],
                 threshold: int | None = None, down: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] | None = None):
        """devices [G]: each planned GPU's torch device; staging [G][2]: its two buffers of slices (w1
        [P, W, D/2] ..); compute: a pool compute for pools W wide; layer_gpus: each placed layer's GPU;
        threshold: the plan's policy.shard_threshold, prefills of more tokens run sharded (engine/session.py);
        down: [placed layer] {host row: (w2 [G, D, W/2], w2_scale [G, D, W/32])}, the pinned rows' down matrices
        shard-major (shard_rows.py), what GPU g copies its w2 slices from; None, or a row it lacks: strided
        views of the row (a plan without policy.shard_major_copy, or a CPU run, whose rows are not DMA
        sources)."""
        if len(staging) != len(devices) or any(len(pair) != 2 for pair in staging):
            raise ValueError(f"need two staging buffers on each of the {len(devices)} GPUs")
        self.devices, self.staging, self.compute, self.layer_gpus = devices, staging, compute, layer_gpus
        self.threshold, self.down = threshold, down
        self.group, self.width = staging[0][0].w1.shape[:2]
        self.links = copy_streams(devices)
        self._read_done: dict = {}  # id(staging buffer) -> event after the last compute that read it
        # what crossed each link, for benches and tests (the executor's counters count the whole experts)
        self.bytes_uploaded = [0] * len(devices)  # [G] slices copied host -> GPU g
        self.bytes_exchanged = 0                  # activations out to the other GPUs and partials back

    @property
    def shards(self) -> int:
        return len(self.devices)

    def run(self, layer: int, rows: list[PackedExpert], row_of: torch.Tensor, x: torch.Tensor, token: torch.Tensor,
            expert: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, timer: SpanTimer) -> int:
        """out [T, D] float32 += the routes' (token, expert, weight [R], on the layer's device) weighted
        outputs, every GPU computing its slice of each expert; an expert's host row is rows[row_of[e]].
        -> the number of distinct experts uploaded."""
        distinct = expert.unique()  # sorted cold expert ids touched by this layer
        if distinct.numel() == 0:
            return 0
        home = self.layer_gpus[layer]
        # One host read of the ids for the whole upload (as the single-link upload: a read per group would
        # hold the next group's copies back until the compute queued before them had finished).
        ids = distinct.tolist()
        listed = [ids[i:i + self.group] for i in range(0, len(ids), self.group)]  # on the host: the copies
        groups = [self._routes(distinct[i:i + self.group], token, expert, weight, row_of.numel())
                  for i in range(0, distinct.numel(), self.group)]  # [n groups] (token, slot, weight), every GPU's
        xs, partials = [], []
        for g, device in enumerate(self.devices):  # activations out: every GPU has its own x
            xs.append(x if g == home else self._exchange(x, device))
            partials.append(torch.zeros(out.shape, dtype=torch.float32, device=device))  # [T, D]
        sources = [[self.source(layer, rows, int(row_of[e]), g) for e in ids] for g in range(self.shards)]
        ready = [[self._copy_group(g, sources[g][:len(listed[0])], self.staging[g][0], timer)]
                 for g in range(self.shards)]
        for i, (tok, slot, wgt) in enumerate(groups):
            start = i * self.group
            for g, device in enumerate(self.devices):  # each GPU's group i after its group i+1's copy is queued
                s = streams_for(device)
                if i + 1 < len(groups):
                    nxt = sources[g][start + self.group:start + self.group + len(listed[i + 1])]
                    ready[g].append(self._copy_group(g, nxt, self.staging[g][(i + 1) % 2], timer))
                pool, main = self.staging[g][i % 2], s.current(device)
                s.wait_event(main, ready[g][i])
                with _on_device(device), timer.span("hot_s", device):
                    self.compute.prefill(pool, xs[g], tok.to(device), slot.to(device), wgt.to(device), partials[g])
                self._read_done[id(pool)] = s.record(main)
        for g, partial in enumerate(partials):  # partials back, added in GPU order
            out += partial if g == home else self._exchange(partial, out.device)
        return len(ids)

    def source(self, layer: int, rows: list[PackedExpert], row: int, shard: int) -> PackedExpert:
        """What GPU `shard` copies of host row rows[row]: its slice's w1/w3 rows (contiguous runs of the row) and
        its w2 columns, from the shard-major copy where one is held (contiguous), else strided views."""
        piece = expert_slice(rows[row], shard, self.width)
        held = self.down[layer].get(row) if self.down is not None else None
        if held is None:
            return piece
        w2, w2_scale = held
        return PackedExpert(piece.w1, piece.w1_scale, piece.w3, piece.w3_scale, w2[shard], w2_scale[shard])

    @staticmethod
    def _routes(group: torch.Tensor, token, expert, weight, experts: int):
        """The routes to `group`'s experts: token [r], their slot in a staging buffer [r], weight [r]."""
        local = torch.full((experts,), -1, dtype=torch.int64, device=expert.device)
        local[group] = torch.arange(group.numel(), device=expert.device)
        mine = local[expert] >= 0
        return token[mine], local[expert[mine]], weight[mine]

    def _exchange(self, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A copy of `t` on `device` (a peer copy between GPUs, ordered after both devices' current work by
        torch; a copy on the CPU twin too, where both are the CPU)."""
        self.bytes_exchanged += t.numel() * t.element_size()
        return t.to(device, copy=True)

    def _copy_group(self, g: int, slices: list[PackedExpert], pool: HotPool, timer: SpanTimer):
        """Copy `slices` into `pool`'s first slots on GPU g's copy stream, once the pool's last reader is
        done -> an event after the copy."""
        device, stream = self.devices[g], self.links[g]
        s = streams_for(device)
        if id(pool) in self._read_done:
            s.wait_event(stream, self._read_done[id(pool)])
        with s.on(stream), timer.span("upload_s", device):
            for j, src in enumerate(slices):
                for name in FIELDS:
                    dst = getattr(pool, name)[j]
                    # with GPUs and the shard-major copy every source is one contiguous run of pinned bytes
                    # (source()), so each is one async DMA; without the copy w2's strided slices are gathered
                    # by torch into a pageable temporary first, a copy that holds the host thread
                    dst.copy_(getattr(src, name).view(dst.dtype), non_blocking=True)
                    self.bytes_uploaded[g] += dst.numel()
        return s.record(stream)
