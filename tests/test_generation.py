"""The one generation loop (runtime/engine/generation.py, issue #55): draft -> verify -> reject written once,
every token picked through a picker, typed events; ostinato-run and the server's worker both decode through it.

A scripted session (its logits a function of every token it ran, its drafts right some of the time) checks
the loop's bookkeeping on many replies in no time: speculative replies, greedy or sampled under a seed, are
plain decoding's token for token; stop(), cancellation, eos, max_tokens and a finished constraint end a
reply on the right token with the session holding what it ran. The tiny model's engine then runs both
consumers, ostinato-run's generate() and the server's Worker, against plain decoding on a plain engine.
"""

from __future__ import annotations

import hashlib
import queue
import subprocess
import sys

import pytest
import torch
from engine_helpers import _variant
from test_engine_speculative import speculative_plan

from ostinato.runtime.engine import Finished, Generation, GreedyPicker, Token, generate, load_engine
from ostinato.runtime.engine.greedy import greedy_tokens
from ostinato.runtime.model.model import Model
from ostinato.server.events import Done, Generated
from ostinato.server.metrics import Metrics
from ostinato.server.prefix_cache import PrefixCache
from ostinato.server.sampling import Sampler, Sampling
from ostinato.server.worker import Job, JobPicker, Worker

V = 12  # the scripted session's vocabulary


def _noise(*key) -> torch.Tensor:
    """[V] logits that are a pure function of `key` (sharp enough that sampling often agrees with the draft)."""
    seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little") >> 1
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 3


class ScriptedSession:
    """EngineSession's decode / draft / verify / reject over a made-up model: the logits after a token are a
    function of every token run so far, so a session that ran anything else than plain decoding would
    answer differently; the MTP block's logits are another such function, agreeing with the model's only
    sometimes (`agree`: a share of positions where the draft logits are the model's own)."""

    def __init__(self, prompt: list[int], agree: float = 0.5, speculative: bool = True):
        self.ran = list(prompt)
        self.agree = agree
        self.drafter = object() if speculative else None
        self.drafted = self.accepted = 0
        self._mark: list[int] | None = None

    def __len__(self) -> int:
        return len(self.ran)

    def _model(self, ran) -> torch.Tensor:
        return _noise("model", tuple(ran))

    def decode(self, token: int) -> torch.Tensor:
        self._mark = None
        self.ran.append(int(token))
        return self._model(self.ran)

    def draft(self, token: int) -> torch.Tensor:
        self._mark = None
        after = [*self.ran, int(token)]
        own = float(_noise("agree", tuple(after))[0].sigmoid()) < self.agree
        return self._model(after) if own else _noise("mtp", tuple(after))

    def verify(self, token: int, draft: int) -> torch.Tensor:
        self.drafted += 1
        self.accepted += 1
        self._mark = list(self.ran)
        self.ran += [int(token), int(draft)]
        return torch.stack([self._model(self.ran[:-1]), self._model(self.ran)])  # [2, V]

    def reject(self) -> torch.Tensor:
        assert self._mark is not None, "reject() follows a verify()"
        token = self.ran[len(self._mark)]
        self.ran, self._mark = self._mark, None
        self.accepted -= 1
        return self.decode(token)


def plain(session: ScriptedSession, logits, picker, n: int, eos=None) -> list[int]:
    """Plain decoding, one token at a time, written out: what every reply must equal."""
    gen = []
    while len(gen) < n and (not gen or gen[-1] != eos):
        gen.append(picker.pick(logits).token)
        picker.accept(gen[-1])
        if len(gen) < n and gen[-1] != eos:
            logits = session.decode(gen[-1])
    return gen


def sampler_picker(seed: int | None) -> JobPicker:
    """The server's picker for a request: greedy (seed None), or sampled at temperature 1 under `seed`."""
    sampling = Sampling() if seed is None else Sampling(temperature=1.0, top_p=0.9, seed=seed)
    return JobPicker(Job([0], 1, lambda ev: None, sampling))


PROMPT = [3, 1, 4]


@pytest.mark.parametrize("seed", [None, *range(12)])
@pytest.mark.parametrize("n", [1, 2, 3, 9])
def test_speculative_replies_are_plain_decodings(seed, n):
    """Greedy and seeded sampled replies with drafts kept and rejected are plain decoding's, and the session
    ran the reply but its last token (or all of it when the last was a kept draft)."""
    ref = ScriptedSession(PROMPT, speculative=False)
    want = plain(ref, _noise("model", tuple(PROMPT)), sampler_picker(seed), n)
    s = ScriptedSession(PROMPT)
    run = Generation(s, _noise("model", tuple(PROMPT)), sampler_picker(seed), n)
    events = list(run)
    assert [e.id for e in events[:-1]] == want
    assert [e.index for e in events[:-1]] == list(range(n)) and all(isinstance(e, Token) for e in events[:-1])
    assert events[-1] == run.finished == Finished("length", tuple(want), s.drafted, s.accepted)
    assert s.ran in (PROMPT + want[:-1], PROMPT + want)
    assert s.ran == PROMPT + want[:-1] or s.accepted > 0  # the last token ran only as a kept draft
    if n < 3:
        assert s.drafted == 0  # a draft needs two tokens left to be of use


def test_drafts_are_kept_and_rejected():
    """The scripted drafts exercise both paths (the test above would pass vacuously otherwise)."""
    drafted = accepted = 0
    for seed in [None, *range(12)]:
        s = ScriptedSession(PROMPT)
        generate(s, _noise("model", tuple(PROMPT)), 9, picker=sampler_picker(seed))
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert 0 < accepted < drafted


@pytest.mark.parametrize("speculative", [False, True])
def test_stop_ends_the_reply_on_the_token_seen(speculative):
    """stop() after token k: the reply is tokens 0..k (reason "stop") and the session ran nothing after it."""
    want = plain(ScriptedSession(PROMPT, speculative=False), _noise("model", tuple(PROMPT)), GreedyPicker(), 20)
    for k in range(6):
        s = ScriptedSession(PROMPT, agree=0.9, speculative=speculative)
        run = Generation(s, _noise("model", tuple(PROMPT)), GreedyPicker(), 20)
        for event in run:
            if isinstance(event, Token) and event.index == k:
                run.stop()
        assert run.finished.reason == "stop" and list(run.finished.tokens) == want[:k + 1]
        assert s.ran in (PROMPT + want[:k], PROMPT + want[:k + 1])


def test_cancellation_eos_a_done_picker_and_no_tokens():
    want = plain(ScriptedSession(PROMPT, speculative=False), _noise("model", tuple(PROMPT)), GreedyPicker(), 20)
    logits = _noise("model", tuple(PROMPT))
    s = ScriptedSession(PROMPT)
    seen = []
    run = Generation(s, logits, GreedyPicker(), 20, cancelled=lambda: len(seen) == 4)
    for event in run:
        seen.append(event)
    assert run.finished == Finished("cancelled", tuple(want[:4]), s.drafted, s.accepted)
    eos = want[5]
    first_eos = want.index(eos)
    assert generate(ScriptedSession(PROMPT), logits, 20, eos).tokens == tuple(want[:first_eos + 1])

    class StopsAfter(GreedyPicker):  # a structured-output constraint satisfied after 3 tokens
        def done(self):
            return self.count == 3
    done = generate(ScriptedSession(PROMPT), logits, 20, picker=StopsAfter())
    assert done.reason == "stop" and done.tokens == tuple(want[:3])
    s = ScriptedSession(PROMPT)
    assert generate(s, logits, 0) == Finished("length", (), 0, 0) and s.ran == PROMPT  # nothing run


def test_greedy_tokens_continue_from_a_picked_token():
    """greedy.py (the replay's) starts from a token already picked: the loop with it forced first."""
    logits = _noise("model", tuple(PROMPT))
    want = plain(ScriptedSession(PROMPT, speculative=False), logits, GreedyPicker(), 10)
    assert greedy_tokens(ScriptedSession(PROMPT), want[0], 10) == want
    assert greedy_tokens(ScriptedSession(PROMPT), want[0], 0) == want[:1]  # the picked token, whatever n


def test_a_generation_runs_once_and_checks_its_arguments():
    run = Generation(ScriptedSession(PROMPT), _noise("model", tuple(PROMPT)), GreedyPicker(), 3)
    list(run)
    with pytest.raises(RuntimeError, match="runs once"):
        list(run)
    with pytest.raises(ValueError, match="max_tokens must be >= 0, got -1"):
        Generation(ScriptedSession(PROMPT), None, GreedyPicker(), -1)
    with pytest.raises(ValueError, match="Finished.reason must be one of"):
        Finished("eos", (), 0, 0)


def test_the_public_face_imports_in_any_order():
    """ostinato.runtime.engine names the API; a kernel module imported first (it imports engine.streams) must
    not make it a circular import."""
    code = ("import ostinato.runtime.kernels.cold_task; "
            "from ostinato.runtime.engine import Engine, EngineSession, load_engine, Generation, generate, Token; "
            "import ostinato.runtime.engine as e; assert sorted(e.__all__) == e.__all__ and 'load_engine' in dir(e)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ----- the tiny model: both consumers, one loop ------------------------------------------------------------
TINY_PROMPT = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(31)).tolist()
N = 14


def plain_engine_reply(engine, n, sampling: Sampling | None = None) -> list[int]:
    es, sampler = engine.new_session(), Sampler(sampling or Sampling())
    logits, gen = es.prefill(TINY_PROMPT, last_only=True)[-1], []
    while len(gen) < n and (not gen or gen[-1] != engine.model.config.eos_token_id):
        gen.append(sampler.pick(logits).token)
        sampler.accept(gen[-1])
        if len(gen) < n:
            logits = es.decode(gen[-1])
    return gen


def worker_reply(worker: Worker, sampling: Sampling) -> list[int]:
    events: queue.Queue = queue.Queue()
    worker.submit(Job(TINY_PROMPT, N, events.put, sampling))
    got = []
    while not isinstance(ev := events.get(timeout=300), Done):
        assert isinstance(ev, Generated), ev
        got.append(ev.token)
    return got


@pytest.mark.slow  # two engines of the compiled plan
def test_ostinato_run_and_the_server_worker_decode_through_one_loop(compiled, tiny_ckpt):
    """On a speculative engine, ostinato-run's generate() and the server's Worker give plain decoding's reply
    (of a plain engine) greedy, and the worker plain sampling's under a seed."""
    plan = compiled[0]
    plain_engine = load_engine(_variant(plan, "mixed", None), tiny_ckpt, device="cpu")
    spec = load_engine(speculative_plan(plan, "mixed", "mixed"), tiny_ckpt, device="cpu")
    worker = Worker(spec, PrefixCache(spec.new_session), Metrics())
    try:
        want = plain_engine_reply(plain_engine, N)
        es = spec.new_session()
        assert list(generate(es, es.prefill(TINY_PROMPT, last_only=True)[-1], N).tokens) == want
        assert es.drafted > 0
        assert worker_reply(worker, Sampling()) == want
        for seed in (1, 2):
            sampling = Sampling(temperature=1.0, top_p=0.95, seed=seed)
            assert worker_reply(worker, sampling) == plain_engine_reply(plain_engine, N, sampling), seed
        assert worker.metrics.drafted_tokens > 0
    finally:
        worker.stop()
        worker.thread.join(60)
        spec.close()
        plain_engine.close()


def test_load_engine_edits_no_model_after_building_it(compiled, tiny_ckpt, monkeypatch):
    """Everything the plan adds to the model (its context, snapshots, mHC and dense-op kernels) is given when
    it is built: no attribute of a built Model is set during load_engine."""
    built, edits = set(), []
    init, setattr_ = Model.__init__, Model.__setattr__

    def watched_init(self, *a, **kw):
        init(self, *a, **kw)
        built.add(id(self))

    def watched_setattr(self, name, value):
        if id(self) in built:
            edits.append(name)
        setattr_(self, name, value)
    monkeypatch.setattr(Model, "__init__", watched_init)
    monkeypatch.setattr(Model, "__setattr__", watched_setattr)
    engine = load_engine(_variant(compiled[0], "mixed", None), tiny_ckpt, device="cpu")
    try:
        assert built and edits == []
        m, p = engine.model, engine.plan
        assert (m.max_context, m.max_snapshots) == (p.policy.context, p.policy.snapshots)
        assert m.hc_mix is not None and m.dense_ops is not None
        assert m.dense_ops.threads == engine.cpu_threads.threads  # a CPU engine's head runs on the plan's threads
    finally:
        engine.close()
