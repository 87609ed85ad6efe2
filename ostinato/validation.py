"""Validated records: the one way the core checks what a user or another program hands it.

Hardware specs and plans are pydantic v2 models built on `Record`. Why pydantic: it is the
schema library the Python ecosystem maintains most actively (FastAPI, the OpenAI client, vLLM),
refuses unknown keys (`extra="forbid"`, so a misspelled `cpu_onyl: true` is an error instead of
a silent default), checks types strictly where we ask (`"two"` and `true` are not integers) and
reports every problem with its location, which `validate` turns into one line that names the
file and the dotted field. Records are frozen: a plan read from disk is not edited in place.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError

R = TypeVar("R", bound="Record")


class SchemaError(ValueError):
    """Input that does not fit its schema; the message names the source and the field."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def replace(self: R, **changes: Any) -> R:
        """A copy with `changes`, checked like a record read from a file."""
        new = self.model_copy(update=changes)
        validate(type(self), new.model_dump(), f"{type(self).__name__} with {', '.join(changes)} replaced")
        return new


def _integral(v: Any) -> Any:
    # YAML writes big byte counts as 24e9 (a float): accept those that are whole numbers.
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


Count = Annotated[int, Strict(), Field(gt=0)]                               # 1, 2, ...
Index = Annotated[int, Strict(), Field(ge=0)]                               # 0, 1, ...
Bytes = Annotated[int, BeforeValidator(_integral), Strict(), Field(ge=0)]   # 24e9 is fine
Rate = Annotated[float, Strict(), Field(gt=0)]                              # per second, > 0
Seconds = Annotated[float, Strict(), Field(ge=0)]                           # a duration, >= 0
Share = Annotated[float, Strict(), Field(ge=0, le=1)]                       # a fraction
Flag = Annotated[bool, Strict()]                                            # true / false, not "yes"
Name = Annotated[str, Strict(), Field(min_length=1)]
Sha256 = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]


def validate(cls: type[R], data: Any, source: str) -> R:
    """`cls` built from `data`, or a SchemaError naming `source` and each field at fault."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise SchemaError(f"{source}: {'; '.join(_describe(cls, err) for err in e.errors())}") from None


def _describe(cls: type[BaseModel], err: dict) -> str:
    loc = err["loc"]
    where = _dotted(loc)
    if not where:  # a whole-record check: its message names the fields itself
        return _message(err) if err["type"] == "value_error" else f"top level: {_message(err)}"
    if err["type"] == "extra_forbidden":
        known = _known_fields(cls, loc[:-1])
        hint = f" (known fields here: {', '.join(known)})" if known else ""
        return f"field '{where}' is not a known field{hint}"
    if err["type"] == "missing":
        return f"field '{where}' is missing"
    if err["type"] == "value_error":  # our own checks: their message says what is wrong
        msg = _message(err)
        return msg if msg.startswith("field ") else f"field '{where}': {msg}"
    return f"field '{where}': {_message(err)}, got {err.get('input')!r}"


def _message(err: dict) -> str:
    msg = err["msg"]
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "constrained-")):  # pydantic's validator steps
            out += f".{part}" if out else str(part)
    return out


def _known_fields(cls: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the record at `loc` under `cls` (empty where it is not a record)."""
    current: Any = cls
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = _record_type(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _record_type(annotation: Any) -> Any:
    """The record class inside `X`, `list[X]` or `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _record_type(arg)
        if found is not None:
            return found
    return None
