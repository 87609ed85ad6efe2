"""A checker for code meant to be captured in a CUDA graph, usable on the CPU.

`GraphSafetyMode` (a TorchDispatchMode) sees every aten op: it records the op with a description of
its arguments and results (tensors as shape/dtype/device type, other arguments by value) and raises
`GraphUnsafe` on ops a graph cannot capture:
- reads of device data on the host: .item() / int() / bool() (aten._local_scalar_dense), equal,
  is_nonzero, _assert_async;
- ops whose output shape depends on data: nonzero, masked_select, unique variants, bincount,
  indexing or index_put with boolean masks, repeat_interleave with tensor repeats (no output_size);
- tensors made from host data inside the step (torch.tensor: aten.lift_fresh), whose values a
  graph would freeze, and device-to-host copies (only visible with a GPU).

Two runs of a fixed-shape step at different positions must give equal traces: equal ops, shapes and
non-tensor arguments (a position-dependent Python value would be frozen into a graph as well).

Each segment of a decode step is captured on its own GPU, so an op in segment i's graph must not
touch a tensor of another segment (a cross-device copy: not capturable, no peer access on RTX 4090s).
With `owners` (storage address -> segment, `segment_owners(step)`: every static buffer of the step)
the mode raises on any op reading or writing another segment's buffer. Storages, not devices: on the
CPU all segments share one device, and this is how a CPU run sees what a GPU run would.

    trace = graph_safe_trace(step.run_segment, 0)
    trace = graph_safe_trace(step.run_segment, 1, owners=segment_owners(step), segment=1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten

HOST_READS = {aten._local_scalar_dense, aten.equal, aten.is_nonzero, aten._assert_async}
DATA_DEPENDENT_SHAPES = {aten.nonzero, aten.masked_select, aten.unique_dim, aten.unique_consecutive, aten._unique,
                         aten._unique2, aten.unique_dim_consecutive, aten.bincount, aten.argwhere}
HOST_DATA = {aten.lift_fresh, aten.lift_fresh_copy}
INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


class GraphUnsafe(RuntimeError):
    pass


class OpRecord(NamedTuple):
    op: str
    inputs: Any
    outputs: Any


def describe(value: Any) -> Any:
    """Tensors -> ("T", shape, dtype, device type); containers recursively; other values as they are."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), str(value.dtype), value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(describe(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, describe(v)) for k, v in sorted(value.items()))
    return value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)


def unsafe_reason(func, args: tuple, kwargs: dict) -> str | None:
    packet = func.overloadpacket
    if packet in HOST_READS:
        return "reads device data on the host"
    if packet in DATA_DEPENDENT_SHAPES:
        return "output shape depends on the data"
    if packet in HOST_DATA:
        return "a tensor made from host data inside the step (its values would be frozen into the graph)"
    if packet in INDEXING and _has_bool_index(args[1]):
        return "boolean-mask indexing (output shape depends on the data)"
    if packet is aten.repeat_interleave and isinstance(args[0 if func is aten.repeat_interleave.Tensor else 1],
                                                       torch.Tensor) and kwargs.get("output_size") is None:
        return "repeat_interleave with tensor repeats and no output_size"
    if _copies_to_host(func, args, kwargs):
        return "device-to-host copy"
    return None


def _has_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _copies_to_host(func, args: tuple, kwargs: dict) -> bool:
    if func.overloadpacket is aten._to_copy:
        target = kwargs.get("device")
        return target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu"
    if func.overloadpacket is aten.copy_:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def segment_owners(step) -> dict[int, int]:
    """A StaticStep's static buffers -> storage address: the segment that owns it (its layers'
    state, its position tensor, its tokens / streams in and out, its routes, its token offsets; the
    logits: the last)."""
    owners = {}
    for i, seg in enumerate(step.segments):
        own = [step.state.positions[i], step.token_in[i], step.streams_in[i], step.streams_out[i],
               step.expert_ids[i], step.expert_weights[i], step.offsets[i]]
        own += [step.logits] if i == len(step.segments) - 1 else []
        for ls in step.state.layers[seg.first_layer:seg.end_layer]:
            own += [ls.window, ls.window_pos, ls.window_offsets]
            own += [t for c in (ls.comp, ls.index) if c is not None
                    for t in (c.kv, c.gate, c.prev_kv, c.prev_gate, c.rows, c.row_ids)]
        owners.update((storage_of(t), i) for t in own if t is not None and t.numel())
    return owners


def traced_step(step, token_ids, owners: dict[int, int]) -> list[list]:
    """One step of `step` (a StaticStep) on token_ids, each segment run under the checker (touching only
    its own buffers) and handed off -> the segments' op traces."""
    step.set_tokens(token_ids)
    step.check_room()
    traces = []
    for i in range(len(step.segments)):
        traces.append(graph_safe_trace(step.run_segment, i, owners=owners, segment=i))
        step.hand_off(i)
    step.note_step()
    return traces


class GraphSafetyMode(TorchDispatchMode):
    """Records every aten op (see the module docstring) and raises GraphUnsafe on uncapturable ones."""

    def __init__(self, owners: dict[int, int] | None = None, segment: int | None = None):
        super().__init__()
        self.trace: list[OpRecord] = []
        self.owners, self.segment = owners or {}, segment

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = unsafe_reason(func, args, kwargs) or self._foreign(args, kwargs)
        if reason is not None:
            raise GraphUnsafe(f"{func}: {reason}")
        out = func(*args, **kwargs)
        self.trace.append(OpRecord(str(func), describe((args, kwargs)), describe(out)))
        return out

    def _foreign(self, args, kwargs) -> str | None:
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and self.owners.get(storage_of(t), self.segment) != self.segment:
                return (f"touches a buffer of segment {self.owners[storage_of(t)]} {describe(t)} inside segment "
                        f"{self.segment} (another device: hand off between segments on the host)")
        return None


def graph_safe_trace(fn: Callable, *args, owners: dict[int, int] | None = None,
                     segment: int | None = None) -> list[OpRecord]:
    """Run fn(*args) under GraphSafetyMode -> its op trace; raises GraphUnsafe at the first uncapturable op
    (with `owners`: also at the first op touching a buffer owned by another segment than `segment`)."""
    with GraphSafetyMode(owners, segment) as mode:
        fn(*args)
    return mode.trace


def first_difference(a: list[OpRecord], b: list[OpRecord]) -> str | None:
    """None when the traces are equal, else where they first differ."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"op {i}: {x} != {y}"
    if len(a) != len(b):
        return f"lengths differ: {len(a)} != {len(b)} ops"
    return None
