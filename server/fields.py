"""The request fields each endpoint honours; any other is refused with a 400 naming it, as OpenAI refuses
unknown parameters (a client asking for something this server would silently ignore learns it at once).

Adding a field here is a promise: the endpoint must honour it (and a test must show it) or refuse
the values it cannot honour with a 400 naming the field.
"""

from __future__ import annotations

from .errors import APIError

SAMPLING = {"temperature", "top_p", "seed", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
            "logprobs"}
COMMON = {"model", "max_tokens", "stream", "stream_options", "user"} | SAMPLING

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
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise APIError(400, "user must be a string", "user")

