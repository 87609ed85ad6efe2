"""Recording a routing profile: replay agent sessions through the model and count every route.

A session of the workload CSV is replayed turn by turn on one model session (its KV cache kept
across turns, as an agent engine would): prefill the turn's appended tokens, then decode its
generated tokens greedily. Every forward is one recorded pass: a decode step (phase "decode") or
a turn's prefill ("short_prefill" up to `phase_boundary` tokens, "long_prefill" above).

Token ids: real text through the model's tokenizer when the checkpoint has one (the package's
own corpus, or --text), cut into the turn's length from a seeded offset; else ids drawn from the
seed. Generated tokens come from the model itself.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.profile_format import PHASES, RoutingProfile, pack_touched
from ostinato.workload import SessionShape, TokenSource

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


def record_profile(model, model_dir: str | Path, sessions: list[SessionShape], phase_boundary: int = DEFAULT_BOUNDARY,
                   seed: int = 0, text: Path | None = None, progress: bool = True) -> RoutingProfile:
    """Replay `sessions` through `model` (a runtime Model) and return their routing profile."""
    model_dir = Path(model_dir)
    cfg = model.config
    counter = RouteCounter(cfg.n_layers, cfg.n_routed_experts)
    tokens = TokenSource(model_dir, cfg.vocab_size, seed, text)
    total = sum(len(s.turns) for s in sessions)
    bar = tqdm(total=total, desc="profiling", unit="turn", disable=not progress)
    model.set_observer(counter)
    try:
        for shape in sessions:
            session, nxt = model.new_session(), None
            for turn in shape.turns:
                if turn.appended:
                    ids = tokens.take(turn.appended)
                    phase = "short_prefill" if turn.appended <= phase_boundary else "long_prefill"
                    logits = counter.run(phase, turn.appended, lambda: session.prefill(ids, last_only=True))
                    nxt = int(logits[-1].argmax())
                for _ in range(turn.generated if nxt is not None else 0):
                    logits = counter.run("decode", 1, lambda: session.decode(nxt))
                    nxt = int(logits.argmax())
                bar.update(1)
    finally:
        model.set_observer(None)
        bar.close()
    fp = model_fingerprint(model_dir)
    return RoutingProfile(counts=counter.counts, top_k=cfg.num_experts_per_tok, phase_boundary=phase_boundary,
                          source=f"ostinato-record ({tokens.kind} tokens, seed {seed})",
                          model_fingerprint=fp.combined, sessions=tuple(s.name for s in sessions),
                          pass_tokens=torch.tensor(counter.pass_tokens, dtype=torch.int64),
                          pass_phase=torch.tensor(counter.pass_phase, dtype=torch.int64),
                          pass_touched=torch.stack(counter.pass_touched) if counter.pass_touched else None)
