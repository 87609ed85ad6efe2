"""POST /v1/chat/completions: every field openai's chat completion_create_params defines, and this server's
extensions (thinking, as DeepSeek's API has it).

Honoured: model, messages (messages.py), max_tokens, max_completion_tokens, stream, stream_options
(include_usage; include_obfuscation ignored: no padding is added), the sampling fields, logprobs,
top_logprobs, tools, tool_choice, parallel_tool_calls, response_format, thinking, reasoning_effort.
Ignored (bookkeeping, checked): store, metadata, service_tier, prompt_cache_key, safety_identifier, user,
prompt_cache_options and prompt_cache_retention (this server's prefix cache keeps every prefix, unasked),
prediction (a predicted output only speeds OpenAI's decoding; the reply is the same).
Refused unless unset: audio and modalities other than ["text"] (text only), functions and function_call
(the deprecated form of tools: send tools), moderation, web_search_options, verbosity other than "medium"
(the model's length is its own).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictStr, ValidationInfo, field_validator, model_validator

from ostinato.chat_encodings import OFF

from ..fields import check_metadata, count, flag, integer, refuse, string
from ..sampling import MAX_TOP_LOGPROBS, STRUCTURED
from .generation import GenerationRequest


class ChatCompletionRequest(GenerationRequest):
    # messages, the tools' entries and tool_choice are checked as the prompt is rendered, after these
    check_order = ("audio", "modalities", "functions", "function_call", "moderation", "web_search_options",
                   "verbosity", "stream", "stream_options", "user", "service_tier", "prompt_cache_key",
                   "safety_identifier", "store", "metadata", "model", "tools", "reasoning_effort", "thinking", "n",
                   "logprobs", "top_logprobs", "temperature", "top_p", "seed", "presence_penalty",
                   "frequency_penalty", "logit_bias", "stop", "parallel_tool_calls", "max_completion_tokens",
                   "max_tokens", "response_format")
    refusals = {
        "audio": ((None,), "audio output is not available here (text only)"),
        "modalities": ((None, ["text"]), "only text output is available here"),
        "functions": ((None,), "functions are the deprecated form of tools: send tools"),
        "function_call": ((None,), "function_call is the deprecated form of tool_choice: send tool_choice"),
        "moderation": ((None,), "moderation is not available here"),
        "web_search_options": ((None,), "web search is not available here"),
        "verbosity": ((None, "medium"), "the reply's length is the model's own here (only the default, medium)"),
    }

    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    tools: list = []                      # FunctionTool each: chat_encoding checks them as it renders them
    reasoning_effort: str | None = None   # "none" (OFF): thinking off; else one of chat_encodings.EFFORT_STEP
    thinking: bool | None = None          # true/false or {"type": "enabled"|"disabled"}; thinking_mode reads it
    messages: Any = None                  # each checked by its role's model (messages.py) as chat_encoding renders it
    tool_choice: Any = None               # tool_choice.py: it needs the tools' names and the tokenizer
    logprobs: bool | None = None
    top_logprobs: int | None = None
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = None   # max_tokens' newer name; read first
    response_format: dict | None = None   # {"type": "text" | "json_object" | "json_schema", ...}: constrained.py
    prompt_cache_options: dict | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prediction: dict | None = None
    audio: Any = None
    modalities: Any = None
    functions: Any = None
    function_call: Any = None
    moderation: Any = None
    web_search_options: Any = None
    verbosity: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_tokens_beside_max_completion_tokens(cls, body):
        """max_completion_tokens is read first: beside a valid one, max_tokens is not read (nor checked)."""
        mct = body.get("max_completion_tokens") if isinstance(body, dict) else None
        if isinstance(mct, int) and not isinstance(mct, bool) and mct >= 1 and "max_tokens" in body:
            body = {k: v for k, v in body.items() if k != "max_tokens"}
        return body

    @field_validator("service_tier", "prompt_cache_key", "safety_identifier", mode="before")
    @classmethod
    def _bookkeeping_string(cls, v, info: ValidationInfo):
        return string(v, info.field_name)

    @field_validator("store", mode="before")
    @classmethod
    def _store(cls, v):
        return flag(v, "store")

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, v):
        check_metadata(v)
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, v):
        if not isinstance(v or [], list):
            refuse("tools must be a list", "tools")
        return v or []

    @field_validator("reasoning_effort", mode="before")
    @classmethod
    def _reasoning_effort(cls, v):
        if v is not None and not isinstance(v, str):
            refuse(f"reasoning_effort must be a string, got {v!r}", "reasoning_effort")
        from ..chat_encoding import ChatOptions, ConversationError  # here: chat_encoding imports openai_api
        try:
            ChatOptions(reasoning_effort=None if v == OFF else v)  # one of the efforts chat_encoding knows
        except ConversationError as e:
            refuse(str(e), e.param)
        return v

    @field_validator("thinking", mode="before")
    @classmethod
    def _thinking(cls, v, info: ValidationInfo):
        if info.data.get("reasoning_effort") == OFF:
            return False  # thinking is off whatever this says
        if isinstance(v, dict):
            if v.get("type") not in ("enabled", "disabled"):
                refuse("thinking.type must be 'enabled' or 'disabled'", "thinking")
            return v["type"] == "enabled"
        if not isinstance(v, bool):
            refuse("thinking must be a boolean or {'type': 'enabled'|'disabled'}", "thinking")
        return v

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, v):
        return flag(v, "logprobs", None)

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _top_logprobs(cls, v, info: ValidationInfo):
        top = integer(v, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top and not info.data.get("logprobs"):
            refuse("top_logprobs needs logprobs: true", "top_logprobs")
        return top

    @field_validator("parallel_tool_calls", mode="before")
    @classmethod
    def _parallel_tool_calls(cls, v):
        return flag(v, "parallel_tool_calls", True)

    @field_validator("max_completion_tokens", mode="before")
    @classmethod
    def _max_completion_tokens(cls, v):
        return count(v, "max_completion_tokens")

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, v):
        if v is not None and (not isinstance(v, dict) or v.get("type") not in ("text",) + STRUCTURED):
            refuse("response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                   "{'type': 'json_schema', 'json_schema': {...}}", "response_format")
        return v

    # -- what the handler reads ---------------------------------------------------------------------------
    @property
    def thinking_mode(self) -> bool:
        """The `thinking` field where given; else on where reasoning_effort asks for an effort (OpenAI's way to
        ask a reasoning model for one), off where it is "none" or absent."""
        if self.given("thinking"):
            return bool(self.thinking)
        return self.reasoning_effort not in (None, OFF)

    @property
    def effort(self) -> str | None:
        """The reasoning effort asked for (None: the release's default level, or thinking off)."""
        return None if self.reasoning_effort == OFF else self.reasoning_effort

    def asked_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_counts(self) -> tuple[bool, int]:
        return bool(self.logprobs), self.top_logprobs or 0
