"""The plan's chat encoding decides what an API's effort setting puts before the conversation, through the
official clients: a 0731 checkpoint's plan (chat_encoding dsv4-0731) offers low / high / max, OpenAI's
reasoning_effort and Anthropic's output_config.effort or thinking budget pick among them."""

import anthropic
import openai
import pytest
from server_helpers import tiny_server

from ostinato.chat_encodings import ABSOLUTE_MAXIMUM, BEYOND_MAXIMUM
from ostinato.server.chat_encoding import ChatOptions, encode_chat, render_parts
from ostinato.tiny import write_tiny_checkpoint

pytestmark = pytest.mark.slow  # a server on a model of its own

MESSAGES = [{"role": "user", "content": "Plan the fix."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, kernel_dir):
    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-0731", "tiny", seed=0, progress=False,
                                 release="0731")
    srv, base, app, engine, tok = tiny_server(ckpt, tmp_path_factory.mktemp("effort"), kernel_dir, None)
    assert engine.plan.policy.chat_encoding == "dsv4-0731"  # chosen from the checkpoint (its dspark_* keys)
    yield {"base": base, "tok": tok}
    srv.should_exit = True


def _prompt_tokens(tok, thinking: bool, effort: str | None) -> int:
    return len(encode_chat(tok, render_parts(MESSAGES, [], ChatOptions(thinking, effort, "dsv4-0731"))))


def test_openai_reasoning_effort_picks_the_releases_level(server):
    client = openai.OpenAI(base_url=server["base"], api_key="x", max_retries=0)
    seen = {}
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, reasoning_effort=effort)
        seen[effort] = r.usage.prompt_tokens
    tok = server["tok"]
    assert seen["none"] == _prompt_tokens(tok, False, None)                          # no thinking
    assert seen["minimal"] == seen["low"] == _prompt_tokens(tok, True, None)         # 0731's low: no preamble
    assert seen["medium"] == seen["high"] == _prompt_tokens(tok, True, "high") > seen["low"]
    assert seen["xhigh"] == _prompt_tokens(tok, True, "max") != seen["high"]
    assert _prompt_tokens(tok, True, "max") - _prompt_tokens(tok, True, None) == \
        len(tok.encode(BEYOND_MAXIMUM, add_special_tokens=False).ids)
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, reasoning_effort="extreme")


def test_anthropic_effort_and_thinking_budget_pick_the_releases_level(server):
    client = anthropic.Anthropic(base_url=server["base"].removesuffix("/v1"), api_key="x", max_retries=0)

    def count(**kw) -> int:
        return client.messages.count_tokens(model="tiny", messages=MESSAGES, **kw).input_tokens

    tok = server["tok"]
    high = len(tok.encode(ABSOLUTE_MAXIMUM, add_special_tokens=False).ids)
    low = count(thinking={"type": "adaptive"})
    assert low == _prompt_tokens(tok, True, None)
    assert count(thinking={"type": "adaptive"}, output_config={"effort": "high"}) == low + high
    assert count(thinking={"type": "enabled", "budget_tokens": 10_000}) == low + high
    assert count(thinking={"type": "enabled", "budget_tokens": 31_999}) == _prompt_tokens(tok, True, "max")
    assert count(thinking={"type": "disabled"}, output_config={"effort": "max"}) == _prompt_tokens(tok, False, None)
