"""The fields both OpenAI endpoints define alike (chat.py, completions.py): the model, max_tokens, streaming,
the user, and the sampling fields, each checked here as it is parsed (a 400 naming it), so the handlers read
typed values: `sampling()` is the request's Sampling.

The fields are declared in the order the server checks them: check() reports the first at fault."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from ..fields import (
    RequestModel,
    StreamOptions,
    context,
    count,
    flag,
    integer,
    number,
    refuse,
    served_model,
    string,
)
from ..sampling import Sampling
from ..stop import MAX_STOPS

SEED_BOUNDS = (-2**63, 2**63 - 1)


def check_stop(v: Any) -> tuple[str, ...] | None:
    """OpenAI's `stop`: a string or a list of up to 4 non-empty strings; once each, in order."""
    if v is None:
        return None
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        refuse(f"stop must be a non-empty string or a list of at most {MAX_STOPS} non-empty strings", "stop")
    return tuple(dict.fromkeys(stops))


def check_logit_bias(v: Any, vocab: int | None) -> tuple[tuple[int, float], ...] | None:
    """{token id (a string): bias in [-100, 100]} -> ((id, bias), ...); ids below `vocab` where it is known."""
    if v is None:
        return None
    if not isinstance(v, dict):
        refuse("logit_bias must be an object mapping token ids (as strings) to numbers", "logit_bias")
    out = []
    for key, bias in v.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and (vocab is None or int(key) < vocab)):
            refuse(f"logit_bias key {key!r} is not a token id in [0, {vocab})", "logit_bias")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not -100 <= bias <= 100:
            refuse(f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r}", "logit_bias")
        out.append((int(key), float(bias)))
    return tuple(out)


class GenerationRequest(RequestModel):
    """check(body, context={"model": name, "vocab": n}): the model must be the server's (a 404 otherwise), and
    logit_bias' token ids (and completions' prompt ids) are bounded by the vocabulary; without a context,
    neither is checked."""
    model: Any = Field(None, validate_default=True)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    max_tokens: int | None = None         # app.py bounds it by the context left after the prompt
    n: int | None = None
    logprobs: Any = None                  # chat: a boolean; completions: the legacy int 0..5
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None   # (token id, added to its logit)
    stop: tuple[str, ...] | None = None

    _model = field_validator("model", mode="before")(served_model)

    @field_validator("stream", mode="before")
    @classmethod
    def _stream(cls, v):
        return flag(v, "stream")

    @field_validator("stream_options", mode="before")
    @classmethod
    def _stream_options(cls, v, info: ValidationInfo):
        if v is None:
            return None
        if not isinstance(v, dict) or set(v) - StreamOptions.fields():
            refuse("stream_options must be an object with at most include_usage and include_obfuscation",
                   "stream_options")
        if not info.data.get("stream"):
            refuse("stream_options is only allowed with stream: true", "stream_options")
        for key in ("include_usage", "include_obfuscation"):
            flag(v.get(key), f"stream_options.{key}")
        return v

    @field_validator("user", mode="before")
    @classmethod
    def _string(cls, v, info: ValidationInfo):
        return string(v, info.field_name)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _count(cls, v, info: ValidationInfo):
        return count(v, info.field_name)

    @field_validator("n", mode="before")
    @classmethod
    def _n(cls, v):
        if v is not None and (type(v) is not int or v != 1):
            refuse(f"only n=1 is supported, got {v!r}", "n")
        return v

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, v):
        return number(v, "temperature", 0, 2)

    @field_validator("top_p", mode="before")
    @classmethod
    def _top_p(cls, v):
        return number(v, "top_p", 0, 1, lo_open=True)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, v):
        return integer(v, "seed", *SEED_BOUNDS)

    @field_validator("presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _penalty(cls, v, info: ValidationInfo):
        return number(v, info.field_name, -2, 2)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, v, info: ValidationInfo):
        return check_logit_bias(v, context(info, "vocab"))

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v):
        return check_stop(v)

    # -- what the handlers read --------------------------------------------------------------------------
    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stops(self) -> tuple[str, ...]:
        return self.stop or ()

    def asked_tokens(self) -> int | None:
        """The reply's token limit the request asks for (None: as many as the context leaves)."""
        return self.max_tokens

    def logprob_counts(self) -> tuple[bool, int]:
        """(report logprobs?, how many of the most likely tokens with each): the endpoint's spelling."""
        raise NotImplementedError

    def sampling(self, banned: tuple[int, ...] = ()) -> Sampling:
        logprobs, top = self.logprob_counts()
        return Sampling(temperature=_or(self.temperature, 0.0), top_p=_or(self.top_p, 1.0),
                        seed=self.seed, presence_penalty=_or(self.presence_penalty, 0.0),
                        frequency_penalty=_or(self.frequency_penalty, 0.0), logit_bias=self.logit_bias or (),
                        banned=tuple(banned), logprobs=logprobs, top_logprobs=top)


def _or(v, default):
    return default if v is None else v
