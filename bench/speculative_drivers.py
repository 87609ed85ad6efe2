"""What bench/speculative_cpu.py measures, on the plain model or on a plan's engine: plain greedy decoding,
speculative decoding with given drafts, and timed single parts of a speculative step."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def plain_greedy(session, prompt: list[int], n: int) -> tuple[list[int], float]:
    """n greedy tokens after `prompt` on a model or engine session -> (tokens, seconds of the decode steps)."""
    out = [int(session.prefill(prompt, last_only=True)[-1].argmax())]
    t0 = time.perf_counter()
    while len(out) < n:
        out.append(int(session.decode(out[-1]).argmax()))
    return out, time.perf_counter() - t0


class ModelDriver:
    """The plain float32 model (load_model, dense experts) and runtime/model/speculative.py."""

    def __init__(self, model_dir: Path):
        from ostinato.runtime import load_model

        self.name = model_dir.name
        self.model = load_model(model_dir, dtype=torch.float32, mtp=True)
        self.vocab = self.model.config.vocab_size

    def describe(self) -> str:
        return f"model {self.name} (plain model)"

    def plain(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        return plain_greedy(self.model.new_session(), prompt, n)

    def speculative(self, prompt: list[int], n: int, draft) -> tuple[list[int], float, float]:
        """-> (tokens, seconds, acceptance); draft(index in the reply) -> token."""
        from ostinato.runtime.model.speculative import SpeculativeDecoder

        at = len(prompt)
        spec = SpeculativeDecoder(self.model.new_session(), draft=lambda position, logits: draft(position - at))
        out = spec.start(spec.prefill(prompt)[-1])
        t0 = time.perf_counter()
        while len(out) < n:
            out += spec.step()
        return out[:n], time.perf_counter() - t0, spec.accepted / max(1, spec.drafted)

    def parts(self, prompt: list[int], reps: int) -> dict[str, list[float]]:
        """Seconds of `reps` decode steps, two-token verify steps and MTP drafts after the prompt, alternating."""
        from ostinato.runtime.model.mtp import mtp_logits

        model = self.model
        s = model.new_session()
        s.prefill(prompt)
        mark, times = s.mark(), {"decode": [], "verify": [], "draft": []}
        mtp_cache = model.new_mtp_cache()
        streams = model.forward(torch.tensor(prompt[-2:]), model.new_cache(), with_streams=True)[1][:1]
        for _ in range(reps):
            for name, fn in (("decode", lambda: s.extend([prompt[0]])), ("verify", lambda: s.extend(prompt[:2]))):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                s.back_to(mark)
            m = mtp_cache.snapshot()
            t0 = time.perf_counter()
            mtp_logits(model, streams, torch.tensor(prompt[-1:]), len(prompt) - 1, mtp_cache)
            times["draft"].append(time.perf_counter() - t0)
            mtp_cache.restore(m)
        return times

    def prediction(self) -> str:
        return "(the plain model: no plan, no prediction)"

    def close(self) -> None:
        pass


class EngineDriver:
    """A plan's engines, one plain (--speculative off) and one speculative (mtp), on the CPU."""

    def __init__(self, plan: Path):
        from ostinato.runtime.engine.loader import load_engine

        self.plan_path = plan
        self.plain_engine = load_engine(plan, device="cpu", speculative="off")
        self.engine = load_engine(plan, device="cpu", speculative="mtp")
        self.vocab = self.engine.model.config.vocab_size

    def describe(self) -> str:
        steps = "fixed-shape steps" if self.engine.step_runner else "dynamic model"
        return f"plan {self.plan_path} (the engine, {steps})"

    def plain(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        return plain_greedy(self.plain_engine.new_session(), prompt, n)

    def speculative(self, prompt: list[int], n: int, draft) -> tuple[list[int], float, float]:
        es = self.engine.new_session()
        out = [int(es.prefill(prompt, last_only=True)[-1].argmax())]
        t0 = time.perf_counter()
        while len(out) < n:
            d_logits = es.draft(out[-1]) if len(out) + 1 < n else None
            if d_logits is None:
                out.append(int(es.decode(out[-1]).argmax()))
                continue
            d = draft(len(out))
            logits = es.verify(out[-1], d)
            if int(logits[0].argmax()) == d:
                out += [d, int(logits[1].argmax())]
            else:
                out.append(int(es.reject().argmax()))
        return out[:n], time.perf_counter() - t0, es.accepted / max(1, es.drafted)

    def parts(self, prompt: list[int], reps: int) -> dict[str, list[float]]:
        """Seconds of single drafts, verify steps (then rejected) and the decode step the rejection runs."""
        es = self.engine.new_session()
        tok = int(es.prefill(prompt, last_only=True)[-1].argmax())
        times = {"decode": [], "verify": [], "draft": []}
        for _ in range(reps):
            t0 = time.perf_counter()
            d = int(es.draft(tok).argmax())
            times["draft"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            es.verify(tok, d)
            times["verify"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tok = int(es.reject().argmax())  # the state goes back, then tok's own decode step
            times["decode"].append(time.perf_counter() - t0)
        return times

    def prediction(self) -> str:
        s, hw = self.engine.plan.predictions.speculative, self.engine.plan.hardware.name
        return f"the plan's prediction for {hw}: {s.gain}x at {s.acceptance:.0%} ({s.reason})"

    def close(self) -> None:
        self.plain_engine.close()
        self.engine.close()
