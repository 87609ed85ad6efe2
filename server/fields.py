"""The request fields each endpoint honours; any other is refused with a 400 naming it, as OpenAI refuses
unknown parameters (a client asking for something this server would silently ignore learns it at once).

Adding a field here is a promise: the endpoint must honour it (and a test must show it) or refuse
the values it cannot honour with a 400 naming the field.

Each endpoint's request is a typed model (RequestModel, pydantic), one per endpoint, grouped by API:
openai_api/ (chat completions, completions) and anthropic_api/ (messages, count_tokens). Every field the
official SDKs define is a field there (tests/test_request_models.py walks the SDKs' types), so a client's
`model_dump()` sent back is understood; a field is then honoured, accepted and ignored (bookkeeping), or
its values refused with a 400 naming it. Unknown fields are refused, as OpenAI and Anthropic refuse them.

A handler parses its body once, `Model.check(body, context=server.request_context)`, and reads typed
attributes after that: each field's checks are its validators (refuse() gives the exact 400 message and
param), including those bound by the server (the model's name, a 404 otherwise; the vocabulary). What a
field needs beyond the body is checked where it is used: messages, tools and tool_choice as the prompt is
rendered (chat_encoding.py, tool_choice.py), response_format's schema as it is compiled, the context length
once the prompt is tokenized.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, ClassVar, NoReturn

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from .errors import APIError

# OpenAI's bookkeeping fields, which agents send and which change nothing about the reply here: accepted
# (type-checked below) and ignored. store: keep the completion for OpenAI's dashboard; metadata: tags for it;
# service_tier: OpenAI's capacity tier; prompt_cache_key: a routing hint for OpenAI's prompt cache (this
# server's prefix cache matches tokens, with no hint needed); safety_identifier: an end-user id for abuse
# detection. README.md ("Fields accepted and ignored") names them; openai_api/ has the rest of each endpoint.

REFUSED = "refused"  # the pydantic error type of refuse(): a field's own message and param


def refuse(message: str, param: str | None, status: int = 400, code: str | None = None,
           rank_as: str | None = None) -> NoReturn:
    """In a validator: the field is refused with exactly this message, naming `param` (check() turns it into
    the APIError). A pydantic error rather than an APIError, so that the model's other errors are still
    collected and check() reports the first in the model's check_order; rank_as: the field whose place in that
    order this takes (default: the field being validated), for a check that needs a field declared later."""
    raise PydanticCustomError(REFUSED, "{message}", {"message": message, "param": param, "status": status,
                                                     "code": code, "rank_as": rank_as})


@contextmanager
def refusing():
    """In a validator: an APIError raised by a nested check (`Model.check(value, where)`) becomes refuse()."""
    try:
        yield
    except APIError as e:
        refuse(e.message, e.param, e.status, e.code)


def context(info: ValidationInfo, key: str):
    """A value the server passes to check() (the vocabulary size, the chat encoding), None without it."""
    return (info.context or {}).get(key)


def served_model(v, info: ValidationInfo):
    """A request's `model`, which must be the one the server passes to check() (a 404 naming both otherwise)."""
    name = context(info, "model")
    if name is not None and v != name:
        refuse(f"model {v!r} does not exist; this server has {name!r}", "model", 404, "model_not_found")
    return v


class RequestModel(BaseModel):
    """A request object: every field known, anything else refused (extra="forbid"). Aliases carry field
    names that shadow BaseModel's (`schema`). `check(body, where)` gives APIErrors naming the field at fault."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)

    # A request with several faults gets the first of them: pydantic's own errors (a field's type, an unknown
    # field), then the validators' refusals in this order (fields not named: after them, as declared). It is
    # the order the server has always checked the fields in, so a client sees the same error it always saw.
    check_order: ClassVar[tuple[str, ...]] = ()
    # Fields whose other values this server cannot honour: name -> (the values allowed, why the others are
    # refused); refused while parsing, with a 400 "{name}: {why}".
    refusals: ClassVar[dict[str, tuple[tuple, str]]] = {}

    @classmethod
    def fields(cls) -> set[str]:
        """The field names as clients write them."""
        return {f.alias or name for name, f in cls.model_fields.items()}

    @classmethod
    def check(cls, body, where: str = "", context: dict | None = None):
        """The validated model of `body` (a dict); APIError (400) naming the first field at fault: at the top
        level an unknown field is OpenAI's "unsupported parameter", deeper "unsupported key". pydantic's own
        errors (a field's type, an unknown field) come before the validators' refusals, the order in which
        the server used to check them; then the fields in the order the model declares them.
        `context`: what validators bound by the server read (context())."""
        try:
            return cls.model_validate(body, context=context)
        except ValidationError as e:
            err = min(e.errors(include_url=False), key=cls._rank)
            if err["type"] == REFUSED:
                ctx = err["ctx"]
                raise APIError(ctx["status"], ctx["message"], ctx["param"], ctx["code"]) from None
            loc = [x for x in err["loc"] if isinstance(x, int) or _FIELD.fullmatch(str(x))]
            param = where + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc)
            param = param.lstrip(".") or None
            if err["type"] == "extra_forbidden":
                if where or len(loc) > 1:
                    raise APIError(400, f"{param}: unsupported key {loc[-1]!r}", param) from None
                raise APIError(400, f"unsupported parameter(s): {loc[0]}", param, "unsupported_parameter") from None
            raise APIError(400, f"{param}: {err['msg']}", param) from None

    @classmethod
    def _rank(cls, err: dict) -> tuple[int, int]:
        if err["type"] != REFUSED:
            return 0, 0
        field = err["ctx"]["rank_as"] or (err["loc"][0] if err["loc"] else None)
        return 1, cls.check_order.index(field) if field in cls.check_order else len(cls.check_order)

    @field_validator("*", mode="after")
    @classmethod
    def _refusals(cls, v, info: ValidationInfo):
        if info.field_name in cls.refusals:
            allowed, why = cls.refusals[info.field_name]
            if v not in allowed:
                refuse(f"{info.field_name}: {why}", info.field_name)
        return v

    def refused(self) -> None:
        """The `refusals` of this object's values as APIErrors: check() refuses them already while parsing; this
        says the same of a model built otherwise (model_construct)."""
        for name, (allowed, why) in self.refusals.items():
            refuse_unless(getattr(self, name), allowed, name, why)

    def given(self, name: str) -> bool:
        """Whether the request holds the field (null included), as opposed to leaving it out."""
        return name in self.model_fields_set


_FIELD = re.compile(r"[a-z_][a-z0-9_]*")  # loc entries that are field names (not pydantic's union-branch tags)



class StreamOptions(RequestModel):
    """OpenAI's stream_options (both endpoints). include_obfuscation: OpenAI pads stream chunks against
    length side channels; none are added here, so it is accepted and changes nothing."""
    include_usage: bool | None = None
    include_obfuscation: bool | None = None

# -- the checks fields share (each as the server has always worded it) -----------------------------------------
def flag(v: Any, param: str, default: bool = False) -> bool:
    """A boolean field (None: the default), checked."""
    if v is None:
        return default
    if not isinstance(v, bool):
        refuse(f"{param} must be a boolean, got {v!r}", param)
    return v


def integer(v: Any, param: str, lo: int, hi: int) -> int | None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi):
        refuse(f"{param} must be an integer in [{lo}, {hi}], got {v!r}", param)
    return v


def count(v: Any, param: str, lo: int = 1) -> int | None:
    """An integer >= lo without an upper bound (a token count)."""
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
        refuse(f"{param} must be an integer >= {lo}, got {v!r}", param)
    return v


def number(v: Any, param: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        refuse(f"{param} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}", param)
    return float(v)


def string(v: Any, param: str) -> str | None:
    if v is not None and not isinstance(v, str):
        refuse(f"{param} must be a string", param)
    return v


def refuse_unless(value: Any, allowed: tuple, param: str, why: str) -> None:
    """A known field whose other values this server cannot honour: a 400 naming it and saying why."""
    if value not in allowed:
        raise APIError(400, f"{param}: {why}", param)


def check_metadata(metadata) -> None:
    """OpenAI's metadata: at most 16 string values under string keys (accepted, then ignored)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > 16 or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        refuse("metadata must be an object of at most 16 string values", "metadata")
