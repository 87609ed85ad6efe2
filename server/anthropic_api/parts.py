"""What a Messages request holds, as anthropic's param types define it: messages and their content blocks,
tools, tool_choice, thinking, output_config, metadata. Each field is honoured, ignored (a label of the
history or a hint that changes nothing in the prompt), or its values are refused (`refused()`), so a
client's `model_dump()` of a reply sent back is understood.

Ignored: cache_control (everywhere: this server caches every prefix, unasked), a text block's citations,
a tool_use's caller and toolset_name and a tool_result's toolset_name (who made the call and its toolset
family: the prompt holds the call itself), a tool's eager_input_streaming (inputs always stream as they
are generated), thinking.display (the reasoning is always returned whole), a thinking block's signature.
Refused unless unset: a tool's strict, defer_loading and input_examples, allowed_callers other than
["direct"], output_config.format.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictBool, StrictStr

from ..fields import RequestModel, refuse_unless


class CacheControl(RequestModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Caller(RequestModel):
    """Who made a tool call: "direct" (the model) or a server tool's code execution (tool_id)."""
    type: StrictStr
    tool_id: StrictStr | None = None


class TextBlock(RequestModel):
    type: Literal["text"]
    text: StrictStr
    cache_control: CacheControl | None = None
    citations: list[dict] | None = None


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr
    input: dict
    cache_control: CacheControl | None = None
    caller: Caller | None = None
    toolset_name: StrictStr | None = None


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: Any = None                 # a string or text blocks; parsed: their text (count_tokens.py)
    is_error: StrictBool | None = None
    cache_control: CacheControl | None = None
    toolset_name: StrictStr | None = None


class ThinkingBlock(RequestModel):
    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(RequestModel):
    type: Literal["redacted_thinking"]
    data: StrictStr


BLOCKS: dict[str, type[RequestModel]] = {  # the block types this model reads, by their `type`
    "text": TextBlock, "tool_result": ToolResultBlock, "tool_use": ToolUseBlock, "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}


class MessageParam(RequestModel):
    role: Any                           # "user" or "assistant" (a "system" message: the top-level system field)
    content: Any                        # a string or content blocks; parsed: the typed blocks (BLOCKS, count_tokens.py)


class Tool(RequestModel):
    name: StrictStr
    input_schema: Any                   # a JSON Schema object with type "object" (count_tokens.py checks it)
    description: StrictStr | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    eager_input_streaming: StrictBool | None = None
    strict: StrictBool | None = None
    defer_loading: StrictBool | None = None
    input_examples: list[dict] | None = None
    allowed_callers: list[StrictStr] | None = None

    def refused(self, where: str) -> None:
        refuse_unless(self.strict, (None, False), f"{where}.strict",
                      "strict tool use is not available with tool_choice auto here (a tool_choice of type "
                      "'any' or 'tool' always makes the input match the schema)")
        refuse_unless(self.defer_loading, (None, False), f"{where}.defer_loading",
                      "deferred tools need the tool search server tool, which is not available here")
        refuse_unless(self.input_examples, (None, []), f"{where}.input_examples",
                      "input examples are not part of DeepSeek-V4's tool format")
        refuse_unless(self.allowed_callers, (None, ["direct"]), f"{where}.allowed_callers",
                      "only the model ('direct') calls tools here (no code execution)")


class ToolChoice(RequestModel):
    type: Any                           # auto, any, tool (with a name) or none (count_tokens.py checks them)
    name: Any = None
    disable_parallel_tool_use: Any = None


class Thinking(RequestModel):
    type: Any                           # enabled (budget_tokens), adaptive, between_tools, disabled (count_tokens.py)
    budget_tokens: Any = None
    display: Literal["summarized", "omitted"] | None = None


class Metadata(RequestModel):
    user_id: StrictStr | None = None


class OutputConfig(RequestModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: dict | None = None

    def refused(self) -> None:
        refuse_unless(self.format, (None,), "output_config.format",
                      "structured output is available through /v1/chat/completions' response_format")


