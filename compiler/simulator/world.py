"""The simulated system: the compile pipeline's cost model and plan for a model, a hardware spec and a
profile, and each policy built from them (so every policy sees the same hardware and sizes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compile import Build, CompileOptions, compile_plan
from .ablation import ablations
from .ktransformers import KTransformers, frequency_placed
from .llamacpp import CpuExperts, LayerPlacement, LruCache, layers_that_fit
from .ostinato_policy import Ostinato
from .policy import Policy

V4_FLASH = Path(__file__).resolve().parents[2] / "plans" / "models" / "deepseek-v4-flash"
KT_PREFILL_THRESHOLD = 1024   # --kt-gpu-prefill-token-threshold as set here (a user setting; see README)


@dataclass(frozen=True)
class World:
    build: Build
    hot: np.ndarray          # [L, E] bool: the plan's hot set
    shares: np.ndarray       # [L, E] the profile's route shares (the plan's objective phases)
    gpu_layers: int          # llama.cpp layer placement: leading layers that fit whole

    def policies(self, kt_threshold: int = KT_PREFILL_THRESHOLD) -> list[Policy]:
        cost = self.build.cost
        # KTransformers' GPU experts fill the GPU memory Ostinato's hot set gets: the same count, N per layer
        kt_gpu = frequency_placed(self.shares, int(self.hot.sum()) // self.hot.shape[0])
        return [Ostinato(cost, self.hot, self.build.threshold, cost.buckets), KTransformers(cost, kt_threshold),
                KTransformers(cost, kt_threshold, kt_gpu), LayerPlacement(cost, self.gpu_layers),
                CpuExperts(cost), LruCache(cost, self.hot)]


    def ablations(self) -> list[Policy]:
        cost = self.build.cost
        return ablations(cost, self.hot, self.build.threshold, cost.buckets)


def build_world(model: Path = V4_FLASH, hardware: str = "rtx4090d-x4", profile: str = "synthetic:1.0",
                context: int = 65536, build: Build | None = None) -> World:
    b = build or compile_plan(CompileOptions(model=model, output=Path("unused.yaml"), hardware=hardware,
                                             profile=profile, context=context, build_kernels=False))
    hot = np.stack([l.hot for l in b.cost.layers])
    shares = np.stack([l.share for l in b.cost.layers])
    budgets = [b.hardware.gpus.usable_bytes - sum(f.values()) for f in b.gpu_fixed]
    fit = layers_that_fit([sum(l.values()) for l in b.layer_bytes], b.cost.expert_bytes, hot.shape[1], budgets)
    return World(b, hot, shares, fit)
