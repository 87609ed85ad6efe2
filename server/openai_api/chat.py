"""POST /v1/chat/completions: every field openai's chat completion_create_params defines, and this server's
extensions (thinking, as DeepSeek's API has it).

Honoured: model, messages (messages.py), max_tokens, max_completion_tokens, stream, stream_options
(include_usage; include_obfuscation ignored: no padding is added), the sampling fields, logprobs,
top_logprobs, tools, tool_choice, parallel_tool_calls, response_format, thinking, reasoning_effort.
Ignored (bookkeeping, checked in fields.py): store, metadata, service_tier, prompt_cache_key,
safety_identifier, user, prompt_cache_options and prompt_cache_retention (this server's prefix cache keeps
every prefix, unasked), prediction (a predicted output only speeds OpenAI's decoding; the reply is the same).
Refused unless unset: audio and modalities other than ["text"] (text only), functions and function_call
(the deprecated form of tools: send tools), moderation, web_search_options, verbosity other than "medium"
(the model's length is its own).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictStr

from ..fields import refuse_unless
from .generation import GenerationRequest


class ChatCompletionRequest(GenerationRequest):
    messages: Any = None                  # each checked by its role's model (messages.py, chat_encoding.py)
    max_completion_tokens: Any = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    thinking: Any = None
    reasoning_effort: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
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

    def refused(self) -> None:
        refuse_unless(self.audio, (None,), "audio", "audio output is not available here (text only)")
        refuse_unless(self.modalities, (None, ["text"]), "modalities", "only text output is available here")
        refuse_unless(self.functions, (None,), "functions", "functions are the deprecated form of tools: send tools")
        refuse_unless(self.function_call, (None,), "function_call",
                      "function_call is the deprecated form of tool_choice: send tool_choice")
        refuse_unless(self.moderation, (None,), "moderation", "moderation is not available here")
        refuse_unless(self.web_search_options, (None,), "web_search_options", "web search is not available here")
        refuse_unless(self.verbosity, (None, "medium"), "verbosity",
                      "the reply's length is the model's own here (only the default, medium)")
