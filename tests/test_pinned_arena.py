"""Cold experts pinned as one arena per NUMA node (runtime/engine/pinned_arena.py), checked without a GPU:
the pin function is replaced by an identity that counts its calls, and torch.Tensor.pin_memory by one
too, so a per-tensor pin (what the loader did before) is counted as well.

- NUMA nodes from /sys cpulists ('0-3,8-11'), one node without that folder;
- the arena: one pin per node whatever the number of experts, views equal to the sources, aligned,
  not overlapping, spread over the nodes by the split rule, each node filled from its own CPUs;
- the real pin registers the arena once and unregisters it after its last view is gone;
- a loaded engine with the arena path forced: at most one pin per node, views equal to the
  checkpoint's bytes, as much as the plan's host row, and the same outputs as the CPU path.
"""

from __future__ import annotations

import gc
import os
import threading

import pytest
import torch
from engine_helpers import IDS, _engine

from ostinato.checkpoint.reader import Checkpoint, PackedExpert
from ostinato.runtime.engine import pinned_arena
from ostinato.runtime.engine.pinned_arena import ALIGN, NumaNode, numa_nodes, parse_cpulist, pinned_experts
from ostinato.runtime.kernels.testing import random_packed_expert

FIELDS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
CPUS = frozenset(os.sched_getaffinity(0))


# ----- NUMA nodes ---------------------------------------------------------------------------------
def test_cpulists_parse():
    assert parse_cpulist("0-3,8-11\n") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("0,2-3") == [0, 2, 3]
    assert parse_cpulist("\n") == []  # a memory-only node
    for bad in ("3-1", "a-b", "0-3;4"):
        with pytest.raises(ValueError, match="not a cpulist"):
            parse_cpulist(bad)


def _sys_nodes(root, cpulists: dict[str, str]):
    for name, text in cpulists.items():
        (root / name).mkdir(parents=True)
        (root / name / "cpulist").write_text(text + "\n")
    (root / "possible").write_text("0-2\n")  # other entries of the folder are not nodes


def test_nodes_from_sys_by_id_with_the_allowed_cpus(tmp_path, monkeypatch):
    _sys_nodes(tmp_path, {"node0": "0-3", "node1": "4-7", "node2": "", "node10": "8-11"})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)))
    assert numa_nodes(tmp_path) == [NumaNode(0, frozenset(range(4))), NumaNode(1, frozenset(range(4, 8))),
                                    NumaNode(10, frozenset(range(8, 12)))]  # node2 has no CPU: left out
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 2, 9})  # a taskset: node1 unreachable
    assert numa_nodes(tmp_path) == [NumaNode(0, frozenset({1, 2})), NumaNode(10, frozenset({9}))]


def test_no_sys_folder_is_one_node(tmp_path):
    assert numa_nodes(tmp_path / "absent") == [NumaNode(0, CPUS)]
    assert numa_nodes()  # this machine: at least one node, each with CPUs
    assert all(n.cpus and n.cpus <= CPUS for n in numa_nodes())


# ----- the arena ----------------------------------------------------------------------------------
class Pins:
    """Stands in for pinned_arena.pin and torch.Tensor.pin_memory: identities that record what they got."""

    def __init__(self, monkeypatch):
        self.arenas, self.tensors = [], 0
        monkeypatch.setattr(pinned_arena, "pin", self.pin)
        original = torch.Tensor.pin_memory

        def pin_memory(t, *args, **kw):
            self.tensors += 1
            return t if not torch.cuda.is_available() else original(t, *args, **kw)
        monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)

    def pin(self, buffer):
        self.arenas.append((buffer.data_ptr(), buffer.nbytes))
        return buffer

    @property
    def calls(self) -> int:
        return len(self.arenas) + self.tensors


def _nodes(n: int) -> list[NumaNode]:
    """n pretend nodes, each on this machine's CPUs (one CPU each where there are enough)."""
    cpus = sorted(CPUS)
    return [NumaNode(k, frozenset([cpus[k]]) if len(cpus) >= n else CPUS) for k in range(n)]


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.nbytes


def check_views(views: list[list[PackedExpert]], sources: list[list[PackedExpert]], arenas) -> None:
    """Each view equals its source (bytes, dtype, shape), starts at an ALIGN multiple inside one of
    `arenas` [(ptr, nbytes)], and no two views overlap."""
    spans = []
    for got_layer, want_layer in zip(views, sources, strict=True):
        for got, want in zip(got_layer, want_layer, strict=True):
            for name in FIELDS:
                g, w = getattr(got, name), getattr(want, name)
                assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous()
                assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
                lo, hi = _span(g)
                assert lo % ALIGN == 0, f"{name} at {lo:#x} is not {ALIGN}-byte aligned"
                assert any(a <= lo and hi <= a + n for a, n in arenas), f"{name} lies outside every arena"
                spans.append((lo, hi))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two views overlap"


@pytest.mark.parametrize("n_nodes", [1, 2, 3])
@pytest.mark.parametrize("D, I", [(64, 64), (32, 32)])  # (32, 32): 32-byte scales, padded to ALIGN
def test_one_pin_per_node_whatever_the_number_of_experts(monkeypatch, n_nodes, D, I):
    pins = Pins(monkeypatch)
    touched = {}
    setaffinity = os.sched_setaffinity

    def record(pid, cpus):  # which CPUs each filling thread ran on
        touched.setdefault(threading.get_ident(), []).append(frozenset(cpus))
        setaffinity(pid, cpus)
    monkeypatch.setattr(os, "sched_setaffinity", record)
    g = torch.Generator().manual_seed(n_nodes)
    sources = [[random_packed_expert(D, I, g) for _ in range(n)] for n in (7, 0, 5, 11)]  # a layer may be all hot
    nodes = _nodes(n_nodes)
    views = pinned_experts(sources, nodes)
    assert len(pins.arenas) == n_nodes and pins.tensors == 0  # 23 experts, 138 tensors: one pin per node
    check_views(views, sources, pins.arenas)
    # the split rule: the i-th expert overall on node i mod n, so each layer spreads over the nodes
    where = [[next(k for k, (a, n) in enumerate(pins.arenas) if a <= e.w1.data_ptr() < a + n) for e in layer]
             for layer in views]
    flat = [k for layer in where for k in layer]
    arena_node = [flat[i] for i in range(n_nodes)]  # arenas are pinned in any order: map them to nodes
    assert flat == [arena_node[i % n_nodes] for i in range(len(flat))]
    assert all(len(set(layer)) == min(n_nodes, len(layer)) for layer in where)
    assert sorted(sorted(cpus) for calls in touched.values() for cpus in calls) == sorted(sorted(n.cpus)
                                                                                      for n in nodes)
    assert threading.get_ident() not in touched  # the loading thread keeps its own affinity
    spans = sorted(n for _, n in pins.arenas)
    padding = sum(pinned_arena.expert_span(e) - e.nbytes for layer in sources for e in layer)
    assert sum(spans) == sum(e.nbytes for layer in sources for e in layer) + padding
    assert (padding == 0) == (D == 64)


def test_nodes_without_experts_get_no_arena(monkeypatch):
    pins = Pins(monkeypatch)
    g = torch.Generator().manual_seed(0)
    sources = [[random_packed_expert(64, 64, g)], []]
    check_views(pinned_experts(sources, _nodes(3)), sources, pins.arenas)
    assert len(pins.arenas) == 1
    assert pinned_experts([[], []], _nodes(2)) == [[], []] and len(pins.arenas) == 1


def test_progress_counts_every_byte_once(monkeypatch):
    Pins(monkeypatch)
    g = torch.Generator().manual_seed(0)
    sources = [[random_packed_expert(64, 64, g) for _ in range(9)]]
    seen = []
    pinned_experts(sources, _nodes(2), progress=seen.append)
    assert len(seen) == 9 and sum(seen) == 9 * sources[0][0].nbytes


class FakeCudart:
    """torch.cuda.cudart() of a CPU build: records registrations; `error` is what cudaHostRegister returns."""

    def __init__(self, error=0):
        self.error, self.registered, self.unregistered = error, [], []

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes, flags))
        return self.error

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


def test_the_real_pin_registers_the_arena_once_and_unregisters_it_after_its_last_view(monkeypatch):
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    g = torch.Generator().manual_seed(0)
    sources = [[random_packed_expert(64, 64, g) for _ in range(4)]]
    views = pinned_experts(sources, _nodes(1))
    [(ptr, nbytes, flags)] = cudart.registered
    assert flags == 1 and nbytes == 4 * sources[0][0].nbytes  # portable: every GPU's context sees it pinned
    assert ptr == min(t.data_ptr() for e in views[0] for t in (e.w1, e.w2))
    keep = views[0][2].w2_scale
    del views
    gc.collect()
    assert cudart.unregistered == []  # one view still reads the arena
    del keep
    gc.collect()
    assert cudart.unregistered == [ptr]


def test_a_failed_pin_names_the_node_and_the_bytes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(error=2))
    g = torch.Generator().manual_seed(0)
    sources = [[random_packed_expert(64, 64, g) for _ in range(3)]]
    nbytes = 3 * sources[0][0].nbytes
    with pytest.raises(RuntimeError, match=rf"NUMA node 7's cold-expert arena \({nbytes:,d} bytes.*CUDA error 2"):
        pinned_experts(sources, [NumaNode(7, CPUS)])


# ----- a loaded engine with the arena path forced ---------------------------------------------------
def force_pinning(monkeypatch) -> Pins:
    """Load engines as if on GPUs (pinned_arena.pinning -> True) over 2 pretend nodes; returns the Pins."""
    pins = Pins(monkeypatch)
    monkeypatch.setattr(pinned_arena, "pinning", lambda devices: True)
    monkeypatch.setattr(pinned_arena, "numa_nodes", lambda: _nodes(2))
    return pins


@pytest.fixture
def forced(monkeypatch):
    return force_pinning(monkeypatch)


@pytest.mark.slow  # the compiled plan (C++ kernels)
@pytest.mark.parametrize("placement", ["mixed", "all-cold"])
def test_a_forced_arena_engine_pins_once_per_node_and_holds_the_checkpoints_bytes(compiled, tiny_ckpt, forced,
                                                                                  placement):
    engine = _engine(compiled, tiny_ckpt, placement)
    layers = engine.executor.layers
    n_cold = sum(int((le.cold_of >= 0).sum()) for le in layers)  # the cold table holds every expert, by id
    assert n_cold >= 2 * len(layers)
    assert 1 <= forced.calls <= 2, f"{forced.calls} pins for {n_cold} cold experts ({6 * n_cold} tensors), 2 nodes"
    assert len(forced.arenas) == 2 and forced.tensors == 0
    with Checkpoint.open(tiny_ckpt) as ckpt:
        sources, pinned = [], []
        for lp, le in zip(engine.plan.layers, layers):
            cold = sorted(set(range(engine.plan.model.routed_experts)) - set(lp.hot_experts))
            assert [int(le.cold_of[e]) for e in cold] == cold  # a cold expert's row is its id
            sources.append([PackedExpert(*(t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t
                                           for t in (getattr(ckpt.expert_packed(lp.layer, e), n) for n in FIELDS)))
                            for e in cold])
            pinned.append([le.cold[e] for e in cold])
        check_views(pinned, sources, forced.arenas)
    for le in layers:  # the CPU kernel reads the arena's bytes
        assert [le.cold_table.ptrs[i] for i in range(6 * len(le.cold))] == [
            getattr(e, n).data_ptr() for e in le.cold for n in FIELDS]
    if placement == "mixed":  # the plan as compiled: the arenas hold its host row for cold experts, no more
        plan = engine.plan
        host = next(m for m in plan.memory if m.device == "host").components
        # the row also counts the MTP block's cold experts, which an engine decoding plainly does not load
        mtp_cold = plan.model.routed_experts - len(plan.mtp.hot_experts) if plan.mtp is not None else 0
        assert sum(n for _, n in forced.arenas) == n_cold * plan.model.expert_bytes
        assert host["cold_experts"] == (n_cold + mtp_cold) * plan.model.expert_bytes
    engine.close()


def _run(engine) -> tuple[list[torch.Tensor], list[int]]:
    """Logits of an upload-mode prefill, a split-mode prefill and 6 greedy decode steps; the tokens."""
    s = engine.new_session()
    logits = [s.prefill(IDS[:60]), s.prefill(IDS[60:70])]
    tokens = [int(logits[-1][-1].argmax())]
    for _ in range(6):
        logits.append(s.decode(tokens[-1]))
        tokens.append(int(logits[-1].argmax()))
    return logits, tokens


@pytest.mark.slow  # the compiled plan (C++ kernels)
def test_a_forced_arena_engine_computes_what_the_mapped_one_does(compiled, tiny_ckpt, monkeypatch):
    plain = _engine(compiled, tiny_ckpt, "mixed", threshold=16)
    want, want_tokens = _run(plain)
    plain.close()
    pins = Pins(monkeypatch)
    monkeypatch.setattr(pinned_arena, "pinning", lambda devices: True)
    monkeypatch.setattr(pinned_arena, "numa_nodes", lambda: _nodes(2))
    arena = _engine(compiled, tiny_ckpt, "mixed", threshold=16)
    assert len(pins.arenas) == 2
    got, got_tokens = _run(arena)
    assert got_tokens == want_tokens
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    c = arena.executor.counters
    assert c.routes_cold > 0 and c.experts_uploaded > 0  # both cold paths read the arena
    arena.close()
