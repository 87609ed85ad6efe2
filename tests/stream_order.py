"""Checks over the CPU stream twin's log (runtime/engine/streams.py): what a GPU would run out of order.

On the CPU every piece of work runs when it is issued, so a missing wait changes nothing there; on a
GPU, work on two streams runs in any order the waits allow. `StreamWork` (a TorchDispatchMode) adds
to the twin's log one entry per aten op, on the stream current when it was issued ("run"), and the
reads and writes of watched storages ("read" / "write", what = storage address). Then:

- `races(log)`: happens-before by vector clocks (a stream's clock counts its own entries; waiting on
  a stream merges that stream's clock as it is now, waiting on an event merges the clock the event
  recorded): two accesses to one watched storage on different streams, at least one a write, must be
  ordered by waits, else a GPU may run them either way round;
- `capture_problems(log)`: inside a capture (CUDA's rules for stream capture), work may go only to
  the capture stream and streams forked from it inside the capture (they waited on a captured
  stream or on an event recorded in the capture), and every forked stream must be joined back (the
  capture stream waits on it, after its last work) before the capture ends.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from graph_safety import storage_of
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ostinato.runtime.engine.streams import CpuStreams, Entry


class StreamWork(TorchDispatchMode):
    """Logs each aten op as work on the current stream, and its accesses to `watched` storages."""

    def __init__(self, streams: CpuStreams, watched: set[int] = frozenset()):
        super().__init__()
        self.streams, self.watched = streams, watched

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        log, stream = self.streams.log, self.streams.current()
        if log is None:
            return out
        log.append(Entry(stream, "run", str(func)))
        if not func.is_view:  # views touch no memory
            for arg, value in zip(func._schema.arguments, list(args) + [kwargs.get(a.name) for a in
                                                                        func._schema.arguments[len(args):]]):
                written = arg.alias_info is not None and arg.alias_info.is_write
                for t in tree_leaves(value):
                    if isinstance(t, torch.Tensor) and storage_of(t) in self.watched:
                        log.append(Entry(stream, "write" if written else "read", storage_of(t)))
        return out


def _merge(into: dict, other: dict) -> None:
    for s, n in other.items():
        into[s] = max(into.get(s, 0), n)


def races(log: list[Entry]) -> list[str]:
    """Conflicting accesses to a watched storage on different streams not ordered by waits."""
    clock = defaultdict(dict)  # stream -> {stream: entries of it seen}
    events = {}                # event -> the clock it recorded
    writes, reads = {}, defaultdict(list)  # storage -> last write / reads since: (stream, its count, index)
    found = []
    for n, e in enumerate(log):
        c = clock[e.stream]
        c[e.stream] = c.get(e.stream, 0) + 1
        if e.op == "record":
            events[e.what] = dict(c)
        elif e.op == "wait_event":
            _merge(c, events[e.what])
        elif e.op == "wait_stream":
            _merge(c, clock[e.what])
        elif e.op in ("read", "write"):
            earlier = ([writes[e.what]] if e.what in writes else []) + (reads[e.what] if e.op == "write" else [])
            for stream, count, index in earlier:
                if stream != e.stream and c.get(stream, 0) < count:
                    found.append(f"log[{index}] {log[index].op} on {stream} and log[{n}] {e.op} on {e.stream} "
                                 f"(storage {e.what:#x}) are not ordered")
            mark = (e.stream, c[e.stream], n)
            if e.op == "write":
                writes[e.what], reads[e.what] = mark, []
            else:
                reads[e.what].append(mark)
    return found


def capture_problems(log: list[Entry]) -> list[str]:
    """Breaches of stream capture's rules in every capture of the log."""
    found = []
    for begin in (n for n, e in enumerate(log) if e.op == "capture_begin"):
        origin = log[begin].stream
        end = next(n for n in range(begin, len(log)) if log[n].op == "capture_end" and log[n].stream == origin)
        captured = {origin}
        recorded = {}  # event recorded in the capture -> (its stream, where)
        last_use, joined = {}, {}  # forked stream -> where it was last used / joined back
        for n in range(begin + 1, end):
            e = log[n]
            if e.op == "record" and e.stream in captured:
                recorded[e.what] = (e.stream, n)
                continue
            if e.op in ("wait_stream", "wait_event"):
                source, at = (e.what, n) if e.op == "wait_stream" else recorded.get(e.what, (None, n))
                if source not in captured:
                    if e.stream in captured:
                        found.append(f"log[{n}] {e.stream} waits on work outside the capture on {origin}")
                elif e.stream not in captured:
                    captured.add(e.stream)  # a fork
                elif e.stream == origin:
                    joined[source] = at
            elif e.op == "run" and e.stream not in captured:
                found.append(f"log[{n}] work on {e.stream} inside the capture on {origin}, not forked from it")
            if e.stream != origin:
                last_use[e.stream] = n
        found += [f"{s} forked into the capture on {origin} is not joined back after its last use (log[{n}])"
                  for s, n in last_use.items() if s in captured and joined.get(s, -1) < n]
    return found
