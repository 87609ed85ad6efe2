"""The hot set follows the session: after a turn, swap experts between the hot pools and the cold tables.

`SessionRoutes` counts a session's routes per layer and expert (every forward's, from the routes the
executor already has on the host: its counters read them anyway, so the decode path gains no device
read), decayed after each turn. `Adapter.after_turn(routes)`, called when a turn has ended (the
agent's tool is running), picks the swaps (ostinato/adaptation.py: the plan's policy.adapt) and starts
them; `settle()`, called before every forward, finishes the ones whose upload is done.

A swap of cold expert c for hot expert h of one layer, in three steps, each exact for every forward:
1. now (between forwards): h is evicted: its slot is freed (slot_of[h] = -1) and it is computed from
   its cold-table row (cold_of[h] = h; every expert has a row: engine/loader.py), so forwards meanwhile
   compute it on the CPU, as any cold expert; an event is recorded on the stream the forwards run on
   (the device's current stream: dynamic forwards and graph replays alike), after the last forward
   that could read the slot;
2. in the background: c's packed weights are copied into the freed slot on the device's adapt stream,
   which first waits on that event (without it the copy could overwrite the slot while a forward queued
   before the eviction still reads h from it); no later route maps to that slot, so no forward reads it;
3. at the first forward boundary after the copy is done (settle): slot_of[c] = the slot, cold_of[c] = -1.
   A copy that failed is dropped there, once, with a warning: c stays cold (its row computes it, as
   before), h stays cold, the slot stays free (unused) from then on; forwards go on as before.
Slot tables change only between forwards, in place: the decode graphs read slot_of from device memory
and the cold tasks read cold_of on the host when they run, so nothing is captured again. The pools keep
their size. Every row a swap copies from is page-locked with GPUs (a DMA source, as the uploads'): the
loader puts every expert of the layers that re-place into the pinned arena, the hot ones' rows too
(the plan's host row `hot_expert_rows`), so re-promoting an expert hot at load, or uploading it once
evicted, never copies from pageable memory. The MTP block's experts (speculative decoding) keep their
placement.

Legend: L layers, E experts per layer.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ostinato.adaptation import AdaptPolicy, Swap, choose_swaps

from .executor import PlacementExecutor
from .streams import streams_for

WEIGHTS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
log = logging.getLogger(__name__)


class SessionRoutes:
    """One session's route counts [L, E] float64 (decayed per turn), fed by the executor's route_sink."""

    def __init__(self, layers: int, experts: int):
        self.counts = np.zeros((layers, experts))

    def add(self, first_layer: int, expert_ids: torch.Tensor) -> None:
        """expert_ids [n, R] int64 on the CPU: the routes of layers first_layer .. (beyond L: not counted)."""
        ids = expert_ids.reshape(expert_ids.shape[0], -1).numpy()
        for i, row in enumerate(ids[:max(0, self.counts.shape[0] - first_layer)]):
            self.counts[first_layer + i] += np.bincount(row, minlength=self.counts.shape[1])

    def decay(self, factor: float) -> None:
        self.counts *= factor


@dataclass
class Upload:
    swap: Swap
    slot: int
    done: Future


@dataclass
class AdaptStats:
    swapped: int = 0          # experts promoted (each one evicted another)
    bytes_uploaded: int = 0
    turns: int = 0            # idle periods seen
    failed: int = 0           # uploads that failed: dropped, their expert left cold


class Adapter:
    def __init__(self, executor: PlacementExecutor, planned: np.ndarray, policy: AdaptPolicy, expert_bytes: int):
        """`planned` [L, E] bool: the plan's hot sets (the blend's prior); executor.layers[:L] adapt."""
        self.executor, self.planned, self.policy, self.expert_bytes = executor, planned, policy, expert_bytes
        self.layers = planned.shape[0]
        self.pending: list[Upload] = []
        self.stats = AdaptStats()
        self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ostinato-adapt")
        for le in executor.layers:  # its own copy stream per GPU, made now (not while a graph is captured)
            streams_for(le.device).named(le.device, "adapt")

    def hot(self) -> np.ndarray:
        """[L, E] bool: the placement now (settled swaps only)."""
        return self.executor.hot_mask(self.layers).numpy()

    def after_turn(self, routes: SessionRoutes) -> list[Swap]:
        """A turn ended: pick this idle period's swaps from the session's routes, evict and start the uploads;
        then decay the counts. Nothing new while an earlier period's uploads are still running."""
        self.settle()
        self.stats.turns += 1
        swaps = [] if self.pending else choose_swaps(self.hot(), routes.counts, self.planned, self.policy,
                                                     self.expert_bytes)
        for s in swaps:
            self.pending.append(self._start(s))
        routes.decay(self.policy.decay)
        return swaps

    def settle(self, wait: bool = False) -> int:
        """Promote the experts whose upload is done (all of them, waiting, with `wait`) -> how many. Call
        between forwards only."""
        done = 0
        for up in list(self.pending):
            if not (wait or up.done.done()):
                continue
            self.pending.remove(up)
            error = up.done.exception()
            if error is not None:  # said once, here; raising would fail every later forward the same way
                self.stats.failed += 1
                log.warning("re-placement: layer %d's expert %d stays cold: its upload into hot slot %d failed "
                            "(%s: %s)", up.swap.layer, up.swap.promote, up.slot, type(error).__name__, error)
                continue
            le, c = self.executor.layers[up.swap.layer], up.swap.promote
            streams = streams_for(le.device)
            # the copy is done (its thread waited for it); in stream terms too, for the forwards that read the slot
            streams.wait_event(streams.current(le.device), up.done.result())
            le.slot_of[c] = up.slot
            le.cold_of[c] = -1
            self.executor.mark_hot(up.swap.layer, c, True)
            self.stats.swapped += 1
            self.stats.bytes_uploaded += self.expert_bytes
            done += 1
        return done

    def close(self) -> None:
        self._copier.shutdown(wait=True)

    def _start(self, s: Swap) -> Upload:
        """Step 1 (evict s.evict now) and step 2 (copy s.promote into its slot, in the background)."""
        le = self.executor.layers[s.layer]
        slot = int(le.slot_of[s.evict])
        le.slot_of[s.evict] = -1  # queued on the current stream, before the event
        le.cold_of[s.evict] = s.evict
        self.executor.mark_hot(s.layer, s.evict, False)
        streams = streams_for(le.device)
        freed = streams.record(streams.current(le.device))  # after every forward queued so far: the slot's last readers
        return Upload(s, slot, self._copier.submit(self._copy, le, s.promote, slot, freed))

    @staticmethod
    def _copy(le, expert: int, slot: int, freed):
        """In the copier's thread: `expert`'s row into hot pool `slot` on the adapt stream, once the event
        `freed` (the slot's last reader done) has passed -> an event after the copy, once the copy is done."""
        src, pool = le.cold[int(le.cold_of[expert])], le.hot_pool
        s = streams_for(le.device)
        copy = s.named(le.device, "adapt")
        s.wait_event(copy, freed)
        with s.on(copy):
            for name in WEIGHTS:
                getattr(pool, name)[slot].copy_(getattr(src, name).view(getattr(pool, name).dtype), non_blocking=True)
        copied = s.record(copy)
        s.synchronize(copy)  # settle() sees the future done only once the copy is
        return copied
