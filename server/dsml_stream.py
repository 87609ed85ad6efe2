"""DSML tool calls parsed as they are generated: text deltas in, content and OpenAI tool-call deltas out.

A client streaming a reply sees each call as it is written: the first delta of a call carries its
index, id, type and name (arguments ""), later ones carry pieces of its arguments JSON. The pieces
concatenate to exactly the `arguments` that `dsml.parse_block` gives for the whole block (the same
`json.dumps(args, ensure_ascii=False)`): a string="true" value is streamed JSON-escaped as it grows
(escaping is per character, so escaped pieces join to the escaped whole); a string="false" value is
JSON, re-serialized, so it goes out in one piece once its closing tag arrives.

Whole and streamed replies both come from this parser (reply.py), so they always agree. What a
streamed call cannot do is take back what was sent, which fixes the rules for a block that goes wrong:
  - markup is never content. A block cut off (max_tokens, or the model ending) before its first call's
    name is complete is nothing: no call and no text. Nothing of it was sent (the opening is held back
    until a call begins), so streamed and whole replies agree. A reply cut by max_tokens also drops the
    held-back tail that could begin a block ("\n", "\n\n<", ...): cut there, it was starting a call;
  - a block that is not DSML (a bad opening, no invoke, an unknown tag) is the model's text: plain
    content, separator included, exactly as `split_tool_calls` leaves a malformed block;
  - after a call has begun: the calls stand as sent, and the text from a fault on is content. A call cut
    off (max_tokens, or the model ending mid-call) is a tool call as far as it got: its arguments as
    generated, unfinished JSON ("{" at least; a string="false" value as far as it got, raw), as OpenAI's
    are; the finish_reason ("length") tells the client. chat_encoding renders such a call back
    (`partial_json.object_prefix`), so the server accepts what it returned.
The block's end (or, with max_calls, the end of that many calls) completes the reply: `closed`; any text
after it is dropped (the caller stops generating there).
"""

from __future__ import annotations

import json
import re

from .dsml import BLOCK_END, BLOCK_START, DSML, SEPARATOR, ToolCall, new_call_id

INVOKE_OPEN, INVOKE_CLOSE = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAM_OPEN, PARAM_CLOSE = f'<{DSML}parameter name="', f"</{DSML}parameter>"
PARAM_TAILS = {'" string="true">': True, '" string="false">': False}
_NAME = re.compile(r'[^"<>]*')

# states
TEXT, BLOCK, NAME, INVOKE, PARAM, STRING, VALUE, CLOSED, RAW = range(9)


def _held_back(buf: str) -> int:
    """How many trailing characters of buf could begin the separator + block start."""
    marker = SEPARATOR + BLOCK_START
    for n in range(min(len(buf), len(marker)), 0, -1):
        if marker.startswith(buf[-n:]) or BLOCK_START.startswith(buf[-n:]):
            return n
    return 0


def _partial(buf: str, tag: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of tag."""
    for n in range(min(len(buf), len(tag) - 1), 0, -1):
        if tag.startswith(buf[-n:]):
            return n
    return 0


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class ToolCallStream:
    """feed(delta) / finish() -> events: ("content", str) and ("tool_call", delta) with delta in OpenAI's
    streamed shape ({"index", "id", "type", "function": {"name", "arguments": ""}} first, then
    {"index", "function": {"arguments": piece}}). `calls` holds the calls so far as ToolCalls."""

    def __init__(self, max_calls: int | None = None):
        self.max_calls = max_calls
        self.state, self.buf = TEXT, ""
        self.sep = ""                # the separator before the block: content again if the block fails early
        self.block = ""              # block text taken before its first call began: likewise
        self.parts: list[list] = []  # per call: [id, name, [argument pieces]]
        self.params: set[str] = set()
        self.lead = ""               # a string="false" parameter's '{"name": ' (or ', "name": '), sent with its value
        self.scanned = 0             # characters of that value already searched for its closing tag
        self.complete = 0            # calls whose invoke has closed
        self.out: list = []

    @property
    def closed(self) -> bool:
        return self.state == CLOSED

    @property
    def holding(self) -> bool:
        """Text is held back as a possible block start (see finish for what becomes of it)."""
        return self.state == TEXT and bool(self.buf)

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(name, "".join(args), cid) for cid, name, args in self.parts]

    # -- events -------------------------------------------------------------------------------------
    def _content(self, text: str) -> None:
        if not text:
            return
        if self.out and self.out[-1][0] == "content":
            self.out[-1] = ("content", self.out[-1][1] + text)
        else:
            self.out.append(("content", text))

    def _arguments(self, piece: str) -> None:
        if not piece:
            return
        i = len(self.parts) - 1
        self.parts[i][2].append(piece)
        last = self.out[-1] if self.out else None
        if last and last[0] == "tool_call" and last[1]["index"] == i and "id" not in last[1]:
            last[1]["function"]["arguments"] += piece
        else:
            self.out.append(("tool_call", {"index": i, "function": {"arguments": piece}}))

    def _begin(self, name: str) -> None:
        cid = new_call_id()
        self.parts.append([cid, name, []])
        self.params, self.block = set(), ""
        self.out.append(("tool_call", {"index": len(self.parts) - 1, "id": cid, "type": "function",
                                       "function": {"name": name, "arguments": ""}}))

    def _take(self, n: int) -> str:
        taken, self.buf = self.buf[:n], self.buf[n:]
        if not self.parts:
            self.block += taken
        return taken

    def _fail(self) -> None:
        """The block went wrong: see the module docstring."""
        self._content((self.sep + self.block if not self.parts else "") + self.buf)
        self.buf, self.state = "", RAW

    # -- parsing ------------------------------------------------------------------------------------
    def feed(self, delta: str) -> list[tuple[str, object]]:
        self.buf += delta
        self.out = []
        while self._step():
            pass
        return self.out

    def _expect(self, tags: tuple[str, ...]) -> str | None:
        """After optional whitespace: the tag buf starts with (taken), None to wait for more; "" = fault."""
        s = self.buf.lstrip()
        for tag in tags:
            if s.startswith(tag):
                self._take(len(self.buf) - len(s) + len(tag))
                return tag
        return None if any(tag.startswith(s) for tag in tags) else ""

    def _name(self) -> str | None:
        """A name up to its closing quote (not taken); None to wait for more; "" = fault."""
        j = _NAME.match(self.buf).end()
        if j == len(self.buf):
            return None
        return self.buf[:j] if self.buf[j] == '"' else ""

    def _step(self) -> bool:
        """Advance the state machine once; False when it needs more text."""
        st = self.state
        if st == TEXT:
            i = self.buf.find(BLOCK_START)
            if i < 0:
                keep = _held_back(self.buf)
                self._content(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                return False
            pre = self.buf[:i]
            self.sep = SEPARATOR if pre.endswith(SEPARATOR) else ""
            self._content(pre[:len(pre) - len(self.sep)])
            self.buf, self.block, self.state = self.buf[i + len(BLOCK_START):], BLOCK_START, BLOCK
            return True
        if st == BLOCK:
            tag = self._expect((INVOKE_OPEN, BLOCK_END))
            if tag == INVOKE_OPEN:
                self.state = NAME
            elif tag == BLOCK_END:
                if not self.parts:  # a block without any invoke
                    return self._fail()
                self.state = CLOSED
            elif tag == "":
                self._fail()
            return bool(tag)
        if st == NAME:
            name = self._name()
            if name is None or len(self.buf) < len(name) + 2:
                return False
            if not name or self.buf[len(name) + 1] != ">":
                return self._fail()
            self._take(len(name) + 2)
            self._begin(name)
            self.state = INVOKE
            return True
        if st == INVOKE:
            tag = self._expect((PARAM_OPEN, INVOKE_CLOSE))
            if tag == PARAM_OPEN:
                self.state = PARAM
            elif tag == INVOKE_CLOSE:
                self._arguments("}" if self.params else "{}")
                self.complete += 1
                self.state = CLOSED if self.max_calls is not None and self.complete >= self.max_calls else BLOCK
            elif tag == "":
                self._fail()
            return bool(tag)
        if st == PARAM:
            name = self._name()
            if name is None:
                return False
            rest = self.buf[len(name):]
            tail = next((t for t in PARAM_TAILS if rest.startswith(t)), None)
            if tail is None:
                if name and any(t.startswith(rest) for t in PARAM_TAILS):
                    return False
                return self._fail()
            if not name or name in self.params:  # parse_block refuses a parameter given twice
                return self._fail()
            self._take(len(name) + len(tail))
            lead = ("{" if not self.params else ", ") + json.dumps(name, ensure_ascii=False) + ": "
            self.params.add(name)
            if PARAM_TAILS[tail]:
                self._arguments(lead + '"')
                self.state = STRING
            else:
                self.lead, self.scanned, self.state = lead, 0, VALUE
            return True
        if st == STRING:
            k = self.buf.find(PARAM_CLOSE)
            if k < 0:
                keep = _partial(self.buf, PARAM_CLOSE)
                self._arguments(_escaped(self._take(len(self.buf) - keep)))
                return False
            self._arguments(_escaped(self._take(k)) + '"')
            self._take(len(PARAM_CLOSE))
            self.state = INVOKE
            return True
        if st == VALUE:  # buffered whole; the search resumes where the last one ended (linear in the value)
            k = self.buf.find(PARAM_CLOSE, max(0, self.scanned - len(PARAM_CLOSE) + 1))
            if k < 0:
                self.scanned = len(self.buf)
                return False
            try:
                value = json.loads(self.buf[:k])
            except json.JSONDecodeError:
                return self._fail()
            self._take(k + len(PARAM_CLOSE))
            self._arguments(self.lead + json.dumps(value, ensure_ascii=False))
            self.state = INVOKE
            return True
        # CLOSED: the reply's calls are complete and what follows is not part of it; RAW: the block failed
        if st == RAW:
            self._content(self.buf)
        self.buf = ""
        return False

    def finish(self, cut: bool = False) -> list[tuple[str, object]]:
        """No more text: release what was held back (see the module docstring for a block cut off).
        cut: the reply was cut by max_tokens (or cancelled), not ended by the model."""
        self.out = []
        if self.state == RAW:
            self._content(self.buf)
        elif self.state == TEXT:  # buf: a tail that could begin the separator and block (_held_back)
            if not cut and DSML not in self.buf:  # the model's own last characters ("\n", "<"): text
                self._content(self.buf)
        elif not self.parts:  # cut off before its first call's name was complete: markup, not content
            pass
        elif self.complete < len(self.parts):  # a call cut off: its arguments as generated, unfinished JSON
            if not self.params:
                self._arguments("{")
            value = self.buf[:len(self.buf) - _partial(self.buf, PARAM_CLOSE)]  # not a cut closing tag
            if self.state == STRING:  # a string value: what there is of it
                self._arguments(_escaped(value))
            elif self.state == VALUE:  # a JSON value, raw: it could not be re-serialized
                self._arguments(self.lead + value)
        self.buf = ""
        return self.out
