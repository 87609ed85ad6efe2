"""The step watchdog's polling (runtime/engine/watchdog.py), on a simulated clock (nothing here is timed):
it spins without sleeping for SPIN_NS, so a step that ends within that is seen at its first poll after, not
after a sleep that oversleeps (~80 us for sleep(1e-5)); a longer wait then sleeps between polls, the pauses
doubling up to POLL_S[1]; the deadline still holds."""

from __future__ import annotations

import pytest

from ostinato.runtime.engine import watchdog


class SimulatedTime:
    """Stands in for the `time` module the watchdog reads: each clock read costs `tick_ns`; sleep(s) moves the
    clock on by s and is recorded as (when, s)."""

    def __init__(self, tick_ns: int = 1_000):
        self.ns, self.tick_ns, self.sleeps = 0, tick_ns, []

    def perf_counter_ns(self) -> int:
        self.ns += self.tick_ns
        return self.ns

    def monotonic(self) -> float:
        return self.perf_counter_ns() / 1e9

    def sleep(self, seconds: float) -> None:
        self.sleeps.append((self.ns, seconds))
        self.ns += int(seconds * 1e9)


class EventAt:
    """A CUDA event the device reaches at `done_ns` of the simulated clock; counts its queries."""

    def __init__(self, clock: SimulatedTime, done_ns: float):
        self.clock, self.done_ns, self.queries = clock, done_ns, 0

    def query(self) -> bool:
        self.queries += 1
        return self.clock.ns >= self.done_ns


@pytest.fixture
def clock(monkeypatch) -> SimulatedTime:
    clock = SimulatedTime()
    monkeypatch.setattr(watchdog, "time", clock)
    return clock


def test_a_step_that_ends_within_the_spin_is_seen_without_sleeping(clock):
    event = EventAt(clock, done_ns=50_000)  # a step that ends 50 us in: less than one short sleep really takes
    watchdog.wait_done(event, 1.0, "a step")
    assert clock.sleeps == []  # the old watchdog slept 10 us (really ~80) after its first poll
    assert event.queries > 1 and clock.ns < 50_000 + 2 * clock.tick_ns  # polled until done, seen at once
    assert watchdog.SPIN_NS > 50_000


def test_a_longer_wait_sleeps_after_the_spin_with_growing_pauses(clock):
    done = 3 * watchdog.SPIN_NS + 2e6  # 2 ms after three spin windows: the pauses reach their cap
    event = EventAt(clock, done_ns=done)
    watchdog.wait_done(event, 1.0, "a step")
    assert clock.sleeps, "a long wait must idle, not spin to the end"
    first_at = clock.sleeps[0][0]
    assert watchdog.SPIN_NS <= first_at <= watchdog.SPIN_NS + 2 * clock.tick_ns  # no sleep before the spin ends
    pauses = [s for _, s in clock.sleeps]
    assert pauses[0] == watchdog.POLL_S[0] and max(pauses) == watchdog.POLL_S[1]
    assert all(b == min(2 * a, watchdog.POLL_S[1]) for a, b in zip(pauses, pauses[1:], strict=False))
    assert clock.ns - done <= watchdog.POLL_S[1] * 1e9 + 2 * clock.tick_ns  # seen within one pause of the end


def test_the_deadline_holds_through_the_spin_and_the_sleeps(clock, monkeypatch):
    never = EventAt(clock, done_ns=float("inf"))
    with pytest.raises(TimeoutError, match="a step has not finished after 0 s"):
        watchdog.wait_done(never, 0.01, "a step")
    assert 0.01e9 < clock.ns <= 0.01e9 + watchdog.POLL_S[1] * 1e9 + 2 * clock.tick_ns
    quick = SimulatedTime()
    assert watchdog.SPIN_NS > 5 * quick.tick_ns  # a deadline inside the spin window still raises
    monkeypatch.setattr(watchdog, "time", quick)
    with pytest.raises(TimeoutError):
        watchdog.wait_done(EventAt(quick, float("inf")), 5e-6, "a step")
    assert quick.sleeps == []
