"""The built-in default holds an agent's conversation (#54): the tiny presets' positions reach the context plans
reserve by default, and a ~100k-token conversation on the default tiny plan continues its next turn from the
cached tokens, computing only the new ones, with the greedy tokens of a session that computed it all."""

from __future__ import annotations

import pytest
import torch
from conftest import compile_tiny_plan

from ostinato.compiler.compile import DEFAULT_CONTEXT
from ostinato.plan import load_plan
from ostinato.plans import plans_dir
from ostinato.runtime.model.rope import rope_tables
from ostinato.tiny.presets import PRESETS, preset_config

CONVERSATION = 100_000  # tokens before the next turn (TraceLab's median cached prefix is 118,656)
TOOL_OUTPUT = 300       # the next turn's new tokens
REPLY = 6               # greedy tokens each turn


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_reach_the_default_context(name):
    cfg = preset_config(name)
    assert cfg["max_position_embeddings"] >= DEFAULT_CONTEXT


def test_the_committed_tiny_plan_fits_its_model():
    plan = load_plan(plans_dir() / "tiny.cpu-only.yaml")
    assert plan.policy.context == DEFAULT_CONTEXT <= preset_config("tiny")["max_position_embeddings"]


def test_more_positions_leave_the_rotations_as_they_were():
    """Only max_position_embeddings grew: YaRN's factor and original window (what the frequencies are made of)
    are the ones the shipped profiles were recorded with, so every position rotates exactly as before."""
    from ostinato.checkpoint.config import ModelConfig

    cfg = ModelConfig.from_dict(preset_config("tiny"), source="tiny")
    before = ModelConfig.from_dict(dict(preset_config("tiny"), max_position_embeddings=4096), source="tiny at 4,096")
    assert cfg.rope_scaling["factor"] == 16 and cfg.rope_scaling["original_max_position_embeddings"] == 256
    for kind, rope in rope_tables(cfg).items():
        assert torch.equal(rope.inv_freq, rope_tables(before)[kind].inv_freq), kind
    # and the slowest compressed-layer channel has not turned once by the last position: no two positions alias
    slowest = rope_tables(cfg)["compress"].inv_freq.min().item()
    assert cfg.max_position_embeddings * slowest < 1.0


def _greedy(session, logits: torch.Tensor, n: int) -> list[int]:
    """n greedy tokens from `logits` (the prompt's last), running all but the last through the session."""
    out = [int(logits.argmax())]
    while len(out) < n:
        out.append(int(session.decode(out[-1]).argmax()))
    return out


@pytest.mark.slow
@pytest.mark.longrun  # two ~100k-token prefills of the tiny model: 5-30 minutes on 2 cores, past the suite's budget
def test_a_100k_conversation_continues_from_its_cached_tokens(tiny_ckpt, tmp_path, kernel_dir):
    from ostinato.runtime.engine.loader import load_engine
    from ostinato.server.prefix_cache import PrefixCache

    # the committed tiny plan's options (plans/profiles/README.md) with the default context
    plan = compile_tiny_plan(tiny_ckpt, tmp_path, kernel_dir, max_hot_per_layer=4)
    assert plan.policy.context == DEFAULT_CONTEXT
    engine = load_engine(tmp_path / "plan.yaml", tiny_ckpt, device="cpu")
    cfg = engine.model.config
    ids = torch.randint(3, cfg.vocab_size, (CONVERSATION + TOOL_OUTPUT,),
                        generator=torch.Generator().manual_seed(54)).tolist()
    first, tool = ids[:CONVERSATION], ids[CONVERSATION:]
    assert CONVERSATION + TOOL_OUTPUT + 2 * REPLY <= cfg.max_position_embeddings  # positions the model has
    cache = PrefixCache(engine.new_session)

    def serve(prompt: list[int]) -> tuple[list[int], int, int]:
        """What the server's worker does with a request: (its reply, prompt tokens reused, routes computed)."""
        before = engine.executor.counters.copy()
        entry, reused = cache.acquire(prompt)
        logits = entry.session.prefill(prompt[reused:], last_only=True)[-1]
        routes = engine.executor.counters.minus(before).routes
        entry.tokens = list(prompt)
        reply = _greedy(entry.session, logits, REPLY)
        entry.tokens += reply[:-1]  # the last reply token is not run until the next turn sends it back
        cache.release(entry)
        return reply, reused, routes

    reply, reused, _ = serve(first)
    assert reused == 0
    conversation = first + reply + tool  # the client sends the whole conversation back, with the tool's output
    continued, reused, routes = serve(conversation)
    held = CONVERSATION + REPLY - 1
    assert reused == held  # everything the session ran is reused ...
    assert routes == (len(conversation) - held) * cfg.num_experts_per_tok * cfg.n_layers  # ... only the rest computed
    assert len(cache.entries) == 1 and len(next(iter(cache.entries.values())).session) == len(conversation) + REPLY - 1

    fresh = engine.new_session()
    assert _greedy(fresh, fresh.prefill(conversation, last_only=True)[-1], REPLY) == continued
