"""Cached sessions keyed by the tokens they hold; each request reuses the longest common prefix.

An agent's conversation grows by appending, so its next request shares everything but the new
turn with the session that served the previous one: only the rest is prefilled. When a request
diverges inside a cached session (an edited earlier message, a regenerated reply) the session is
truncated (only when that keeps at least half of it; otherwise the request starts a new session and
LRU evicts); with keep_branches it is forked instead, so both branches stay cached. The number of
sessions is bounded (LRU eviction): each holds a KV cache.

What is reused is what is not computed again, and `usage` reports exactly that. A session cut inside
its cache is cut back to its nearest snapshot (a turn boundary, model/session.py), never further
forward: the tokens from there on are prefilled with the request's new ones, in one forward, and
counted as prefilled. A prompt sent again whole reuses all of it: the entry keeps the logits of the
last prompt it prefilled (`end_logits`), so not even its last token is recomputed.

With a session store (session_store.py) sessions outlive the process: an evicted session is written
there (write_evicted: worker.py calls it once the reply that evicted it is out), and so is every
session whose tokens changed since it was last written, after an idle period (write_changed) and at
stop (close); a request that a stored file serves better than any session in memory loads it. The
entry's end_logits are written beside it, so a prompt sent again whole after a restart reuses all of it
too (session_store.py).

Not thread-safe by design: one worker owns the cache and the engine (see worker.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


def reusable(n: int, held: int) -> bool:
    """Whether to reuse n tokens of a session holding `held`: all of them, or a diverging match that keeps
    at least half (destroying a long cached session to reuse a few shared tokens, a BOS or a system
    prompt, would cost more than it saves)."""
    return n == held or 2 * n >= held


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evictions: int = 0
    truncations: int = 0
    forks: int = 0
    loaded: int = 0      # hits served by a session read from the store


@dataclass
class Entry:
    session: object          # an EngineSession (or anything with prefill/truncate/rewind_point/fork/len)
    tokens: list[int] = field(default_factory=list)  # exactly the tokens the session has processed
    saved: list[int] | None = None               # its tokens when last written to the store (None: never)
    # (n, [V] logits after the first n tokens): the last prompt this entry prefilled, so that the same
    # prompt again needs no forward at all. Never changed in place (the sampler copies what it adjusts).
    end_logits: tuple[int, object] | None = None

    def reuse(self, ids: list[int]) -> int:
        """How many of ids this entry serves without computing any of them again: the common prefix,
        short of the last prompt token unless its logits are kept, cut back to where the session can
        rewind to without re-prefilling (a snapshot)."""
        n = common_prefix(self.tokens, ids)
        n = n if n == len(ids) and self.logits_at(n) is not None else min(n, len(ids) - 1)
        return self.session.rewind_point(n)

    def logits_at(self, n: int):
        """The kept logits after n tokens, or None."""
        return self.end_logits[1] if self.end_logits is not None and self.end_logits[0] == n else None


class PrefixCache:
    def __init__(self, new_session, capacity: int = 4, keep_branches: bool = False, store=None):
        """`store`: a SessionStore, or None; with one, sessions need state() and adopt() (EngineSession's)."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.new_session, self.capacity, self.keep_branches = new_session, capacity, keep_branches
        self.store = store
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.evicted: list[Entry] = []  # evicted, not written to the store yet
        self.stats = CacheStats()
        self._next = 0

    def __len__(self) -> int:
        return len(self.entries)

    def acquire(self, ids: list[int]) -> tuple[Entry, int]:
        """An entry to serve `ids` with, taken out of the cache, and how many of its tokens are reused
        (Entry.reuse: computed once and never again; all of them when entry.logits_at(len(ids)) holds the
        first token's logits, else at most len(ids) - 1, the last prompt token giving them).
        """
        self.write_evicted()
        best, best_n = None, 0
        for key, e in self.entries.items():
            n = e.reuse(ids)
            if n > best_n and reusable(n, len(e.tokens)):
                best, best_n = key, n
        loaded = self._load(ids, best_n) if self.store is not None else None
        if loaded is not None and loaded[1] <= best_n:  # its rewind point is no better after all
            loaded = None
        if loaded is not None:  # a stored file holds more of the prompt (it stays on disk: nothing to fork)
            entry, best_n = loaded
        elif best is None:
            self.stats.misses += 1
            return Entry(self.new_session()), 0
        else:
            entry = self.entries[best]
            if best_n < len(entry.tokens) and self.keep_branches:  # the cached branch stays; this request
                self.stats.forks += 1                               # gets a copy
                self.entries.move_to_end(best)
                entry = Entry(entry.session.fork(), list(entry.tokens), end_logits=entry.end_logits)
            else:
                del self.entries[best]
        self.stats.hits += 1
        self.stats.reused_tokens += best_n
        if best_n < len(entry.tokens):
            self.stats.truncations += 1
            entry.session.truncate(best_n)  # to a rewind point: nothing is prefilled again
            del entry.tokens[best_n:]
        if entry.end_logits is not None and entry.end_logits[0] > best_n:
            entry.end_logits = None
        return entry, best_n

    def _load(self, ids: list[int], than: int) -> tuple[Entry, int] | None:
        """An entry read from the store that reuses more than `than` tokens of `ids`, and how many; a refused
        file drops out of the store's index, so the next best one is tried."""
        while True:
            name, n = self.store.match(ids)  # len(ids) only where the file keeps the logits after them
            if name is None or n <= than:
                return None
            fresh = self.new_session()
            session = self.store.load(name, fresh.state().model)
            if session is not None:
                fresh.adopt(session)
                self.stats.loaded += 1
                logits = self.store.end_logits(name, n) if n == len(ids) else None
                if n == len(ids) and logits is None:  # refused since the match: the last token is computed
                    n -= 1
                end = (n, logits.to(session.model.layer_devices[-1])) if logits is not None else None  # the head's
                return Entry(fresh, list(session.tokens), list(session.tokens), end), fresh.rewind_point(n)

    def release(self, entry: Entry) -> None:
        """Put a served entry back (most recently used), evicting the least recently used beyond capacity."""
        if len(entry.session) != len(entry.tokens):
            raise AssertionError(f"session holds {len(entry.session)} tokens but {len(entry.tokens)} are recorded")
        if not entry.tokens:
            return
        # an entry whose tokens are a prefix of another's is redundant: the longer one serves both
        for key, e in list(self.entries.items()):
            if common_prefix(e.tokens, entry.tokens) == len(e.tokens):
                del self.entries[key]
        self._next += 1
        self.entries[self._next] = entry
        while len(self.entries) > self.capacity:
            _, old = self.entries.popitem(last=False)
            self.stats.evictions += 1
            if self.store is not None and old.saved != old.tokens:
                self.evicted.append(old)

    # -- the store ------------------------------------------------------------------------------------
    @property
    def idle_s(self) -> float | None:
        """Seconds without a job after which the worker calls write_changed (None: no store)."""
        return self.store.idle_s if self.store is not None else None

    def unsaved(self) -> bool:
        """Whether a session in memory holds tokens the store lacks."""
        return self.store is not None and (bool(self.evicted) or any(e.saved != e.tokens
                                                                     for e in self.entries.values()))

    def write_evicted(self) -> None:
        """Write the sessions evicted since the last call; then they are gone from memory."""
        while self.evicted:
            self._write(self.evicted.pop(0))

    def write_changed(self, busy=lambda: False) -> None:
        """Write the evicted sessions, then each cached one whose tokens changed since it was last written
        (most recently used first), one file at a time until busy() (a job is waiting)."""
        self.write_evicted()
        for e in reversed(list(self.entries.values())):
            if busy():
                return
            if e.saved != e.tokens:
                self._write(e)

    def close(self) -> None:
        """Write every session the store lacks (the server stops); nothing without a store."""
        if self.store is not None:
            self.write_changed()

    def _write(self, e: Entry) -> None:
        # a failed write is logged there, and not retried
        self.store.save(e.tokens, e.session.state(), e.end_logits)
        e.saved = list(e.tokens)
