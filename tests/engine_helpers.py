"""Helpers of the engine tests (test_engine*.py, test_streams.py, test_cpu_threads.py): placements of the
shared `compiled` plan (tests/conftest.py), engines loaded from them, and the closeness check."""

import random

import torch

from ostinato.runtime.engine.loader import load_engine

TOL = 1e-4  # relative to the logits' scale, float32

IDS = torch.randint(0, 1024, (150,), generator=torch.Generator().manual_seed(7))


def _variant(plan, placement: str, threshold, seed=0):
    E = plan.model.routed_experts
    rng = random.Random(seed)
    layers = []
    for lp in plan.layers:
        hot = {"all-hot": list(range(E)), "all-cold": [], "mixed": lp.hot_experts,
               "random": sorted(rng.sample(range(E), rng.randint(1, E - 1)))}[placement]
        layers.append(lp.replace(hot_experts=hot))
    policy = plan.policy.replace(prefill_threshold=threshold, upload_group=3)
    return plan.replace(layers=layers, policy=policy)


def _engine(compiled, tiny_ckpt, placement, threshold=None, **kw):
    plan, work = compiled
    return load_engine(_variant(plan, placement, threshold), tiny_ckpt, device="cpu", **kw)


def _close(a, b):
    scale = b.abs().max()
    assert (a - b).abs().max() <= TOL * scale, f"max diff {(a - b).abs().max()} at scale {scale}"


def on_gpus(plan, gpus: int):
    """The plan with its layers split in order over `gpus` planned GPUs (all the CPU here)."""
    if gpus == 1:
        return plan
    hardware = plan.hardware.replace(gpus=plan.hardware.gpus.replace(count=gpus))
    per = -(-len(plan.layers) // gpus)
    layers = [lp.replace(gpu=i // per) for i, lp in enumerate(plan.layers)]
    memory = [plan.memory[0].replace(device=f"gpu{g}") for g in range(gpus)] + [plan.memory[-1]]
    return plan.replace(hardware=hardware, layers=layers, memory=memory)


def pipeline_engine(compiled, tiny_ckpt, placement: str, gpus: int, threshold=None, hot_backend=None):
    plan, _ = compiled
    return load_engine(on_gpus(_variant(plan, placement, threshold), gpus), tiny_ckpt, device="cpu",
                       hot_backend=hot_backend)
