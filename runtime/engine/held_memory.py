"""What a loaded engine really holds, in the plan's terms: bytes per planned device and component.

The plan's memory rows (compiler/memory_model.py) are what placement fitted into each GPU; this
walks the engine's own tensors and files each under the row and component the plan counts it in,
so the two can be compared on any machine (tests map every planned GPU to the CPU;
tests/gpu/test_memory_vs_plan.py also compares with the CUDA allocator). Rows follow the plan's
layer-to-GPU map, not the tensors' devices, so a CPU run still shows which GPU would hold what.

Components that are bounds, not allocations (`BOUNDS`: transient activations and the allocator's
reserve) have no held tensors; `unplanned` lists every other tensor reachable from the engine that
no component claims, by attribute path (the step's 1-token I/O buffers, the torch backend's
dequantization table).

A tensor is counted at its storage's size (a view keeps its whole buffer alive), once. Host rows of
experts are the exception: on the CPU they are views of the memory-mapped checkpoint, with GPUs views
of the pinned arenas, counted by their own bytes: every cold expert's (`cold_experts`) and, in an
engine that re-places (engine/adapter.py), every hot expert's of the model's layers (`hot_expert_rows`:
an eviction computes and uploads from them, a re-promotion copies from them; pinned with GPUs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass

import torch

# plan components that bound memory rather than count it: transient activations (prefill workspace,
# the decode graphs' pools), the allocator's fragmentation reserve, the session snapshots (held
# as turns go by, up to policy.snapshots) and the prefill buckets' graph pool (whose I/O buffers and
# cold-route staging are filed under it but the pool itself is not a tensor) and cuBLAS's workspaces
# (allocated by the library on a stream's first matmul); and the hot experts' rows of the cold tables of an
# engine that does not re-place (and the MTP block's), views of the memory-mapped checkpoint it never reads
BOUNDS = frozenset({"workspace", "cpu_workspace", "decode_graph", "headroom", "kv_snapshots", "prefill_graphs",
                    "mapped_checkpoint",
                    "cublas_workspaces"})


@dataclass
class HeldMemory:
    rows: dict[str, Counter] = field(default_factory=dict)  # "gpu0".. / "host" -> component -> bytes
    unplanned: list[tuple[str, int]] = field(default_factory=list)  # (attribute path, bytes)
    _seen: set = field(default_factory=set)     # (device, storage) counted whole
    _views: set = field(default_factory=set)    # (device, storage) of which views were counted

    def add(self, row: str, component: str, tensors, view_bytes: bool = False) -> None:
        for _, t in tensors:
            storage = (t.device, t.untyped_storage().data_ptr())
            key = (*storage, t.data_ptr()) if view_bytes else storage
            if key in self._seen or t.numel() == 0:
                continue
            self._seen.add(key)
            if view_bytes:
                self._views.add(storage)
            size = t.numel() * t.element_size() if view_bytes else t.untyped_storage().nbytes()
            self.rows.setdefault(row, Counter())[component] += size

    def differences(self, plan, tolerance: float) -> list[str]:
        """Every planned row and held component whose bytes differ by more than `tolerance` (relative)."""
        out = []
        for m in plan.memory:
            held = self.rows.get(m.device, Counter())
            for name in sorted((set(m.components) | set(held)) - BOUNDS):
                want, got = m.components.get(name, 0), held.get(name, 0)
                if abs(got - want) > tolerance * max(want, 1):
                    out.append(f"{m.device} {name}: plan {want:,d} B, held {got:,d} B")
        return out

    def claim_rest(self, tensors) -> None:
        for path, t in tensors:
            storage = (t.device, t.untyped_storage().data_ptr())
            if storage not in self._seen and storage not in self._views and t.numel():
                self._seen.add(storage)
                self.unplanned.append((path, t.untyped_storage().nbytes()))


def tensors_in(obj, path: str = "", seen: set | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(attribute path, tensor) for every tensor reachable from obj through dataclass fields, the
    project's objects' attributes and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.device, torch.dtype)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield from tensors_in(v, f"{path}[{i}]", seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_in(v, f"{path}[{k!r}]", seen)
    elif is_dataclass(obj):
        for f in fields(obj):
            yield from tensors_in(getattr(obj, f.name), f"{path}.{f.name}", seen)
    elif type(obj).__module__.startswith("ostinato") and hasattr(obj, "__dict__"):
        for k, v in vars(obj).items():
            yield from tensors_in(v, f"{path}.{k}", seen)


def held_memory(engine, sessions=()) -> HeldMemory:
    """The engine's tensors (and `sessions`' KV caches) by planned row and component."""
    plan, model, ex = engine.plan, engine.model, engine.executor
    held = HeldMemory()
    gpu = [f"gpu{lp.gpu}" for lp in plan.layers]  # [L] the row of each layer
    step = engine.step_runner.step if engine.step_runner is not None else None
    for l, lw in enumerate(model.weights.layers):
        held.add(gpu[l], "dense_weights", tensors_in(lw))
        le = ex.layers[l]
        held.add(gpu[l], "hot_experts", tensors_in(le.hot_pool))
        held.add(gpu[l], "upload_staging", tensors_in(le.staging))
        _cold_table(held, le, engine.adapter is not None)
        if step is not None:
            held.add(gpu[l], "decode_state", tensors_in(step.state.layers[l]))
        if engine.batcher is not None:  # a state per session of the batched steps
            held.add(gpu[l], "decode_state", tensors_in([slot.state.layers[l] for slot in engine.batcher.slots]))
        for s in sessions:
            held.add(gpu[l], "kv_cache", tensors_in(s.session.cache.layers[l]))
            held.add(gpu[l], "kv_snapshots", tensors_in([snap.layers[l] for snap in s.session.snapshots]))
    runner = engine.step_runner
    if engine.speculative:
        _speculative(held, engine, f"gpu{plan.mtp.gpu}", sessions)
    if runner is not None:
        for T, s in runner.steps.items():
            if T > 1:  # the buckets' own I/O buffers, per segment (the state is the decode step's)
                for i, seg in enumerate(s.segments):
                    held.add(gpu[seg.first_layer], "prefill_graphs", tensors_in(
                        [s.token_in[i], s.streams_in[i], s.streams_out[i], s.expert_ids[i], s.expert_weights[i],
                         s.offsets[i]] + ([s.token, s.logits] if i == len(s.segments) - 1 else [])))
    if ex.sharded is not None:  # each planned GPU's two buffers of expert slices (the plan's upload_staging counts
        for g, pair in enumerate(ex.sharded.staging):  # them beside the whole experts' pair when it shards)
            held.add(f"gpu{g}", "upload_staging", tensors_in(pair))
        if ex.sharded.down is not None:  # the pinned rows' down matrices, shard-major (engine/shard_rows.py)
            held.add("host", "shard_major_down", tensors_in(ex.sharded.down))
    for device, staging in ex.staging.items():  # cold-route staging: sized for the largest bucket
        layer = next(l for l, le in enumerate(ex.layers) if le.device == device)
        held.add(gpu[layer], "prefill_graphs", tensors_in(staging.out_device))
        held.add("host", "prefill_graphs", tensors_in(staging))
    w = model.weights
    held.add(gpu[0], "embedding", tensors_in(w.embed))
    held.add(gpu[-1], "head", tensors_in((w.head, w.norm, w.hc_head)))
    held.claim_rest(tensors_in(engine, "engine"))
    return held


def _speculative(held: HeldMemory, engine, row: str, sessions) -> None:
    """The MTP block (layer index model.layers) and what the steps keep for speculation, on `row`."""
    model, ex, runner = engine.model, engine.executor, engine.step_runner
    le = ex.layers[model.config.n_layers]
    held.add(row, "dense_weights", tensors_in(model.weights.mtp))
    held.add(row, "hot_experts", tensors_in(le.hot_pool))
    _cold_table(held, le, False)  # its experts keep their placement
    for s in sessions:
        held.add(row, "kv_cache", tensors_in(s.drafter.cache))
    if runner is not None:
        held.add(row, "speculative_steps", tensors_in(runner.drafts[1].state.layer))  # its position tensor too
        for d in runner.drafts.values():
            held.add(row, "speculative_steps", tensors_in([d.streams, d.next_ids, d.embedded, d.offsets, d.expert_ids,
                                                           d.expert_weights, d.logits]))
        for s in runner.steps.values():
            held.add(row, "speculative_steps", tensors_in([s.streams] + ([s.all_logits] if s.every_logit else [])))
        held.add(row, "speculative_steps", tensors_in([runner.rollback.layers, runner.rollback.positions]))


def _cold_table(held: HeldMemory, le, re_placed: bool) -> None:
    """A layer's cold table (every expert, by id): its cold experts are host memory the plan counts, and so
    are its hot ones' rows where the layer is `re_placed` (engine/adapter.py evicts to them; pinned copies
    with GPUs, engine/loader.py); else those are views of the mapped checkpoint that nothing reads."""
    cold = le.cold_of >= 0
    held.add("host", "cold_experts", tensors_in([p for e, p in enumerate(le.cold) if cold[e]]), view_bytes=True)
    held.add("host", "hot_expert_rows" if re_placed else "mapped_checkpoint",
             tensors_in([p for e, p in enumerate(le.cold) if not cold[e]]), view_bytes=True)
