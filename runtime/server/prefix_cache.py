"""Cached sessions keyed by the tokens they hold; each request reuses the longest common prefix.

An agent's conversation grows by appending, so its next request shares everything but the new
turn with the session that served the previous one: only the rest is prefilled. When a request
diverges inside a cached session (an edited earlier message, a regenerated reply) the session is
truncated to the common prefix (only when that keeps at least half of it;
otherwise the request starts a new session and LRU evicts); with keep_branches it is forked instead, so both branches stay
cached. The number of sessions is bounded (LRU eviction): each holds a KV cache.

Not thread-safe by design: one worker owns the cache and the engine (see worker.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


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


@dataclass
class Entry:
    session: object                              # an EngineSession (or anything with prefill/truncate/fork/len)
    tokens: list[int] = field(default_factory=list)  # exactly the tokens the session has processed


class PrefixCache:
    def __init__(self, new_session, capacity: int = 4, keep_branches: bool = False):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.new_session, self.capacity, self.keep_branches = new_session, capacity, keep_branches
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.stats = CacheStats()
        self._next = 0

    def __len__(self) -> int:
        return len(self.entries)

    def acquire(self, ids: list[int]) -> tuple[Entry, int]:
        """An entry to serve `ids` with, taken out of the cache, and how many of its tokens are reused.

        At most len(ids) - 1 tokens are reused: the last prompt token is always prefilled, since its
        logits give the first generated token.
        """
        best, best_n = None, 0
        for key, e in self.entries.items():
            n = min(common_prefix(e.tokens, ids), len(ids) - 1)
            # a diverging match must keep at least half of the entry: destroying a long cached session
            # to reuse a few shared tokens (a BOS, a system prompt) would cost more than it saves
            if n > best_n and (n == len(e.tokens) or 2 * n >= len(e.tokens)):
                best, best_n = key, n
        if best is None:
            self.stats.misses += 1
            return Entry(self.new_session()), 0
        self.stats.hits += 1
        self.stats.reused_tokens += best_n
        entry = self.entries[best]
        if best_n < len(entry.tokens):
            if self.keep_branches:  # the cached branch stays; this request gets a copy
                self.stats.forks += 1
                self.entries.move_to_end(best)
                entry = Entry(entry.session.fork(), list(entry.tokens))
            else:
                del self.entries[best]
            self.stats.truncations += 1
            entry.session.truncate(best_n)
            del entry.tokens[best_n:]
        else:
            del self.entries[best]
        return entry, best_n

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
            self.entries.popitem(last=False)
            self.stats.evictions += 1
