"""A Messages API request (Anthropic's POST /v1/messages and /v1/messages/count_tokens) translated to this
server's chat request: OpenAI-shaped messages, tools and tool_choice, which chat_encoding renders in
DeepSeek-V4's own format. One rendering for both APIs is what makes an agent's next turn reuse the
cache whichever API it speaks (the same conversation gives the same tokens).

    req = parse_messages(body)             # APIError (400) naming the field at fault, as the client wrote it
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
from typing import NoReturn

from ostinato.chat_encodings import effort_for_budget

from .anthropic_api import (
    BLOCKS,
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    Metadata,
    Thinking,
    Tool,
    ToolChoice,
)
from .chat_encoding import ChatOptions, ConversationError, render_parts
from .errors import APIError

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
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


def _fail(message: str, param: str) -> NoReturn:
    raise APIError(400, f"{param}: {message}", param)


def _string(v, param: str) -> str:
    if not isinstance(v, str):
        _fail(f"must be a string, got {type(v).__name__}", param)
    return v


def _blocks(content, param: str) -> list[dict]:
    """Content as a list of checked blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        _fail("must be a string or a list of content blocks", param)
    for j, b in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            _fail("must be a content block, an object with a type", where)
        if b["type"] not in BLOCKS:
            _fail(f"block type {b['type']!r} is not supported (this model reads text; supported: "
                  f"{', '.join(BLOCKS)})", f"{where}.type")
        BLOCKS[b["type"]].check(b, where)
    return content


def _text_of(content, param: str) -> str:
    """The text of content given as a string or text blocks, joined with newlines."""
    out = []
    for j, b in enumerate(_blocks(content, param)):
        if b["type"] != "text":
            _fail(f"a {b['type']} block is not allowed here (only text)", f"{param}[{j}].type")
        out.append(_string(b.get("text"), f"{param}[{j}].text"))
    return "\n".join(out)


def _user(m: dict, i: int, out: list, origin: list) -> None:
    param = f"messages[{i}].content"
    blocks, texts = _blocks(m.get("content"), param), []
    results = 0
    for j, b in enumerate(blocks):
        where = f"{param}[{j}]"
        if b["type"] == "text":
            texts.append(_string(b.get("text"), f"{where}.text"))
        elif b["type"] == "tool_result":
            if texts:
                _fail("tool_result blocks must come before any text in a user message", f"{where}.type")
            content = b.get("content")
            text = "" if content is None else _text_of(content, f"{where}.content")
            is_error = b.get("is_error", False)
            if not isinstance(is_error, bool):
                _fail("must be a boolean", f"{where}.is_error")
            out.append({"role": "tool", "tool_call_id": _string(b.get("tool_use_id"), f"{where}.tool_use_id"),
                        "content": ERROR_PREFIX + text if is_error else text})
            origin.append(where)
            results += 1
        else:
            _fail(f"a {b['type']} block is not allowed in a user message", f"{where}.type")
    if texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
        origin.append(f"messages[{i}]")


def _assistant(m: dict, i: int, out: list, origin: list) -> None:
    param = f"messages[{i}].content"
    text, thinking, calls = [], [], []
    for j, b in enumerate(_blocks(m.get("content"), param)):
        where = f"{param}[{j}]"
        if b["type"] == "text":
            text.append(_string(b.get("text"), f"{where}.text"))
        elif b["type"] == "thinking":
            thinking.append(_string(b.get("thinking"), f"{where}.thinking"))
        elif b["type"] == "tool_use":
            if not isinstance(b.get("input"), dict):
                _fail("must be an object", f"{where}.input")
            calls.append({"id": _string(b.get("id"), f"{where}.id"), "type": "function",
                          "function": {"name": _string(b.get("name"), f"{where}.name"),
                                       "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        elif b["type"] != "redacted_thinking":
            _fail(f"a {b['type']} block is not allowed in an assistant message", f"{where}.type")
    # the model's own text, rejoined as it was generated (one text block before the calls, normally)
    msg = {"role": "assistant", "content": "".join(text), "reasoning_content": "".join(thinking)}
    if calls:
        msg["tool_calls"] = calls
    out.append(msg)
    origin.append(f"messages[{i}]")


def _messages(body: dict) -> tuple[list[dict], list[str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        _fail("must be a non-empty list", "messages")
    out, origin = [], []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
        origin.append("system")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            _fail("must be 'user' or 'assistant' (a system prompt goes in the top-level system field, before "
                  "the messages)", f"messages[{i}].role")
        MessageParam.check(m, f"messages[{i}]")
        (_user if m["role"] == "user" else _assistant)(m, i, out, origin)
    _check_results(out, origin)
    if messages[-1]["role"] != "user":
        _fail("the last message must be from the user (continuing a partial assistant message is not "
              "supported)", f"messages[{len(messages) - 1}].role")
    return out, origin


def _check_results(out: list[dict], origin: list[str]) -> None:
    """Anthropic's rule: every tool_use is answered by a tool_result in the very next user message, and a
    tool_result answers a tool_use of the assistant message just before it."""
    pending, answered, asked_at = [], set(), ""
    for m, where in zip(out + [{"role": "end"}], origin + [""]):
        if m["role"] == "tool":
            cid = m["tool_call_id"]
            if cid not in pending or cid in answered:
                _fail(f"tool_use_id {cid!r} " + ("is answered twice" if cid in answered else
                      "matches no tool_use block of the assistant message before it"), f"{where}.tool_use_id")
            answered.add(cid)
            continue
        missing = [c for c in pending if c not in answered]
        if missing:
            _fail(f"tool_use ids {', '.join(missing)} have no tool_result block in the next user message",
                  f"{asked_at}.content")
        pending, answered, asked_at = [c["id"] for c in m.get("tool_calls", [])], set(), where


def _tools(body: dict) -> list[dict]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        _fail("must be a list", "tools")
    out = []
    for k, t in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(t, dict):
            _fail("must be an object with name and input_schema", where)
        if t.get("type") not in (None, "custom"):
            _fail(f"tool type {t['type']!r} is not available here (only custom tools; server tools are not)",
                  f"{where}.type")
        Tool.check(t, where).refused(where)
        name = _string(t.get("name"), f"{where}.name")
        if not TOOL_NAME.fullmatch(name):
            _fail("must match [a-zA-Z0-9_-]{1,128}", f"{where}.name")
        schema = t.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            _fail("must be a JSON schema object with type 'object'", f"{where}.input_schema")
        fn = {"name": name, "parameters": schema}
        if t.get("description") is not None:
            fn["description"] = _string(t["description"], f"{where}.description")
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(body: dict, tools: list) -> tuple[object, bool]:
    """(OpenAI tool_choice, parallel_tool_calls)."""
    tc = body.get("tool_choice")
    if tc is None:
        return None, True
    if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
        _fail("must be {'type': 'auto' | 'any' | 'tool' | 'none'} ('tool' with a name)", "tool_choice")
    allowed = ToolChoice.fields() - ({"name"} if tc["type"] != "tool" else set())
    extra = sorted(set(tc) - allowed)
    if extra:
        _fail(f"unsupported key(s): {', '.join(extra)}", f"tool_choice.{extra[0]}")
    parallel = not tc.get("disable_parallel_tool_use", False)
    if not isinstance(tc.get("disable_parallel_tool_use", False), bool):
        _fail("must be a boolean", "tool_choice.disable_parallel_tool_use")
    if tc["type"] in ("any", "tool") and not tools:
        _fail(f"type {tc['type']!r} needs tools", "tool_choice")
    if tc["type"] == "tool":
        return {"type": "function", "function": {"name": _string(tc.get("name"), "tool_choice.name")}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[tc["type"]], parallel


def _thinking(body: dict, max_tokens: int | None) -> tuple[bool, int | None]:
    """(thinking mode, budget). budget_tokens must be below max_tokens, as Anthropic requires; its floor
    of 1,024 is not kept (a small model's context may be shorter than that)."""
    t = body.get("thinking")
    if t is None:
        return False, None
    if not isinstance(t, dict) or t.get("type") not in ("enabled", "adaptive", "between_tools", "disabled"):
        _fail("must be {'type': 'enabled', 'budget_tokens': N}, {'type': 'adaptive'}, {'type': 'between_tools'} "
              "or {'type': 'disabled'}", "thinking")
    Thinking.check(t, "thinking")
    if t["type"] != "enabled":
        return t["type"] != "disabled", None
    budget = t.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1 or \
            (max_tokens is not None and budget >= max_tokens):
        _fail(f"must be an integer >= 1 and below max_tokens ({max_tokens}), got {budget!r}", "thinking.budget_tokens")
    return True, budget


def _check_ignored(body: dict) -> None:
    md = body.get("metadata")
    if md is not None and (not isinstance(md, dict) or set(md) - Metadata.fields()
                           or not isinstance(md.get("user_id", ""), (str, type(None)))):
        _fail("must be an object with at most user_id (a string)", "metadata")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        _fail("must be 'auto' or 'standard_only'", "service_tier")


def max_tokens_of(body: dict) -> int:
    v = body.get("max_tokens")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        _fail(f"is required: an integer >= 1, got {v!r}", "max_tokens")
    return v


def stop_sequences_of(body: dict) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        _fail("must be a list of non-empty strings", "stop_sequences")
    return tuple(dict.fromkeys(stops))


def parse_messages(body: dict, count_only: bool = False, encoding: str = "dsv4") -> ChatRequest:
    """The checked request; count_only: /v1/messages/count_tokens' fields (no max_tokens, no sampling);
    `encoding`: the plan's chat encoding (the release's reasoning-effort levels)."""
    request = (CountTokensRequest if count_only else MessagesRequest).check(body)
    request.refused()
    _check_ignored(body)
    max_tokens = None if count_only else max_tokens_of(body)
    messages, origin = _messages(body)
    tools = _tools(body)
    choice, parallel = _tool_choice(body, tools)
    thinking, budget = _thinking(body, max_tokens)
    stops = () if count_only else stop_sequences_of(body)
    effort = request.output_config.effort if request.output_config is not None else None
    if effort is None and budget is not None:
        effort = effort_for_budget(budget)
    return ChatRequest(messages, tools, ChatOptions(thinking, effort, encoding), choice, parallel, budget, stops,
                       origin)
