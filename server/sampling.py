"""Sampling: a request's sampling fields (checked by its request model: openai_api/, anthropic_api/), and
the one place where a step's logits become a token.

    params = request.sampling(banned)                 # the request model's Sampling, before the job is queued
    sampler = Sampler(params, constraint)             # on the engine thread, one per job
    pick = sampler.pick(logits)                       # Pick(token, logprob, top)
    sampler.accept(pick.token)

The logits are adjusted in OpenAI's order: logit_bias added, then the penalties over the tokens
generated so far (frequency_penalty x count + presence_penalty x [count > 0], subtracted), then
banned tokens (tool_choice "none") and the structured-output mask set to -inf. The token is the argmax
of that (temperature 0) or drawn from softmax(adjusted / temperature), cut to the top_k most likely
(renormalized) when top_k is set, then to the top_p nucleus.

A draw is the Gumbel-max trick: argmax over the kept tokens of log p + G, with G a vector of Gumbel
noise that depends only on the seed and the token's index in the reply (a generator seeded by both).
That is an exact draw from p, and a pure function of (logits, seed, index): so a seed repeats a reply
whatever else happened (a cached session, a retried step), and speculative decoding (worker.py) picks
the draft with the same noise and checks it against the model's pick exactly as greedy decoding does,
so a sampled reply is token for token the one plain decoding draws.

Logprobs are log_softmax of the adjusted logits in float32, before temperature and top_p: the model's
distribution as the request reshaped it, the same numbers whether the token was drawn greedily or
sampled, and comparable between requests that differ only in temperature.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import torch

from ostinato.runtime.kernels.argmax import argmax

from .errors import APIError

MAX_TOP_LOGPROBS = 20          # chat completions; the legacy completions API allows 5
MAX_LEGACY_LOGPROBS = 5
LOGPROB_FLOOR = -9999.0        # JSON has no -inf: a token that could not be picked gets this (as OpenAI does)
STRUCTURED = ("json_object", "json_schema")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0                    # 0: greedy (this server's default; OpenAI's is 1)
    top_p: float = 1.0
    top_k: int = 0                              # > 0: draw among the k most likely only (the Messages API's)
    seed: int | None = None                     # with temperature > 0: the same seed draws the same tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit)
    banned: tuple[int, ...] = ()                # never picked (tool_choice "none" bans the DSML token)
    logprobs: bool = False                      # report the picked token's logprob ...
    top_logprobs: int = 0                       # ... and the most likely ones'
    # a reply that starts in reasoning: after this many reasoning tokens, end_think is forced (the Messages
    # API's thinking.budget_tokens); None: the model ends its reasoning itself
    think_budget: int | None = None
    end_think: int | None = None


def constraint_for(response_format: dict | None, factory, tokenizer, thinking: bool = False):
    """The structured-output constraint of a request's response_format, checked by its model (openai_api/chat.py):
    None for text or no format.

    factory(response_format, tokenizer[, thinking=True]) -> an object with .mask(logits) -> logits,
    .advance(token_id) and .done() (constrained.py's); `thinking` only for a reply that starts with
    reasoning, which the constraint must let through up to `</think>`. Without a factory,
    json_object/json_schema are refused rather than silently ignored."""
    if response_format is None or response_format["type"] == "text":
        return None
    if factory is None:
        raise APIError(400, f"response_format {response_format['type']!r}: structured output is not available on "
                            f"this server", "response_format", "unsupported_parameter")
    try:
        return factory(response_format, tokenizer, **({"thinking": True} if thinking else {}))
    except ValueError as e:  # e.g. a schema the constraint cannot compile; the message names where
        raise APIError(400, str(e), getattr(e, "param", None) or "response_format") from None


@dataclass(frozen=True)
class Pick:
    token: int
    logprob: float | None = None                  # None unless the request asked for logprobs
    top: tuple[tuple[int, float], ...] = ()       # the top_logprobs most likely (id, logprob), best first


def _logprob(v: float) -> float:
    return v if v > LOGPROB_FLOOR else LOGPROB_FLOOR  # -inf and NaN (everything masked) too


class Sampler:
    """One job's sampling state: the seeded generator, how often each token was generated (for the
    penalties), and the structured-output constraint. Lives on the engine thread."""

    def __init__(self, params: Sampling, constraint=None):
        self.p, self.constraint = params, constraint
        self.seed = None  # greedy
        if params.temperature > 0:
            self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.index = 0  # the reply's tokens accepted so far: the next pick's index
        self.counts: torch.Tensor | None = None   # [vocab] float32, on the logits' device
        self.think_left = params.think_budget      # reasoning tokens still allowed (None: no budget, or ended)
        self.bias: tuple[torch.Tensor, torch.Tensor] | None = None

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """[vocab] logits -> [vocab] float32: bias, penalties, bans, constraint mask. A new tensor when any of them
        applies (never in place: the engine may reuse its buffer), else the logits themselves, to be read only
        (a greedy pick's copy of the vocabulary would cost as much as the pick)."""
        p = self.p
        changed = (bool(p.logit_bias or p.presence_penalty or p.frequency_penalty or p.banned)
                   or self.constraint is not None)
        x = logits.reshape(-1).to(torch.float32, copy=changed)
        if p.logit_bias:
            if self.bias is None:
                ids, vals = zip(*p.logit_bias)
                self.bias = (torch.tensor(ids, device=x.device), torch.tensor(vals, device=x.device))
            x.index_add_(0, *self.bias)
        if p.presence_penalty or p.frequency_penalty:
            if self.counts is None:
                self.counts = torch.zeros_like(x)
            x -= self.counts * p.frequency_penalty + (self.counts > 0) * p.presence_penalty
        if p.banned:
            x[list(p.banned)] = float("-inf")
        if self.constraint is not None:
            x = self.constraint.mask(x)
        return x

    def pick(self, logits: torch.Tensor, forced: int | None = None, peek: bool = False) -> Pick:
        """The next token (`forced` if given, whatever the logits say) and its logprob info (not with `peek`:
        a speculative draft's token only). Changes no state: accept() does."""
        x = self.adjust(logits)
        if forced is None and self.think_left == 0:  # the thinking budget is spent: the reasoning ends here
            forced = self.p.end_think
        if forced is not None:
            token = forced
        elif self.seed is None:
            token = argmax(x)
        else:
            token = self._draw(x)
        if peek or not self.p.logprobs:
            return Pick(token)
        lp = torch.log_softmax(x, dim=-1)
        top = ()
        if self.p.top_logprobs:
            vals, ids = lp.topk(self.p.top_logprobs)
            top = tuple((int(i), _logprob(float(v))) for i, v in zip(ids.tolist(), vals.tolist()))
        return Pick(token, _logprob(float(lp[token])), top)

    def probs(self, logits: torch.Tensor, forced: int | None = None) -> torch.Tensor:
        """[vocab] logits -> the distribution pick() draws from, [vocab] float64 on the CPU: a point mass on
        the forced token (or on the argmax, greedy), else softmax(adjusted / temperature) cut to top_k and
        to the top_p nucleus (the most likely tokens, best first, until their mass reaches top_p, the one
        crossing it included), renormalized."""
        x = self.adjust(logits)
        if forced is None and self.think_left == 0:
            forced = self.p.end_think
        out = torch.zeros(x.numel(), dtype=torch.float64)
        if forced is not None or self.seed is None:
            out[argmax(x) if forced is None else forced] = 1.0
            return out
        return self._nucleus(x)

    def _nucleus(self, x: torch.Tensor) -> torch.Tensor:
        probs, order = torch.softmax(x.double().cpu() / self.p.temperature, dim=-1).sort(descending=True)
        if self.p.top_k:
            probs, order = probs[:self.p.top_k], order[:self.p.top_k]
        cum = probs.cumsum(0)
        kept = int(((cum - probs < self.p.top_p * cum[-1]) & (probs > 0)).sum().clamp(min=1))
        out = torch.zeros(x.numel(), dtype=torch.float64)
        out[order[:kept]] = probs[:kept] / probs[:kept].sum()
        return out

    def _draw(self, x: torch.Tensor) -> int:
        """argmax of log p + G over the kept tokens, G this index's Gumbel noise (see the module docstring)."""
        p = self._nucleus(x)
        key = hashlib.sha256(f"{self.seed}:{self.index}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") >> 1)  # on the CPU: the same anywhere
        u = torch.rand(p.numel(), generator=g, dtype=torch.float64).clamp_(min=1e-300)
        score = p.log() - (-u.log()).log()  # log p + Gumbel(0, 1); -inf where p = 0
        return argmax(score)

    def accept(self, token: int) -> None:
        """Record a generated token (forced ones too): penalty counts, the constraint's state."""
        self.index += 1
        if self.counts is not None:  # made at the first adjust when a penalty is set
            self.counts[token] += 1
        if self.think_left is not None:
            self.think_left = None if token == self.p.end_think else self.think_left - 1
        if self.constraint is not None:
            self.constraint.advance(token)

    def done(self) -> bool:
        """The constraint is satisfied and allows nothing more: generation ends."""
        return self.constraint is not None and bool(self.constraint.done())
