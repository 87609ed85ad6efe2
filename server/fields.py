"""The request fields each endpoint honours; any other is refused with a 400 naming it, as OpenAI refuses
unknown parameters (a client asking for something this server would silently ignore learns it at once).

Adding a field here is a promise: the endpoint must honour it (and a test must show it) or refuse
the values it cannot honour with a 400 naming the field.

Each endpoint's request is a typed model (RequestModel, pydantic), one per endpoint, grouped by API:
openai_api/ (chat completions, completions) and anthropic_api/ (messages, count_tokens). Every field the
official SDKs define is a field there (tests/test_request_models.py walks the SDKs' types), so a client's
`model_dump()` sent back is understood; a field is then honoured, accepted and ignored (bookkeeping), or
its values refused with a 400 naming it. Unknown fields are refused, as OpenAI and Anthropic refuse them.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import APIError

# OpenAI's bookkeeping fields, which agents send and which change nothing about the reply here: accepted
# (type-checked below) and ignored. store: keep the completion for OpenAI's dashboard; metadata: tags for it;
# service_tier: OpenAI's capacity tier; prompt_cache_key: a routing hint for OpenAI's prompt cache (this
# server's prefix cache matches tokens, with no hint needed); safety_identifier: an end-user id for abuse
# detection. README.md ("Fields accepted and ignored") names them; openai_api/ has the rest of each endpoint.


class RequestModel(BaseModel):
    """A request object: every field known, anything else refused (extra="forbid"). Aliases carry field
    names that shadow BaseModel's (`schema`). `check(body, where)` gives APIErrors naming the field at fault."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)

    @classmethod
    def fields(cls) -> set[str]:
        """The field names as clients write them."""
        return {f.alias or name for name, f in cls.model_fields.items()}

    @classmethod
    def check(cls, body, where: str = ""):
        """The validated model of `body` (a dict); APIError (400) naming the first field at fault: at the top
        level an unknown field is OpenAI's "unsupported parameter", deeper "unsupported key"."""
        try:
            return cls.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            loc = [x for x in err["loc"] if isinstance(x, int) or _FIELD.fullmatch(str(x))]
            param = where + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc)
            param = param.lstrip(".") or None
            if err["type"] == "extra_forbidden":
                if where or len(loc) > 1:
                    raise APIError(400, f"{param}: unsupported key {loc[-1]!r}", param) from None
                raise APIError(400, f"unsupported parameter(s): {loc[0]}", param, "unsupported_parameter") from None
            raise APIError(400, f"{param}: {err['msg']}", param) from None


_FIELD = re.compile(r"[a-z_][a-z0-9_]*")  # loc entries that are field names (not pydantic's union-branch tags)


class StreamOptions(RequestModel):
    """OpenAI's stream_options (both endpoints). include_obfuscation: OpenAI pads stream chunks against
    length side channels; none are added here, so it is accepted and changes nothing."""
    include_usage: Any = None
    include_obfuscation: Any = None


def refuse_unless(value: Any, allowed: tuple, param: str, why: str) -> None:
    """A known field whose other values this server cannot honour: a 400 naming it and saying why."""
    if value not in allowed:
        raise APIError(400, f"{param}: {why}", param)


def flag(body: dict, key: str, default: bool, param: str | None = None) -> bool:
    """A boolean field (None: the default), checked."""
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(400, f"{param or key} must be a boolean, got {v!r}", param or key)
    return v


def check_fields(body: dict, model: type[RequestModel]) -> None:
    """Check `body` against its endpoint's model (unknown fields and refused values are 400s naming them),
    then the fields OpenAI's endpoints share (stream, stream_options, user and the bookkeeping ones)."""
    model.check(body).refused()
    stream = flag(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - StreamOptions.fields():
            raise APIError(400, "stream_options must be an object with at most include_usage and "
                                "include_obfuscation", "stream_options")
        if not stream:
            raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
        flag(options, "include_usage", False, "stream_options.include_usage")
        flag(options, "include_obfuscation", False, "stream_options.include_obfuscation")
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
