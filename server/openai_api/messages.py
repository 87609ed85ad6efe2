"""A chat request's messages (one model per role), their text parts and tool calls, and its tools: every
field openai's message, content-part and tool param types define, plus what a reply's `model_dump()` holds
when sent back (annotations; reasoning_content, this server's reasoning as DeepSeek's API returns it).

chat_encoding.py checks each message by its role's model and reads it. Honoured: role, content (a string
or text parts), tool_calls, tool_call_id, reasoning_content; a developer message is the system message
(OpenAI's newer name for it). Ignored: a message's name (DSV4's format has no speaker names), a text part's
prompt_cache_breakpoint (every prefix is cached here), a reply's annotations, a function's strict (the
definition reaches the model as written). Refused unless unset: an assistant message's audio and
function_call, its refusal (this server never returns one); the role "function" (deprecated: tool messages).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictStr

from ..fields import RequestModel, refuse_unless


class TextPart(RequestModel):
    type: Literal["text"]
    text: StrictStr
    prompt_cache_breakpoint: Any = None


class Function(RequestModel):
    name: Any = None                     # dsml.render_tool_calls names what is wrong with these
    arguments: Any = None


class ToolCall(RequestModel):
    id: Any = None
    type: Literal["function"] | None = None
    function: Function | None = None


class FunctionDefinition(RequestModel):
    name: Any = None
    description: Any = None
    parameters: Any = None
    strict: Any = None


class FunctionTool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class Message(RequestModel):
    role: Any
    content: Any = None                  # chat_encoding._text reads a string or text parts

    def refused(self, where: str) -> None:
        pass


class SystemMessage(Message):
    name: StrictStr | None = None


class UserMessage(SystemMessage):
    pass


class AssistantMessage(SystemMessage):
    tool_calls: Any = None               # ToolCall each (chat_encoding checks the list, then each call)
    reasoning_content: Any = None
    refusal: StrictStr | None = None
    audio: Any = None
    function_call: Any = None
    annotations: list | None = None

    def refused(self, where: str) -> None:
        refuse_unless(self.audio, (None,), f"{where}.audio", "audio replies are not available here")
        refuse_unless(self.function_call, (None,), f"{where}.function_call",
                      "function_call is the deprecated form of tool_calls: send tool_calls")
        refuse_unless(self.refusal, (None, ""), f"{where}.refusal",
                      "this server never returns a refusal; send what the assistant said as content")


class ToolMessage(Message):
    tool_call_id: Any = None


class FunctionMessage(Message):
    name: StrictStr | None = None

    def refused(self, where: str) -> None:
        refuse_unless(self.role, (), f"{where}.role", "the role 'function' is deprecated: send tool messages")


MESSAGES: dict[str, type[Message]] = {
    "system": SystemMessage, "developer": SystemMessage, "user": UserMessage, "assistant": AssistantMessage,
    "tool": ToolMessage, "function": FunctionMessage,
}
