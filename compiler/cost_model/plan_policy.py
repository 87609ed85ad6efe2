"""Ostinato's policy, priced: how the plan runs a prompt of n tokens and where it switches modes.

The runtime decides nothing the plan could have decided (DESIGN.md), so the plan's choices are made here, from
the pricing of the other modules: a prompt up to the largest bucket runs as bucket steps (buckets.py), a longer
one as the dynamic model's forward, split-route up to policy.prefill_threshold, upload-once above it, sharded
over every link above policy.shard_threshold (eager_mode), the mode chosen once for the whole prompt and every
one of its chunks run in it (chunks.py; runtime/engine/session.py prefill_mode). The compiler sets those
thresholds at the crossovers (crossover, shard_crossover: compiler/passes/cost_model.py) and the buckets by
`choose_buckets`, which keeps the sizes for which every prompt up to the largest is predicted faster as steps
than eagerly. The baselines' own policies live beside their systems in bench/simulator/.
"""

from __future__ import annotations

from ostinato.buckets import largest_bucket_for

MAX_BUCKET = 256  # the largest prefill bucket the compiler considers (its graph pool: 172 MB on V4-Flash)


class PlanPolicy:
    """CostModel's choices for Ostinato's plan (it sets hw and prefill_chunk; the modes' prices are the other
    modules')."""

    def eager_mode(self, n: int, threshold: int | None, shard_threshold: int | None = None) -> str:
        """How the dynamic model runs n tokens under the plan's thresholds (policy.prefill_threshold and
        policy.shard_threshold): split-route up to the first, upload-once above it, sharded above the second."""
        if threshold is None or n <= threshold:
            return "split"
        return "sharded" if shard_threshold is not None and n > shard_threshold else "upload"

    def eager_prefill(self, n: int, threshold: int | None, position: int | None = None,
                      shard_threshold: int | None = None) -> float:
        """A prompt of n tokens after `position` on the dynamic model in eager_mode's choice for all n of them,
        every chunk in that mode (chunks.py), as runtime/engine/session.py runs it."""
        mode = self.eager_mode(n, threshold, shard_threshold)
        if mode == "sharded":
            return self.sharded_prefill(n, position)
        return self.upload_prefill(n, position) if mode == "upload" else self.split_prefill(n, position)

    def prefill(self, n: int, threshold: int | None, buckets: list[int], position: int | None = None,
                shard_threshold: int | None = None) -> float:
        """The plan's choice: bucket steps up to the largest bucket (`buckets` ascending), then eager_prefill."""
        if buckets and 0 < n <= buckets[-1]:
            return self.bucket_prefill(n, buckets, position)
        return self.eager_prefill(n, threshold, position, shard_threshold)

    def crossover(self, limit: int | None = None, position: int | None = None, sharded: bool = False) -> int | None:
        """Largest n for which split-route is still at least as fast as upload-once (None: always, up to `limit`
        tokens: default the longest prompt the plan runs after `position`), both prompts of n tokens after
        `position` as the runtime runs them (in chunks past the plan's prefill chunk); `sharded`: as the faster of
        the single-link and the sharded upload (a plan that holds the slices' staging). On a cpu-only spec always:
        its "upload" is a copy within host memory before the same CPU kernel runs."""
        if self.hw.cpu_only:
            return None
        split = lambda n: self.split_prefill(n, position)    # noqa: E731
        upload = lambda n: self.upload_prefill(n, position)  # noqa: E731
        if sharded and self.shards > 1:
            upload = lambda n: min(self.upload_prefill(n, position), self.sharded_prefill(n, position))  # noqa: E731
        return self._last_win(split, upload, limit or self.longest_prompt(position), self.prefill_chunk)

    def shard_crossover(self, position: int | None = None, limit: int | None = None) -> int | None:
        """Largest n for which the single-link upload is still at least as fast as the sharded one, both prompts of
        n tokens after `position` in chunks as the runtime runs them (0: sharded wins from 1 token); None: sharding
        does not pay at `limit` tokens (default the longest prompt the plan runs after `position`), or the spec
        has one GPU (or none)."""
        if self.shards < 2:
            return None
        single = lambda n: self.upload_prefill(n, position)    # noqa: E731
        sharded = lambda n: self.sharded_prefill(n, position)  # noqa: E731
        return self._last_win(single, sharded, limit or self.longest_prompt(position), self.prefill_chunk)

    @staticmethod
    def _last_win(first, second, limit: int, look_first: int | None = None) -> int | None:
        """Largest n <= limit at which `first` (a function of n) is at least as fast as `second`, found by
        bisection (the two cross once: a fixed cost against a cheaper rate); None: `second` does not win at
        `limit`; 0: it wins from 1. `look_first`: a smaller n tried before `limit` (the prefill chunk: prompts
        past it cost a forward a chunk, many of them at `limit`); if `second` wins there, the crossing is below."""
        if look_first is not None and look_first < limit and second(look_first) < first(look_first):
            limit = look_first
        elif second(limit) >= first(limit):
            return None
        if second(1) < first(1):
            return 0
        lo, hi = 1, limit  # invariant: first wins at lo, second at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if second(mid) < first(mid):
                hi = mid
            else:
                lo = mid
        return lo

    def choose_buckets(self, threshold: int | None, context: int, largest: int = MAX_BUCKET,
                       position: int | None = None, shard_threshold: int | None = None) -> list[int]:
        """Powers of two 2..B for the largest B such that every prompt of n <= B tokens after `position` is
        predicted strictly faster as bucket steps than eagerly (none on a cpu-only spec, where both run eagerly),
        B at most `largest`, the threshold (past it upload-once wins) and context / 3 (a step's warm-up and
        capture runs take 3 of them from position 0)."""
        limit = min(largest, largest_bucket_for(context), threshold if threshold is not None else largest)
        best, sizes, T = [], [], 2
        while T <= limit:
            sizes = sizes + [T]
            eager = lambda n: self.eager_prefill(n, threshold, position, shard_threshold)  # noqa: E731
            if any(self.bucket_prefill(n, sizes, position) >= eager(n) for n in range(1, T + 1)):
                break
            best, T = list(sizes), 2 * T
        return best
