"""Generated token ids -> OpenAI message deltas (reasoning, content, tool_calls), streamed or whole.

Streaming and non-streaming replies go through this one class, so both give the same message. It runs
on the engine thread (the worker calls `feed` for each token, worker.Job.watch), so that a stop sequence,
the end of the tool calls, or the first call with parallel_tool_calls false ends generation on exactly
the token that completed it. Text is decoded incrementally (tokenizers' DecodeStream, special tokens
kept: `｜DSML｜` and `</think>` are special tokens): O(1) per token, released once it does not end
inside a multi-byte character, and equal to decoding the whole reply at once.

Content then goes through the tool-call parser (dsml_stream.py) and the stop sequences (stop.py), in
that order: stop sequences match content text, never tool-call markup. Reasoning goes through neither.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from .chat_encoding import END_THINK
from .dsml_stream import ToolCallStream
from .stop import StopMatcher


class ReplyBuilder:
    """feed(token) -> (events, stop generating?) and finish() -> events, with events ("reasoning", str),
    ("content", str) and ("tool_call", OpenAI streamed tool-call delta)."""

    def __init__(self, tokenizer, eos: int, thinking: bool, parse_tools: bool, stop: tuple[str, ...] = (),
                 parallel_tool_calls: bool = True):
        self.tok, self.eos = tokenizer, eos
        self.end_think = tokenizer.token_to_id(END_THINK)
        self.in_reasoning = thinking
        self.decoder = DecodeStream(skip_special_tokens=False)
        self.unreleased: list[int] = []  # ids the decoder holds (an unfinished character)
        self.parser = ToolCallStream(None if parallel_tool_calls else 1) if parse_tools else None
        self.stop = StopMatcher(stop)
        self.stopped = False  # a stop sequence matched

    @property
    def tool_calls(self):
        return self.parser.calls if self.parser is not None else []

    @property
    def stop_sequence(self) -> str | None:
        """The stop sequence that ended the reply, if one did."""
        return self.stop.matched

    @property
    def ended(self) -> bool:
        """Nothing more can be part of the reply: a stop sequence matched, or the tool calls are complete."""
        return self.stopped or (self.parser is not None and self.parser.closed)

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish_reason from the worker's ("stop" at EOS or when feed said so, "length", ...)."""
        if self.stopped:
            return "stop"
        if self.parser is not None and self.parser.closed:
            return "tool_calls"
        return "tool_calls" if self.tool_calls and reason != "length" else reason

    def feed(self, token: int) -> tuple[list[tuple[str, object]], bool]:
        """The events of one more token, and whether generation must stop here: at once for a stop sequence
        or the last call parallel_tool_calls allows; one token after the block's end (the model's EOS,
        normally), so that the session holds the whole block and the next turn prefills only what follows."""
        if self.ended:
            return [], True
        if token == self.eos:
            return [], False
        if self.in_reasoning and token == self.end_think:
            out = self._route(self._unreleased())
            self.in_reasoning, self.decoder = False, DecodeStream(skip_special_tokens=False)
            return out, False
        text = self.decoder.step(self.tok, token)
        if text is None:
            self.unreleased.append(token)
            return [], False
        self.unreleased = []
        return self._route(text), self.stopped or (self.parser is not None and self.parser.closed
                                                    and self.parser.max_calls is not None)

    def _unreleased(self) -> str:
        """The text of ids the decoder still holds, as a whole decode renders them (U+FFFD for a cut character)."""
        text = self.tok.decode(self.unreleased, skip_special_tokens=False) if self.unreleased else ""
        self.unreleased = []
        return text

    def _route(self, text: str) -> list[tuple[str, object]]:
        if self.in_reasoning:
            return [("reasoning", text)] if text else []
        return self._cut(self.parser.feed(text) if self.parser is not None else [("content", text)])

    def _cut(self, events) -> list[tuple[str, object]]:
        """Content through the stop sequences; text held back for a possible stop is released before markup."""
        out = []
        for kind, v in events:
            if kind != "content":
                held = self.stop.flush()
                if held:
                    out.append(("content", held))
                out.append((kind, v))
                continue
            text, self.stopped = self.stop.feed(v)
            if text:
                out.append(("content", text))
            if self.stopped:
                break
        return out

    def finish(self, reason: str = "stop") -> list[tuple[str, object]]:
        """The events of what was held back, once the worker says why the reply ended (its Done event's
        reason, events.py: "stop", or "length" / "cancelled" for a reply cut short). A cut reply drops what
        is not text yet: a tail that could begin a tool call (dsml_stream.py), and an unfinished character
        after it (the start of `｜` in `<｜DSML｜` written as plain bytes). An unfinished character elsewhere
        is U+FFFD, as decoding the whole reply renders it."""
        if self.stopped:
            return []
        cut = reason != "stop"
        if cut and self.parser is not None and not self.in_reasoning and self.parser.holding:
            self.unreleased = []
        out = self._route(self._unreleased())
        if not self.in_reasoning:
            if self.parser is not None:
                out += self._cut(self.parser.finish(cut))
            held = "" if self.stopped else self.stop.flush()
            if held:
                out.append(("content", held))
        return out
