"""DeepSeek-V4 chat encoding (docs/model.md section 5): OpenAI messages -> prompt text -> token ids.

The exact format (S = the literal special tokens; `｜DSML｜` included, see dsml.py):

    <｜begin▁of▁sentence｜>
    [the release's effort preamble]                      thinking mode, at a level with one (chat_encodings.py)
    [system text]                                        the first message, when it is a system message
    ["\\n\\n" TOOLS_HEADER "\\n" json(tool) per line]     when tools are given (one compact JSON per line)
    then per turn, in order:
      user:       <｜User｜>content
      tool run:   <｜User｜><tool_result>r1</tool_result><tool_result>r2</tool_result>...
                  (consecutive tool messages are one user turn, ordered like the preceding calls)
      assistant:  <｜Assistant｜>OPEN BODY<｜end▁of▁sentence｜>
                  non-thinking:            OPEN = </think>,  BODY = content [+ DSML calls]
                  thinking, reasoning kept: OPEN = <think>,   BODY = reasoning </think> content [+ calls]
                  thinking, reasoning dropped (a user turn follows it and no tools are given):
                                           OPEN = </think>,  BODY = content [+ calls]
    generation prompt: <｜Assistant｜></think> (non-thinking) or <｜Assistant｜><think> (thinking)

Byte stability: every piece ends in a special token or is followed by one, and the tokenizers
split on special tokens first, so the tokens of a rendering are the concatenation of its pieces'
tokens. Rendering a conversation with the generation prompt and then the same conversation with the
assistant's reply (and more) appended therefore gives a token prefix: prefix caching always hits.
The one deliberate exception is DSV4's own rule in thinking mode without tools: an earlier turn's
reasoning is dropped once a user turn follows, so the cache then hits up to that turn's <｜Assistant｜>.
System, user and tool text (and the tool definitions' JSON) is data: `encode_chat` keeps control-token
strings typed there as ordinary text (data_text.py), so a tool output cannot forge a turn or a call.
The reply's text is re-encoded, so a reply whose generated tokens differ from their re-encoding
(possible with any BPE) re-prefills from the first differing token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ostinato.chat_encodings import EFFORT_STEP, ENCODINGS, OFF, level_for, preamble

from .data_text import encode_parts
from .dsml import DSMLError, render_tool_calls
from .errors import APIError
from .openai_api import MESSAGES, FunctionTool, TextPart, ToolCall

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"

TOOLS_HEADER = (
    "## Tools\n\n"
    "You have access to the following tools. To call tools, end your reply with a block in this format:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    "Use string=\"true\" for string values (written raw) and string=\"false\" for any other JSON value. "
    "Tool results come back in <tool_result> blocks.\n\n"
    "### Available tools\n")
ROLES = tuple(MESSAGES)  # system (developer: OpenAI's newer name for it), user, assistant, tool; function: refused


class ConversationError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatOptions:
    thinking: bool = False
    reasoning_effort: str | None = None  # an API's effort name (chat_encodings.EFFORT_STEP); None: the default level
    encoding: str = "dsv4"               # the plan's policy.chat_encoding: the release's levels and preambles

    def __post_init__(self):
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORT_STEP:
            raise ConversationError(f"reasoning_effort must be one of {OFF}, {', '.join(EFFORT_STEP)}; "
                                    f"got {self.reasoning_effort!r}", "reasoning_effort")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown chat encoding {self.encoding!r}; one of {', '.join(ENCODINGS)}")

    @property
    def preamble(self) -> str:
        """The release's reasoning-effort text before the first message ("" outside thinking mode)."""
        return preamble(self.encoding, level_for(self.encoding, self.reasoning_effort)) if self.thinking else ""


def _checked(model, value, param: str):
    """`value` read as the request model `model` (openai_api), or a ConversationError naming the field."""
    try:
        return model.check(value, param)
    except APIError as e:
        raise ConversationError(e.message, e.param) from None


def _text(content, param: str, allow_none: bool = False) -> str:
    if content is None and allow_none:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: only text parts are understood
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ConversationError(f"{param}[{i}] must be a text part {{'type': 'text', 'text': ...}}",
                                        f"{param}[{i}]")
            out.append(_checked(TextPart, part, f"{param}[{i}]").text)
        return "".join(out)
    raise ConversationError(f"{param} must be a string or a list of text parts", param)


def _tools_section(tools: list) -> list[tuple[str, bool]]:
    lines = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict) \
                or not isinstance(t["function"].get("name"), str):
            raise ConversationError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                                    f"tools[{i}]")
        _checked(FunctionTool, t, f"tools[{i}]")
        # sort_keys: the same tool gives the same bytes whatever order the client wrote it in
        lines.append(json.dumps(t["function"], ensure_ascii=False, sort_keys=True, separators=(",", ":")))
    return [("\n\n" + TOOLS_HEADER, False), ("\n".join(lines), True)]  # the client's definitions are data


def render(messages: list, tools: list | None = None, options: ChatOptions = ChatOptions(),
           add_generation_prompt: bool = True) -> str:
    """The prompt text of a conversation; ConversationError (with the offending param) if invalid."""
    return "".join(text for text, _ in render_parts(messages, tools, options, add_generation_prompt))


def render_parts(messages: list, tools: list | None = None, options: ChatOptions = ChatOptions(),
                 add_generation_prompt: bool = True) -> list[tuple[str, bool]]:
    """render's text as (text, is_data) parts: system, user and tool text is data (encode_chat)."""
    if not isinstance(messages, list) or not messages:
        raise ConversationError("messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ConversationError(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        try:
            _checked(MESSAGES[m["role"]], m, f"messages[{i}]").refused(f"messages[{i}]")
        except APIError as e:
            raise ConversationError(e.message, e.param) from None
        if m["role"] == "developer":
            messages = messages[:i] + [{**m, "role": "system"}] + messages[i + 1:]
    out = [(BOS, False)]
    if options.preamble:
        out.append((options.preamble, False))
    start = 0
    if messages[0]["role"] == "system":
        out.append((_text(messages[0].get("content"), "messages[0].content"), True))
        start = 1
    if tools:
        out += _tools_section(tools)
    last_user = max((i for i, m in enumerate(messages) if m["role"] in ("user", "tool")), default=-1)
    prev, pending_calls, results = None, [], {}
    for i in range(start, len(messages)):
        m, role, param = messages[i], messages[i]["role"], f"messages[{i}]"
        if role == "system":
            raise ConversationError("a system message is only allowed first", f"{param}.role")
        if role == "tool":
            if not pending_calls:
                raise ConversationError("a tool message must follow an assistant message with tool_calls",
                                        f"{param}.role")
            cid = m.get("tool_call_id")
            if cid not in pending_calls:
                raise ConversationError(f"tool_call_id {cid!r} matches no call of the preceding assistant message",
                                        f"{param}.tool_call_id")
            if cid in results:
                raise ConversationError(f"tool_call_id {cid!r} answered twice", f"{param}.tool_call_id")
            results[cid] = _text(m.get("content"), f"{param}.content")
            if i + 1 == len(messages) or messages[i + 1]["role"] != "tool":  # the run ends: one user turn
                out.append((USER, False))
                for c in pending_calls:
                    if c in results:
                        out += [("<tool_result>", False), (results[c], True), ("</tool_result>", False)]
                pending_calls, results = [], {}
        elif role == "user":
            if pending_calls:
                raise ConversationError("the tool calls of the preceding assistant message have no results",
                                        f"{param}.role")
            out += [(USER, False), (_text(m.get("content"), f"{param}.content"), True)]
        else:
            if prev not in ("user", "tool"):
                raise ConversationError("an assistant message must follow a user or tool message", f"{param}.role")
            # the model's own earlier turns: its control tokens there are real (it generated them)
            out.append((_assistant(m, param, options, keep_reasoning=bool(tools) or i > last_user), False))
            calls = m.get("tool_calls") or []
            pending_calls = [c.get("id") for c in calls]
        prev = role
    if prev not in ("user", "tool"):
        raise ConversationError("the last message must be from the user or a tool", f"messages[{len(messages) - 1}]")
    if add_generation_prompt:
        out.append((ASSISTANT + (THINK if options.thinking else END_THINK), False))
    return out


def _assistant(m: dict, param: str, options: ChatOptions, keep_reasoning: bool) -> str:
    calls = m.get("tool_calls") or []
    content = _text(m.get("content"), f"{param}.content", allow_none=bool(calls) or True)
    if calls:
        if not isinstance(calls, list) or any(not isinstance(c, dict) or not c.get("id") for c in calls):
            raise ConversationError("tool_calls must be a list of calls, each with an id", f"{param}.tool_calls")
        for j, c in enumerate(calls):
            _checked(ToolCall, c, f"{param}.tool_calls[{j}]")
        try:
            content += render_tool_calls(calls)
        except DSMLError as e:
            raise ConversationError(f"{param}.{e}", f"{param}.tool_calls") from None
    if options.thinking and keep_reasoning:
        reasoning = m.get("reasoning_content") or ""
        return ASSISTANT + THINK + reasoning + END_THINK + content + EOS
    return ASSISTANT + END_THINK + content + EOS


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of text whose special-token strings are all meant (a `tokenizers.Tokenizer`; BOS is in the
    text, so no extra specials). encode_batch releases the GIL, so a thread encoding a long prompt leaves
    the event loop free."""
    return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids


def encode_chat(tokenizer, parts: list[tuple[str, bool]]) -> list[int]:
    """Token ids of render_parts' parts: control tokens come from the structure only, never from data."""
    return encode_parts(tokenizer, parts)
