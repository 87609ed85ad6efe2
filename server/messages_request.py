"""A Messages API request (Anthropic's POST /v1/messages and /v1/messages/count_tokens) translated to this
server's chat request: OpenAI-shaped messages, tools and tool_choice, which chat_encoding renders in
DeepSeek-V4's own format. One rendering for both APIs is what makes an agent's next turn reuse the
cache whichever API it speaks (the same conversation gives the same tokens).

    request = MessagesRequest.check(body)  # anthropic_api/: every field parsed once; APIError (400) naming the
                                           # field at fault, as the client wrote it
    req = chat_request(request)            # the chat format (parse_messages(body): both)
    parts = req.prompt_parts()             # chat_encoding's (text, is_data) parts; refusals name the field too

Translation (Anthropic -> the chat format):
    system (text, or text blocks)          -> the system message
    user: text blocks                      -> a user message (blocks joined with "\\n")
    user: tool_result blocks               -> tool messages, before the user's text (Anthropic puts them first);
                                              content as text or text blocks; is_error prefixes "Error: "
    assistant: text / thinking / tool_use  -> content / reasoning_content / tool_calls (input as JSON)
    assistant: redacted_thinking           -> dropped (nothing to render)
    tools: name, description, input_schema -> functions with `parameters` = input_schema
    tool_choice auto / any / tool / none   -> auto / required / that function / none;
                                              disable_parallel_tool_use -> parallel_tool_calls false
    thinking enabled (budget_tokens) / adaptive / between_tools / disabled
                                           -> DSV4's thinking mode (the budget forced, sampling.py)
    output_config.effort                   -> the release's reasoning-effort level (ostinato/chat_encodings.py:
                                              low, medium, high, xhigh, max by their order); without one, an
                                              enabled thinking's budget_tokens (effort_for_budget), else the
                                              release's default level

Every field anthropic's SDK defines is a field of the endpoint's model (anthropic_api/), which says
whether it is honoured, ignored or which values it refuses; anything else is refused with a 400 naming
it, as are block keys outside their block type's model (README.md, "The Messages API").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ostinato.chat_encodings import effort_for_budget

from .anthropic_api import CountTokensRequest, MessageParam, MessagesRequest
from .chat_encoding import ChatOptions, ConversationError, render_parts
from .errors import APIError

ERROR_PREFIX = "Error: "  # a tool_result with is_error: DSV4's format has no error flag, so the text says it


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]        # OpenAI-shaped, for chat_encoding.render_parts
    tools: list[dict]           # OpenAI-shaped ({"type": "function", "function": {...}})
    options: ChatOptions
    tool_choice: object         # OpenAI-shaped, for tool_choice.tool_choice
    parallel_tool_calls: bool
    think_budget: int | None    # thinking.budget_tokens (None: adaptive, or no thinking)
    stops: tuple[str, ...]      # stop_sequences
    origin: list[str]           # per message: where in the request it came from (errors name that)

    def prompt_parts(self) -> list[tuple[str, bool]]:
        """chat_encoding.render_parts of the request; its refusals as APIErrors naming this request's field."""
        try:
            return render_parts(self.messages, self.tools, self.options)
        except ConversationError as e:
            m = re.match(r"messages\[(\d+)\]", e.param or "")
            param = e.param
            if m and int(m.group(1)) < len(self.origin):
                param = self.origin[int(m.group(1))] + param[m.end():].replace(".tool_call_id", ".tool_use_id")
            raise APIError(400, f"{param}: {e}", param) from None


def _user(m: MessageParam, i: int, out: list, origin: list) -> None:
    texts, results = [], 0
    for j, b in enumerate(m.content):
        if b.type == "text":
            texts.append(b.text)
        else:  # a tool_result (anthropic_api checked that they come first; content: its text)
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": ERROR_PREFIX + b.content if b.is_error else b.content})
            origin.append(f"messages[{i}].content[{j}]")
            results += 1
    if texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
        origin.append(f"messages[{i}]")


def _assistant(m: MessageParam, i: int, out: list, origin: list) -> None:
    text = [b.text for b in m.content if b.type == "text"]
    thinking = [b.thinking for b in m.content if b.type == "thinking"]
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name,
                                                           "arguments": json.dumps(b.input, ensure_ascii=False)}}
             for b in m.content if b.type == "tool_use"]
    # the model's own text, rejoined as it was generated (one text block before the calls, normally)
    msg = {"role": "assistant", "content": "".join(text), "reasoning_content": "".join(thinking)}
    if calls:
        msg["tool_calls"] = calls
    out.append(msg)
    origin.append(f"messages[{i}]")


def _messages(request: CountTokensRequest) -> tuple[list[dict], list[str]]:
    out, origin = [], []
    if request.system is not None:
        out.append({"role": "system", "content": request.system})
        origin.append("system")
    for i, m in enumerate(request.messages):
        (_user if m.role == "user" else _assistant)(m, i, out, origin)
    return out, origin


def _tools(request: CountTokensRequest) -> list[dict]:
    out = []
    for t in request.tools:
        fn = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(request: CountTokensRequest) -> tuple[object, bool]:
    """(OpenAI tool_choice, parallel_tool_calls)."""
    tc = request.tool_choice
    if tc is None:
        return None, True
    parallel = not tc.disable_parallel_tool_use
    if tc.type == "tool":
        return {"type": "function", "function": {"name": tc.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[tc.type], parallel


def chat_request(request: CountTokensRequest, encoding: str = "dsv4") -> ChatRequest:
    """A checked request (MessagesRequest, or CountTokensRequest: no max_tokens, no stop sequences) in the chat
    format; `encoding`: the plan's chat encoding (the release's reasoning-effort levels)."""
    messages, origin = _messages(request)
    choice, parallel = _tool_choice(request)
    thinking = request.thinking is not None and request.thinking.type != "disabled"
    budget = request.think_budget
    stops = getattr(request, "stop_sequences", None) or ()
    effort = request.output_config.effort if request.output_config is not None else None
    if effort is None and budget is not None:
        effort = effort_for_budget(budget)
    return ChatRequest(messages, _tools(request), ChatOptions(thinking, effort, encoding), choice, parallel, budget,
                       stops, origin)


def parse_messages(body: dict, count_only: bool = False, encoding: str = "dsv4") -> ChatRequest:
    """The checked request in the chat format; count_only: /v1/messages/count_tokens' fields."""
    return chat_request((CountTokensRequest if count_only else MessagesRequest).check(body), encoding)
