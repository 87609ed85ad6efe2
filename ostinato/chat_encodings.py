"""The chat encodings of DeepSeek-V4's releases, and how a plan picks one.

The two V4-Flash releases share their chat format except for the reasoning-effort preamble, prepended in
thinking mode before the first message (the releases' `encoding/encoding_dsv4.py`):
- `dsv4` (the original release): levels high (the default: no preamble) and max (ABSOLUTE_MAXIMUM);
- `dsv4-0731` (DeepSeek-V4-Flash-0731): low (the default: no preamble), high (the original's max text,
  ABSOLUTE_MAXIMUM) and max (a new, stronger text, BEYOND_MAXIMUM, with an em dash).
config.json cannot tell the encoders apart (a fine-tune or conversion keeps either config), so the plan
records one (`policy.chat_encoding`): read from the checkpoint's encoder file where it has one, else from
the 0731 release's drafter keys in config.json, else the original; `ostinato-compile --chat-encoding`
overrides the choice.

The APIs' effort settings map onto a release's levels by their order (`level_for`): OpenAI's
reasoning_effort none (no thinking), minimal / low, medium / high, xhigh / max; Anthropic's
output_config.effort likewise, or its thinking budget (THINKING_BUDGET_LEVELS).
"""

from __future__ import annotations

from pathlib import Path

ENCODINGS = ("dsv4", "dsv4-0731")
ENCODER_FILE = Path("encoding") / "encoding_dsv4.py"  # in the official checkpoint folders

ABSOLUTE_MAXIMUM = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n")
BEYOND_MAXIMUM = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n")

# encoding -> level -> preamble ("" none), in order of effort; the first level is the default
PREAMBLES: dict[str, dict[str, str]] = {
    "dsv4": {"high": "", "max": ABSOLUTE_MAXIMUM},
    "dsv4-0731": {"low": "", "high": ABSOLUTE_MAXIMUM, "max": BEYOND_MAXIMUM},
}

# The APIs' effort names, from least to most (OpenAI's reasoning_effort; Anthropic's output_config.effort is a
# subset), onto the three steps low / high / max; "none" turns thinking off (OFF).
OFF = "none"
EFFORT_STEP = {"minimal": 0, "low": 0, "medium": 1, "high": 1, "xhigh": 2, "max": 2}
# Anthropic's thinking budget (tokens) when no effort is given: the step of the largest bound it reaches.
# Claude Code's own keywords ask for 4,000 ("think"), 10,000 ("think hard") and 31,999 ("ultrathink") tokens.
THINKING_BUDGET_LEVELS = ((0, 0), (10_000, 1), (31_999, 2))


class ChatEncodingError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def default_level(encoding: str) -> str:
    return next(iter(PREAMBLES[encoding]))


def level_for(encoding: str, effort: str | None) -> str:
    """The encoding's level for an API effort name (None: the encoding's default). The original release
    has two levels: low and medium fall to its default (high), xhigh and max to max."""
    if encoding not in PREAMBLES:
        raise ChatEncodingError(f"unknown chat encoding {encoding!r}; one of {', '.join(ENCODINGS)}", "chat_encoding")
    if effort is None:
        return default_level(encoding)
    if effort not in EFFORT_STEP:
        raise ChatEncodingError(f"reasoning effort must be one of {', '.join([OFF, *EFFORT_STEP])}; got {effort!r}",
                                "reasoning_effort")
    levels = list(PREAMBLES[encoding])
    step = EFFORT_STEP[effort]
    return levels[max(0, step - (3 - len(levels)))]


def effort_for_budget(budget_tokens: int) -> str:
    """The effort name for an Anthropic thinking budget (THINKING_BUDGET_LEVELS): low, high or max."""
    step = max(s for bound, s in THINKING_BUDGET_LEVELS if budget_tokens >= bound)
    return ("low", "high", "max")[step]


def preamble(encoding: str, level: str) -> str:
    return PREAMBLES[encoding][level]


def choose_encoding(model_dir: Path, has_dspark: bool) -> tuple[str, str]:
    """(encoding, why) for a checkpoint folder: its encoder file where it has one (0731's carries the new max
    text), else the 0731 release's drafter keys in its config, else the original."""
    encoder = Path(model_dir) / ENCODER_FILE
    if encoder.is_file():
        text = encoder.read_text(errors="replace")
        if "Beyond maximum" in text:
            return "dsv4-0731", f"its {ENCODER_FILE} has the 0731 release's reasoning-effort levels (low, high, max)"
        return "dsv4", f"its {ENCODER_FILE} has the original release's reasoning-effort levels (high, max)"
    if has_dspark:
        return "dsv4-0731", (f"no {ENCODER_FILE}; config.json's dspark_* keys are the 0731 release's "
                             "(pass --chat-encoding to choose)")
    return "dsv4", (f"no {ENCODER_FILE} and no 0731 drafter keys: the original release's "
                    "(pass --chat-encoding to choose)")
