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
    # plain decoding: these placements are the main model's (test_engine_speculative.py places the MTP block)
    policy = plan.policy.replace(prefill_threshold=threshold, upload_group=3, speculative="off")
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
    mtp = plan.mtp and plan.mtp.replace(gpu=layers[-1].gpu)  # the MTP block goes with the head
    return plan.replace(hardware=hardware, layers=layers, memory=memory, mtp=mtp)


def pipeline_engine(compiled, tiny_ckpt, placement: str, gpus: int, threshold=None, hot_backend=None):
    plan, _ = compiled
    return load_engine(on_gpus(_variant(plan, placement, threshold), gpus), tiny_ckpt, device="cpu",
                       hot_backend=hot_backend)


def caches_equal(a, b) -> None:
    """Two KvCaches hold the same tensors, bit for bit: windows, rows, compressor and indexer states."""
    assert a.position == b.position
    for i, (x, y) in enumerate(zip(a.layers, b.layers)):
        assert torch.equal(x.window, y.window), f"layer {i}: window"
        for name in ("rows", "index_rows"):
            rx, ry = getattr(x, name), getattr(y, name)
            assert (rx is None) == (ry is None) and (rx is None or torch.equal(rx.view(), ry.view())), (i, name)
        for name in ("comp", "index_comp"):
            cx, cy = getattr(x, name), getattr(y, name)
            assert (cx is None) == (cy is None), (i, name)
            for fx, fy in zip(*(() if c is None else vars(c).values() for c in (cx, cy))):
                assert (fx is None) == (fy is None) and (not isinstance(fx, torch.Tensor) or torch.equal(fx, fy)), \
                    (i, name)
