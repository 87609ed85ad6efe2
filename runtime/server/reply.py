"""Generated token ids -> OpenAI message deltas (reasoning, content, tool_calls), streamed or whole.

Streaming and non-streaming replies go through this one class, so both give the same message.
Text is decoded with special tokens kept (`｜DSML｜` and `</think>` are special tokens) and only
released once it does not end inside a multi-byte character.
"""

from __future__ import annotations

from .chat_encoding import END_THINK
from .dsml import StreamParser


class ReplyBuilder:
    def __init__(self, tokenizer, eos: int, thinking: bool, parse_tools: bool):
        self.tok, self.eos, self.parse_tools = tokenizer, eos, parse_tools
        self.end_think = tokenizer.token_to_id(END_THINK)
        self.in_reasoning = thinking
        self.ids: list[int] = []
        self.sent = 0  # characters of decode(ids) already released
        self.parser = StreamParser()
        self.tool_calls = []

    def _route(self, kind: str, text: str) -> list[tuple[str, object]]:
        if kind == "reasoning" or not self.parse_tools:
            return [(kind, text)] if text else []
        return self._note(self.parser.feed(text))

    def _note(self, events):
        for kind, v in events:
            if kind == "tool_calls":
                self.tool_calls = v
        return events

    def feed(self, token: int) -> list[tuple[str, object]]:
        if token == self.eos:
            return []
        if self.in_reasoning and token == self.end_think:
            out = self._flush()
            self.in_reasoning, self.ids, self.sent = False, [], 0
            return out
        self.ids.append(token)
        text = self.tok.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return []
        delta, self.sent = text[self.sent:], len(text)
        return self._route("reasoning" if self.in_reasoning else "content", delta)

    def _flush(self):
        text = self.tok.decode(self.ids, skip_special_tokens=False)
        delta, self.sent = text[self.sent:], len(text)
        return self._route("reasoning" if self.in_reasoning else "content", delta)

    def finish(self) -> list[tuple[str, object]]:
        out = self._flush()
        if self.parse_tools and not self.in_reasoning:
            out += self._note(self.parser.finish())
        return out
