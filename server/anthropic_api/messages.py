"""POST /v1/messages: count_tokens' fields and those of generation and bookkeeping, every field anthropic's
MessageCreateParams defines (and the sampling fields older SDKs define: temperature, top_p, top_k).

Honoured: max_tokens, stop_sequences, stream, temperature, top_p, top_k (and count_tokens' fields).
Ignored: metadata, service_tier (checked), inference_geo, diagnostics.
Refused unless unset: container (code execution is not available here).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, StrictStr, ValidationInfo, field_validator

from ..fields import context, integer, number
from ..sampling import Sampling
from .count_tokens import CountTokensRequest, check_budget, fail
from .parts import Metadata

MAX_TEMPERATURE = 1.0  # Anthropic's bound (OpenAI's is 2)


class MessagesRequest(CountTokensRequest):
    """check(body, context={"model": name, "vocab": n}): top_k is bounded by the vocabulary where it is given."""
    check_order = ("output_config", "container", "metadata", "service_tier", "max_tokens", "system", "messages",
                   "tools", "tool_choice", "thinking", "stop_sequences", "model", "temperature", "top_p", "top_k")
    refusals = {"container": ((None,), "code execution containers are not available here")}
    budget_needs_max_tokens: ClassVar[bool] = True

    max_tokens: int = Field(None, validate_default=True)   # required; app.py bounds it by the context left
    stop_sequences: tuple[str, ...] | None = None
    stream: Any = None                            # read as a truth value
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None              # ignored (checked: only user_id)
    service_tier: str | None = None               # ignored (checked: auto, standard_only)
    container: Any = None
    inference_geo: StrictStr | None = None        # ignored: this server runs where it runs
    diagnostics: dict | None = None               # ignored: Anthropic's prompt-fingerprint comparison

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens(cls, v, info: ValidationInfo):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            fail(f"is required: an integer >= 1, got {v!r}", "max_tokens")
        thinking = info.data.get("thinking")
        if thinking is not None and thinking.type == "enabled":
            check_budget(thinking, v)
        return v

    @field_validator("stop_sequences", mode="before")
    @classmethod
    def _stop_sequences(cls, v):
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            fail("must be a list of non-empty strings", "stop_sequences")
        return tuple(dict.fromkeys(v))

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, v):
        return number(v, "temperature", 0, MAX_TEMPERATURE)

    @field_validator("top_p", mode="before")
    @classmethod
    def _top_p(cls, v):
        return number(v, "top_p", 0, 1, lo_open=True)

    @field_validator("top_k", mode="before")
    @classmethod
    def _top_k(cls, v, info: ValidationInfo):
        vocab = context(info, "vocab")
        return integer(v, "top_k", 1, vocab) if vocab is not None else integer(v, "top_k", 1, 2**63 - 1)

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, md):
        if md is not None and (not isinstance(md, dict) or set(md) - Metadata.fields()
                               or not isinstance(md.get("user_id", ""), (str, type(None)))):
            fail("must be an object with at most user_id (a string)", "metadata")
        return md

    @field_validator("service_tier", mode="before")
    @classmethod
    def _service_tier(cls, v):
        if v not in (None, "auto", "standard_only"):
            fail("must be 'auto' or 'standard_only'", "service_tier")
        return v

    def sampling(self, banned: tuple[int, ...] = ()) -> Sampling:
        return Sampling(temperature=0.0 if self.temperature is None else self.temperature,
                        top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
                        banned=tuple(banned))
