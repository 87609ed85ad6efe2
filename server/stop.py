"""Stop sequences: a matcher that cuts streamed text at the first one (the request models check the
`stop` field: openai_api/generation.py, anthropic_api/messages.py).

The reply ends at the first stop sequence, which is never sent. Text reaches the client in pieces,
so a piece ending with the start of a stop sequence ("\\nUs" with stop "\\nUser:") is held back until
the next piece says whether the sequence completes; a whole reply and a stream are cut alike.

    m = StopMatcher(("\\nUser:",))
    m.feed("Hi\\nUs")    -> ("Hi", False)        "\\nUs" held back
    m.feed("er: x")     -> ("", True)           cut: generation stops, nothing more is released
    m.flush()           -> ""                   (without a match: the held-back text)
"""

from __future__ import annotations

MAX_STOPS = 4  # OpenAI's limit


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self.held = ""      # the tail of the text so far that could begin a stop sequence
        self.hit = False    # a stop sequence matched: everything after it is dropped
        self.matched: str | None = None  # which one (the first in the text; the Messages API reports it)

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to release, whether a stop sequence has now matched)."""
        if self.hit:
            return "", True
        if not self.stops:
            return text, False
        buf = self.held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            self.held, self.hit = "", True
            return buf[:cut], True
        keep = self._partial(buf)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The held-back text, once no more text will come."""
        out, self.held = self.held, ""
        return out

    def _partial(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop sequence."""
        for n in range(min(len(buf), max(map(len, self.stops)) - 1), 0, -1):
            if any(s.startswith(buf[-n:]) for s in self.stops):
                return n
        return 0
