"""A line on stderr every few seconds while one long call runs, for calls no progress bar can see into.

A compiled CPU decode step is built by one call (Dynamo traces it, Inductor generates its C++, the compiler
builds it: tens of seconds on a small machine the first time, then found in the cache), so a bar would sit at
0/1 without a word. The ticker says what is being built when it starts, how long it has taken every `every`
seconds, and how long it took at the end:

    with Ticker("building decode step 1/1 for positions up to 1,536", "cached for the next load"):
        graphs.compile_cpu()

Lines go through tqdm.write, so a bar already on the terminal (the loader's) is redrawn below them. They are
shown on a terminal, and elsewhere only when asked ($OSTINATO_PROGRESS=1; =0 silences them on a terminal too):
a server's log or a test's captured stderr stays as it was.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm

PROGRESS_ENV = "OSTINATO_PROGRESS"
TICK_SECONDS = 5.0


def progress_wanted(file: TextIO | None = None) -> bool:
    """$OSTINATO_PROGRESS=1: yes, =0: no; unset (or anything else): whether `file` (stderr) is a terminal."""
    asked = os.environ.get(PROGRESS_ENV, "").strip()
    if asked in ("0", "1"):
        return asked == "1"
    file = sys.stderr if file is None else file
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


class Ticker:
    """Context manager: `what` said at the start, the elapsed time every `every` s, the total at the end."""

    def __init__(self, what: str, note: str = "", every: float | None = None, enabled: bool | None = None,
                 file: TextIO | None = None):
        """`note`: said once, after `what`, at the start (what the wait is for); `every`: seconds between lines
        (TICK_SECONDS); `enabled`: None = progress_wanted()."""
        self.what, self.note, self.file = what, note, file
        self.every = TICK_SECONDS if every is None else every
        self.enabled = progress_wanted(file) if enabled is None else enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def _say(self, text: str) -> None:
        tqdm.write(text, file=self.file if self.file is not None else sys.stderr)

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self._say(f"  {self.what}: {time.perf_counter() - self._start:.0f} s so far")

    def __enter__(self) -> Ticker:
        self._start = time.perf_counter()
        if self.enabled:
            self._say(f"  {self.what}{f' ({self.note})' if self.note else ''} ...")
            self._thread = threading.Thread(target=self._tick, name="ostinato-ticker", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            outcome = "done" if kind is None else f"stopped ({kind.__name__})"
            self._say(f"  {self.what}: {outcome} in {time.perf_counter() - self._start:.1f} s")
