"""Recording a routing profile: replay agent sessions through the model and count every route.

A session of the workload CSV is replayed turn by turn on one model session (its KV cache kept
across turns, as an agent engine would): prefill the turn's appended tokens, then decode its
generated tokens greedily. Every forward is one recorded pass: a decode step (phase "decode") or
a turn's prefill ("short_prefill" up to `phase_boundary` tokens, "long_prefill" above).

Token ids: real text through the model's tokenizer when the checkpoint has one (the package's
own corpus, or --text), cut into the turn's length from a seeded offset; else ids drawn from the
seed. Generated tokens come from the model itself.

Threads: a model whose matrices are all small (the tiny presets: engine/cpu_step.py's rule, `graph_threads`)
is recorded on one thread, as the engine runs its steps and short prefills: its ops are a few microseconds of
work each, and a fork and join per op costs more than the op, on a busy machine far more (an OpenMP thread
waits for its sibling to be scheduled: one of the demo's tiny sessions took 23 s of CPU on 2 threads against 2.6 s
on 1, measured on a 2-core machine at load 9). Larger models keep torch's threads.

A model loaded with its MTP block (load_model(..., mtp=True)) also has the block follow the session as
speculative decoding runs it (model/speculative.py): over each prefill chunk's pairs (the streams of a
position with the token after it), and with each decoded token the pair before it. Its routes (the
routing observer's layer n_layers) are counted in the pass that ran them, as the profile's MTP row
(ostinato/profile_format.py); the main layers' counts are the same as without it.

With the block the recording also measures its depth-1 greedy acceptance: at every decode step, the
block's draft for the next position (the argmax of the logits of the pair it runs with the decoded token)
against the main model's own greedy pick from that step's logits, teacher-forced along the recorded
greedy path: exactly whether greedy speculative decoding would keep the draft. Prompts do not count (their
tokens are not the model's picks). The counts go to the profile (mtp_drafts, mtp_agreed), and the
compiler prices speculation at that rate instead of the published one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.profile_format import PHASES, RoutingProfile, pack_touched
from ostinato.workload import SessionShape, TokenSource

from .engine.cpu_step import graph_threads, intra_op_threads
from .kernels.argmax import argmax
from .model.mtp import mtp_logits

DEFAULT_BOUNDARY = 1024


class RouteCounter:
    """The model's routing observer: accumulates counts and, per pass, the experts touched."""

    def __init__(self, n_layers: int, n_experts: int):
        self.L, self.E = n_layers, n_experts
        self.counts = torch.zeros(n_layers, len(PHASES), n_experts, dtype=torch.int64)
        self.pass_tokens: list[int] = []
        self.pass_phase: list[int] = []
        self.pass_touched: list[torch.Tensor] = []
        self._phase: int | None = None
        self._touched: torch.Tensor | None = None

    def __call__(self, layer: int, token_ids: torch.Tensor, expert_ids: torch.Tensor) -> None:
        if self._phase is None:
            raise RuntimeError("a forward ran outside a recorded pass")
        hist = torch.bincount(expert_ids.reshape(-1).cpu(), minlength=self.E)  # [E]
        self.counts[layer, self._phase] += hist
        self._touched[layer] |= hist > 0

    def run(self, phase: str, tokens: int, forward):
        """Record one pass: `forward()` runs the model (its prefill may be chunked: still one pass)."""
        self._phase, self._touched = PHASES.index(phase), torch.zeros(self.L, self.E, dtype=torch.bool)
        try:
            return forward()
        finally:
            self.pass_tokens.append(tokens)
            self.pass_phase.append(self._phase)
            self.pass_touched.append(pack_touched(self._touched))
            self._phase = None


class MtpFollower:
    """The MTP block over a session's tokens, one pair behind the main model (SpeculativeDecoder._follow's
    bookkeeping): `hidden` holds the streams [1, N, D] of the last position run, whose next token is not
    known yet. `drafts` / `agreed`: the decode steps' greedy drafts, and those equal to the main model's pick."""

    def __init__(self, model):
        self.model, self.cache, self.next, self.hidden = model, model.new_mtp_cache(), 0, None
        self.drafts = self.agreed = 0

    def chunk(self, ids: torch.Tensor, streams: torch.Tensor) -> torch.Tensor | None:
        """A chunk of tokens ids [t] the main model ran, with its streams [t, N, D]: the draft logits [1, V]
        of the last pair it ran (for the token after the chunk's last), None when it ran none."""
        pairs = streams[:-1] if self.hidden is None else torch.cat((self.hidden, streams[:-1]))
        nxt = ids[1:] if self.hidden is None else ids
        drafted = None
        if nxt.numel():
            drafted = mtp_logits(self.model, pairs, nxt, self.next, self.cache)
            self.next += nxt.numel()
        self.hidden = streams[-1:]
        return drafted

    def decode(self, session, token: int) -> torch.Tensor:
        """One decode step of `session` (token at position P) followed by the block: the token's logits [V].
        The pair (streams of P-1, token) drafts position P+1, which the main model picks from these logits."""
        logits, streams = session.extend([token])
        drafted = self.chunk(torch.tensor([token]), streams)
        if drafted is not None:
            self.drafts += 1
            self.agreed += argmax(drafted[-1]) == argmax(logits[0])
        return logits[0]


def record_profile(model, model_dir: str | Path, sessions: list[SessionShape], phase_boundary: int = DEFAULT_BOUNDARY,
                   seed: int = 0, text: Path | None = None, progress: bool | None = True) -> RoutingProfile:
    """Replay `sessions` through `model` (a runtime Model) and return their routing profile. `progress`: a bar
    over the turns on stderr (rate and time left); None: only when stderr is a terminal."""
    model_dir = Path(model_dir)
    cfg = model.config
    mtp = len(model.weights.mtp)  # the MTP blocks loaded with the model: their rows follow the layers'
    counter = RouteCounter(cfg.n_layers + mtp, cfg.n_routed_experts)
    tokens = TokenSource(model_dir, cfg.vocab_size, seed, text)
    total = sum(len(s.turns) for s in sessions)
    # progress: True / False, or None: only when stderr is a terminal (tqdm's rule)
    bar = tqdm(total=total, desc="recording routes", unit="turn", file=sys.stderr,
               disable=None if progress is None else not progress)
    threads = graph_threads(model.weights.layers, torch.get_num_threads())
    model.set_observer(counter)
    drafts = agreed = 0
    try:
        for index, shape in enumerate(sessions):
            bar.set_postfix_str(f"session {index + 1}/{len(sessions)}", refresh=False)
            session, nxt = model.new_session(), None
            follow = MtpFollower(model) if mtp else None
            prefill = session.prefill if follow is None else \
                (lambda ids, last_only: session.prefill(ids, last_only=last_only, on_chunk=follow.chunk))
            decode = session.decode if follow is None else (lambda token: follow.decode(session, token))
            for turn in shape.turns:
                with intra_op_threads(threads):
                    if turn.appended:
                        ids = tokens.take(turn.appended)
                        phase = "short_prefill" if turn.appended <= phase_boundary else "long_prefill"
                        logits = counter.run(phase, turn.appended, lambda: prefill(ids, last_only=True))
                        nxt = argmax(logits[-1])
                    for _ in range(turn.generated if nxt is not None else 0):
                        logits = counter.run("decode", 1, lambda: decode(nxt))
                        nxt = argmax(logits)
                bar.update(1)
            if follow is not None:
                drafts, agreed = drafts + follow.drafts, agreed + follow.agreed
    finally:
        model.set_observer(None)
        bar.close()
    fp = model_fingerprint(model_dir)
    return RoutingProfile(counts=counter.counts, top_k=cfg.num_experts_per_tok, phase_boundary=phase_boundary,
                          source=f"ostinato-record ({tokens.kind} tokens, seed {seed})",
                          model_fingerprint=fp.combined, sessions=tuple(s.name for s in sessions),
                          pass_tokens=torch.tensor(counter.pass_tokens, dtype=torch.int64),
                          pass_phase=torch.tensor(counter.pass_phase, dtype=torch.int64),
                          pass_touched=torch.stack(counter.pass_touched) if counter.pass_touched else None,
                          mtp_layers=mtp, mtp_drafts=drafts, mtp_agreed=agreed)
