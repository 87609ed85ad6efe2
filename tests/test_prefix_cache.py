"""The prefix cache's reuse is what is not computed again (issue #29): a session cut inside its cache goes
back to a snapshot, never re-prefilling behind the caller's back, and a prompt sent again whole reuses
its kept logits. A fake session counts every token it computes."""

from ostinato.server.prefix_cache import Entry, PrefixCache


class CountingSession:
    """Snapshots at the end of each prefill, as the model's session does; truncate re-prefills from the
    nearest snapshot and counts that work in `recomputed`."""

    def __init__(self):
        self.tokens, self.snapshots, self.computed, self.recomputed = [], [0], 0, 0

    def __len__(self):
        return len(self.tokens)

    def prefill(self, ids, last_only=False):
        self.tokens += list(ids)
        self.computed += len(ids)
        self.snapshots.append(len(self.tokens))
        return [f"logits@{len(self.tokens)}"]

    def decode(self, tok):
        self.tokens.append(tok)
        self.computed += 1
        return f"logits@{len(self.tokens)}"

    def rewind_point(self, n):
        return len(self.tokens) if n >= len(self.tokens) else max(s for s in self.snapshots if s <= n)

    def truncate(self, n):
        start = self.rewind_point(n)
        self.recomputed += n - start
        self.snapshots = [s for s in self.snapshots if s <= n]
        self.tokens = self.tokens[:n]

    def fork(self):
        other = CountingSession()
        other.tokens, other.snapshots = list(self.tokens), list(self.snapshots)
        return other


def serve(cache: PrefixCache, ids: list[int], reply: list[int]) -> tuple[Entry, int]:
    """What worker.Job does with the cache: acquire, prefill what is not reused (or take the kept logits),
    decode the reply but its last token, release."""
    entry, reused = cache.acquire(ids)
    if entry.logits_at(len(ids)) is None:
        entry.end_logits = (len(ids), entry.session.prefill(ids[reused:], last_only=True)[-1])
    entry.tokens = list(ids)
    for t in reply[:-1]:
        entry.session.decode(t)
        entry.tokens.append(t)
    cache.release(entry)
    return entry, reused


def test_the_same_prompt_again_computes_nothing():
    cache = PrefixCache(CountingSession)
    prompt = list(range(10, 30))
    entry, reused = serve(cache, prompt, [1, 2, 3])
    assert reused == 0
    before = entry.session.computed
    entry2, reused = serve(cache, prompt, [1])
    assert reused == len(prompt) and entry2 is entry
    assert entry.session.computed == before and entry.session.recomputed == 0
    assert entry.logits_at(len(prompt)) == f"logits@{len(prompt)}"


def test_a_cut_inside_a_turn_reuses_only_up_to_the_snapshot_before_it():
    cache = PrefixCache(CountingSession)
    turn1 = list(range(100, 140))
    entry, _ = serve(cache, turn1, [7, 8, 9])
    turn2 = turn1 + [7, 8, 9] + list(range(200, 210))
    _, reused = serve(cache, turn2, [5])
    assert reused == len(turn1) + 2  # the session held turn1 and two decoded tokens: all of them reused
    edited = turn2[:-3] + [999, 998, 997]  # the last turn edited: the common prefix ends inside turn 2's prefill
    entry, reused = cache.acquire(edited)
    # snapshots are taken where prefills end: back to turn 1's, the decoded reply is prefilled again
    assert reused == len(turn1) and entry.session.recomputed == 0 and len(entry.session) == reused
    assert entry.end_logits is None  # the kept logits were past the cut
    # a cut inside the decoded reply: likewise
    cache = PrefixCache(CountingSession)
    serve(cache, turn1, [7, 8, 9])
    entry, reused = cache.acquire(turn1 + [7, 6])
    assert reused == len(turn1) and entry.session.recomputed == 0
