"""The releases' chat encodings (ostinato/chat_encodings.py): their reasoning-effort levels and preambles, how the
APIs' effort settings map onto them, and how a checkpoint folder picks one."""

import pytest

from ostinato.chat_encodings import (
    ABSOLUTE_MAXIMUM,
    BEYOND_MAXIMUM,
    ENCODER_FILE,
    ChatEncodingError,
    choose_encoding,
    effort_for_budget,
    level_for,
    preamble,
)


def test_0731_moved_every_level_down_one():
    """The original's max text is 0731's high; 0731's max is new, with its em dash; low (0731's default) and the
    original's high (its default) add nothing."""
    assert preamble("dsv4", "max") == preamble("dsv4-0731", "high") == ABSOLUTE_MAXIMUM
    assert preamble("dsv4-0731", "max") == BEYOND_MAXIMUM != ABSOLUTE_MAXIMUM
    assert BEYOND_MAXIMUM.startswith("Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and "
                                     "uncompromising.\n")
    assert preamble("dsv4", "high") == preamble("dsv4-0731", "low") == ""
    for text in (ABSOLUTE_MAXIMUM, BEYOND_MAXIMUM):
        assert text.endswith("unchecked.\n\n") or text.endswith("undiscovered.\n\n")
        assert text.count("\n") == 4  # three lines, then the blank line before the first message


@pytest.mark.parametrize("effort, original, release_0731", [
    (None, "high", "low"), ("minimal", "high", "low"), ("low", "high", "low"), ("medium", "high", "high"),
    ("high", "high", "high"), ("xhigh", "max", "max"), ("max", "max", "max"),
])
def test_api_efforts_map_onto_each_releases_levels(effort, original, release_0731):
    assert level_for("dsv4", effort) == original and level_for("dsv4-0731", effort) == release_0731


def test_thinking_budgets_map_by_claude_codes_keywords():
    assert [effort_for_budget(b) for b in (1024, 4000, 10_000, 31_998, 31_999, 64_000)] == \
        ["low", "low", "high", "high", "max", "max"]
    assert level_for("dsv4", effort_for_budget(4000)) == "high"
    assert level_for("dsv4", effort_for_budget(31_999)) == "max"


def test_an_unknown_effort_names_the_parameter():
    with pytest.raises(ChatEncodingError, match="reasoning effort must be one of none, minimal") as e:
        level_for("dsv4-0731", "extreme")
    assert e.value.param == "reasoning_effort"


def test_the_folder_says_which_encoding(tmp_path):
    assert choose_encoding(tmp_path, has_dspark=False)[0] == "dsv4"
    assert choose_encoding(tmp_path, has_dspark=True)[0] == "dsv4-0731"
    (tmp_path / ENCODER_FILE).parent.mkdir()
    (tmp_path / ENCODER_FILE).write_text('EFFORT = {"max": "Reasoning Effort: Absolute maximum with no shortcuts"}\n')
    encoding, why = choose_encoding(tmp_path, has_dspark=True)  # the file wins over the config's hint
    assert encoding == "dsv4" and str(ENCODER_FILE) in why
    (tmp_path / ENCODER_FILE).write_text(f'EFFORT = {{"max": {BEYOND_MAXIMUM!r}}}\n')
    assert choose_encoding(tmp_path, has_dspark=False)[0] == "dsv4-0731"
