"""The simulated system: the compile pipeline's cost model and plan for a model, a hardware spec and a
profile, and each policy built from them (so every policy sees the same hardware and sizes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ostinato.compiler.compile import Build, CompileOptions, compile_plan

from .ablation import ablations
from .kernels import KERNELS_FILE, KernelSpeeds, load_kernel_speeds
from .ktransformers import KTransformers, frequency_placed
from .llamacpp import CpuExperts, LayerPlacement, LruCache, layers_that_fit
from .ostinato_policy import Ostinato
from .policy import Policy

V4_FLASH = Path(__file__).resolve().parents[2] / "plans" / "models" / "deepseek-v4-flash"
KT_PREFILL_THRESHOLD = 1024   # --kt-gpu-prefill-token-threshold as set here (a user setting; see docs/baselines.md)


@dataclass(frozen=True)
class World:
    build: Build
    hot: np.ndarray          # [L, E] bool: the plan's hot set
    shares: np.ndarray       # [L, E] the profile's route shares (the plan's objective phases)
    gpu_layers: int          # llama.cpp layer placement: leading layers that fit whole
    kernels: KernelSpeeds | None = None  # each system's CPU expert kernel vs Ostinato's (None: all the same)

    def kernel(self, system: str):
        """`system`'s kernel slowdown against Ostinato's, or None where it was not measured (priced as ours)."""
        return self.kernels.of(system) if self.kernels is not None and system in self.kernels.ms else None

    def policies(self, kt_threshold: int = KT_PREFILL_THRESHOLD) -> list[Policy]:
        cost = self.build.cost
        # KTransformers' GPU experts fill the GPU memory Ostinato's hot set gets: the same count, N per layer
        kt_gpu = frequency_placed(self.shares, int(self.hot.sum()) // self.hot.shape[0])
        # llama.cpp --n-cpu-moe N: the same GPU memory as whole layers of experts (the last L - N layers)
        L, E = self.hot.shape
        n_cpu_moe = L - int(self.hot.sum()) // E
        kt, ggml = self.kernel("kt-kernel"), self.kernel("ggml")
        return [Ostinato(cost, self.hot, self.build.threshold, self.build.buckets),
                KTransformers(cost, kt_threshold, None, kt), KTransformers(cost, kt_threshold, kt_gpu, kt),
                LayerPlacement(cost, self.gpu_layers, ggml),
                CpuExperts(cost, ggml), CpuExperts(cost, ggml, n_cpu_moe), LruCache(cost, self.hot)]


    def ablations(self) -> list[Policy]:
        cost = self.build.cost
        return ablations(cost, self.hot, self.build.threshold, self.build.buckets, self.kernel("kt-kernel"))


def build_world(model: Path = V4_FLASH, hardware: str = "rtx4090d-x4", profile: str = "synthetic:1.0",
                context: int = 65536, build: Build | None = None, kernels: Path | None = KERNELS_FILE) -> World:
    """`kernels`: the side-by-side CPU kernel measurement (kernels.py); None: every system at Ostinato's speed."""
    b = build or compile_plan(CompileOptions(model=model, output=Path("unused.yaml"), hardware=hardware,
                                             profile=profile, context=context, build_kernels=False))
    hot = np.stack([l.hot for l in b.cost.layers])
    shares = np.stack([l.share for l in b.cost.layers])
    budgets = [b.hardware.gpus.usable_bytes - sum(f.values()) for f in b.gpu_fixed]
    fit = layers_that_fit([sum(l.values()) for l in b.layer_bytes], b.cost.expert_bytes, hot.shape[1], budgets)
    return World(b, hot, shares, fit, load_kernel_speeds(kernels) if kernels is not None else None)
