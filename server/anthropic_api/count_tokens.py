"""POST /v1/messages/count_tokens: the fields of a Messages request that shape the prompt, as anthropic's
MessageCountTokensParams defines them (no max_tokens, no sampling, no bookkeeping).

Each field is checked here as it is parsed, into typed values: the system prompt's text, the messages with
their typed content blocks (a string is one text block; tool_results answer the tool_uses of the assistant
message just before), the tools, tool_choice and thinking. messages_request.py translates them to the chat
format. Errors name the field as the client wrote it (messages[1].content[0].tool_use_id).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, StrictStr, ValidationInfo, field_validator

from ..fields import RequestModel, refuse, refusing, served_model
from .parts import BLOCKS, CacheControl, MessageParam, OutputConfig, Thinking, Tool, ToolChoice

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")


def fail(message: str, param: str):
    refuse(f"{param}: {message}", param)


def _blocks(content, param: str) -> list:
    """Content as a list of checked, typed blocks (a string is one text block)."""
    if isinstance(content, str):
        return [BLOCKS["text"](type="text", text=content)]
    if not isinstance(content, list):
        fail("must be a string or a list of content blocks", param)
    out = []
    for j, b in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            fail("must be a content block, an object with a type", where)
        if b["type"] not in BLOCKS:
            fail(f"block type {b['type']!r} is not supported (this model reads text; supported: "
                  f"{', '.join(BLOCKS)})", f"{where}.type")
        with refusing():
            out.append(BLOCKS[b["type"]].check(b, where))
    return out


def text_of(content, param: str) -> str:
    """The text of content given as a string or text blocks, joined with newlines."""
    out = []
    for j, b in enumerate(_blocks(content, param)):
        if b.type != "text":
            fail(f"a {b.type} block is not allowed here (only text)", f"{param}[{j}].type")
        out.append(b.text)
    return "\n".join(out)


def _user(blocks: list, param: str) -> None:
    texts = False
    for j, b in enumerate(blocks):
        where = f"{param}[{j}]"
        if b.type == "text":
            texts = True
        elif b.type == "tool_result":
            if texts:
                fail("tool_result blocks must come before any text in a user message", f"{where}.type")
            b.content = "" if b.content is None else text_of(b.content, f"{where}.content")  # its text, read
            if b.is_error is None and b.given("is_error"):
                fail("must be a boolean", f"{where}.is_error")
        else:
            fail(f"a {b.type} block is not allowed in a user message", f"{where}.type")


def _assistant(blocks: list, param: str) -> None:
    for j, b in enumerate(blocks):
        if b.type not in ("text", "thinking", "tool_use", "redacted_thinking"):
            fail(f"a {b.type} block is not allowed in an assistant message", f"{param}[{j}].type")


def _check_results(messages: list[MessageParam]) -> None:
    """Anthropic's rule: every tool_use is answered by a tool_result in the very next user message, and a
    tool_result answers a tool_use of the assistant message just before it."""
    pending, answered, asked_at = [], set(), ""

    def all_answered():
        missing = [c for c in pending if c not in answered]
        if missing:
            fail(f"tool_use ids {', '.join(missing)} have no tool_result block in the next user message",
                  f"{asked_at}.content")
    for i, m in enumerate(messages):
        results = [(j, b) for j, b in enumerate(m.content) if b.type == "tool_result"]
        for j, b in results:
            cid = b.tool_use_id
            if cid not in pending or cid in answered:
                fail(f"tool_use_id {cid!r} " + ("is answered twice" if cid in answered else
                      "matches no tool_use block of the assistant message before it"),
                      f"messages[{i}].content[{j}].tool_use_id")
            answered.add(cid)
        if m.role == "assistant" or len(results) < len(m.content) or not results:  # a turn besides the results
            all_answered()
            pending, answered = [b.id for b in m.content if b.type == "tool_use"], set()
            asked_at = f"messages[{i}]"
    all_answered()


def check_budget(thinking: Thinking, max_tokens: int | None) -> None:
    """thinking.budget_tokens must be below max_tokens, as Anthropic requires; its floor of 1,024 is not kept
    (a small model's context may be shorter than that)."""
    budget = thinking.budget_tokens
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1 or \
            (max_tokens is not None and budget >= max_tokens):
        refuse(f"thinking.budget_tokens: must be an integer >= 1 and below max_tokens ({max_tokens}), got "
               f"{budget!r}", "thinking.budget_tokens", rank_as="thinking")


class CountTokensRequest(RequestModel):
    """check(body, context={"model": name}): the model must be the server's (a 404 otherwise; unchecked
    without a context)."""
    check_order = ("output_config", "system", "messages", "tools", "tool_choice", "thinking", "model")
    budget_needs_max_tokens: ClassVar[bool] = False   # the Messages request checks thinking's budget against it

    model: Any = Field(None, validate_default=True)
    system: str | None = None                     # a string or text blocks: their text
    messages: list[MessageParam] = Field(None, validate_default=True)  # typed blocks in each one's content
    tools: list[Tool] = []                        # custom tools only
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None     # ignored: every prefix is cached here, unasked
    output_config: OutputConfig | None = None     # effort honoured (DSV4's reasoning effort), format refused
    speed: Literal["standard", "fast"] | None = None  # ignored: this server has one speed
    user_profile_id: StrictStr | None = None      # ignored: Anthropic's account bookkeeping
    workspace_id: StrictStr | None = None         # ignored: likewise

    _model = field_validator("model", mode="before")(served_model)

    @field_validator("system", mode="before")
    @classmethod
    def _system(cls, v):
        return None if v is None else text_of(v, "system")

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, v):
        if not isinstance(v, list) or not v:
            fail("must be a non-empty list", "messages")
        out = []
        for i, m in enumerate(v):
            if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
                fail("must be 'user' or 'assistant' (a system prompt goes in the top-level system field, before "
                      "the messages)", f"messages[{i}].role")
            with refusing():
                message = MessageParam.check(m, f"messages[{i}]")
            param = f"messages[{i}].content"
            message.content = _blocks(m.get("content"), param)
            (_user if m["role"] == "user" else _assistant)(message.content, param)
            out.append(message)
        _check_results(out)
        if out[-1].role != "user":
            fail("the last message must be from the user (continuing a partial assistant message is not "
                  "supported)", f"messages[{len(v) - 1}].role")
        return out

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, v):
        if v is None:
            return []
        if not isinstance(v, list):
            fail("must be a list", "tools")
        out = []
        for k, t in enumerate(v):
            where = f"tools[{k}]"
            if not isinstance(t, dict):
                fail("must be an object with name and input_schema", where)
            if t.get("type") not in (None, "custom"):
                fail(f"tool type {t['type']!r} is not available here (only custom tools; server tools are not)",
                      f"{where}.type")
            with refusing():
                tool = Tool.check(t, where)
                tool.refused(where)
            if not TOOL_NAME.fullmatch(tool.name):
                fail("must match [a-zA-Z0-9_-]{1,128}", f"{where}.name")
            if not isinstance(tool.input_schema, dict) or tool.input_schema.get("type") != "object":
                fail("must be a JSON schema object with type 'object'", f"{where}.input_schema")
            out.append(tool)
        return out

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, tc, info: ValidationInfo):
        if tc is None:
            return None
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            fail("must be {'type': 'auto' | 'any' | 'tool' | 'none'} ('tool' with a name)", "tool_choice")
        allowed = ToolChoice.fields() - ({"name"} if tc["type"] != "tool" else set())
        extra = sorted(set(tc) - allowed)
        if extra:
            fail(f"unsupported key(s): {', '.join(extra)}", f"tool_choice.{extra[0]}")
        if not isinstance(tc.get("disable_parallel_tool_use", False), bool):
            fail("must be a boolean", "tool_choice.disable_parallel_tool_use")
        if tc["type"] in ("any", "tool") and not info.data.get("tools"):
            fail(f"type {tc['type']!r} needs tools", "tool_choice")
        if tc["type"] == "tool" and not isinstance(tc.get("name"), str):
            fail(f"must be a string, got {type(tc.get('name')).__name__}", "tool_choice.name")
        return ToolChoice.model_construct(**tc)  # every key checked above

    @field_validator("thinking", mode="before")
    @classmethod
    def _thinking(cls, t):
        if t is None:
            return None
        if not isinstance(t, dict) or t.get("type") not in ("enabled", "adaptive", "between_tools", "disabled"):
            fail("must be {'type': 'enabled', 'budget_tokens': N}, {'type': 'adaptive'}, "
                  "{'type': 'between_tools'} or {'type': 'disabled'}", "thinking")
        with refusing():
            thinking = Thinking.check(t, "thinking")
        if thinking.type == "enabled" and not cls.budget_needs_max_tokens:
            check_budget(thinking, None)
        return thinking

    @field_validator("output_config", mode="after")
    @classmethod
    def _output_config(cls, v):
        if v is not None:
            with refusing():
                v.refused()
        return v

    # -- what the translation reads -----------------------------------------------------------------------
    @property
    def think_budget(self) -> int | None:
        """thinking.budget_tokens (None: adaptive, or no thinking)."""
        return self.thinking.budget_tokens if self.thinking is not None and self.thinking.type == "enabled" else None
