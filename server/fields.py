"""The request fields each endpoint honours; any other is refused with a 400 naming it, as OpenAI refuses
unknown parameters (a client asking for something this server would silently ignore learns it at once).

Adding a field here is a promise: the endpoint must honour it (and a test must show it) or refuse
the values it cannot honour with a 400 naming the field.
"""

from __future__ import annotations

from .errors import APIError

SAMPLING = {"temperature", "top_p", "seed", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
            "logprobs"}
# OpenAI's bookkeeping fields, which agents send and which change nothing about the reply here: accepted
# (type-checked) and ignored. store: keep the completion for OpenAI's dashboard; metadata: tags for it;
# service_tier: OpenAI's capacity tier; prompt_cache_key: a routing hint for OpenAI's prompt cache (this
# server's prefix cache matches tokens, with no hint needed); safety_identifier: an end-user id for abuse
# detection. README.md ("Fields accepted and ignored") names them.
IGNORED = {"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"}
COMMON = {"model", "max_tokens", "stream", "stream_options", "user"} | SAMPLING | IGNORED

CHAT = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                 "response_format", "thinking", "reasoning_effort"}
COMPLETIONS = COMMON | {"prompt", "return_token_ids"}  # logprobs: the legacy int 0..5


def flag(body: dict, key: str, default: bool, param: str | None = None) -> bool:
    """A boolean field (None: the default), checked."""
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(400, f"{param or key} must be a boolean, got {v!r}", param or key)
    return v


def check_fields(body: dict, fields: set[str]) -> None:
    """Refuse fields outside `fields`; check the ones every endpoint shares (stream, stream_options, user)."""
    unknown = sorted(set(body) - fields)
    if unknown:
        raise APIError(400, f"unsupported parameter(s): {', '.join(unknown)}", unknown[0], "unsupported_parameter")
    stream = flag(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise APIError(400, "stream_options must be an object with at most include_usage", "stream_options")
        if not stream:
            raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
        flag(options, "include_usage", False, "stream_options.include_usage")
    for key in ("user", "service_tier", "prompt_cache_key", "safety_identifier"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise APIError(400, f"{key} must be a string", key)
    flag(body, "store", False)
    check_metadata(body.get("metadata"))


def check_metadata(metadata) -> None:
    """OpenAI's metadata: at most 16 string values under string keys (accepted, then ignored)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > 16 or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise APIError(400, "metadata must be an object of at most 16 string values", "metadata")

