"""The simulated system: the compile pipeline's cost model and plan for a model, a hardware spec and a
profile, and each policy built from them (so every policy sees the same hardware and sizes).

Every system's CPU expert kernel, Ostinato's included, is priced by its measured per-core rates scaled to
the host by one rule (compiler/host_kernel.py) when a kernel table is given; without one, every system
gets the cost model's own kernel (equal kernels).

Baselines come twice: as their DeepSeek-V4 documentation runs them ("documented") and with every
documented knob set well ("best"); docs/baselines.md says which knobs. "best" also lists KTransformers with a
prefix cache its DeepSeek-V4 recipe does not have, named hypothetical (ktransformers.py WITH_PREFIX_CACHE).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ostinato.compiler.compile import DEFAULT_CONTEXT, Build, CompileOptions, compile_plan
from ostinato.compiler.cost_model import CostModel

from .ablation import ablations
from .kernels import KERNEL_TABLES, OURS, KernelTable, kernels_for
from .ktransformers import (
    BEST_DOCUMENTED,
    DOCUMENTED,
    DOCUMENTED_THRESHOLD,
    WITH_PREFIX_CACHE,
    KTransformers,
    best_threshold,
    frequency_placed,
    uniform_placed,
)
from .llamacpp import CpuExperts, LayerPlacement, LruCache, layers_that_fit
from .ostinato_policy import MTP_ACCEPTANCE, MTP_NAME, Ostinato
from .policy import Policy

V4_FLASH = Path(__file__).resolve().parents[2] / "plans" / "models" / "deepseek-v4-flash"
# The synthetic profile's Zipf exponent: 0.9 puts 37.0 / 47.7 / 59.3 / 71.9% of a layer's routes on its best
# 8 / 16 / 32 / 64 experts, against 35.6 / 46.5 / 58.5 / 71.2% published for V4-Flash (plans/published/
# routing-*.yaml); the least-squares exponent over those four points, a shape of routing, not of a speed.
PROFILE = "synthetic:0.9"
CONFIGS = ("best", "documented")


@dataclass(frozen=True)
class World:
    build: Build
    hot: np.ndarray          # [L, E] bool: the plan's hot set
    shares: np.ndarray       # [L, E] the profile's route shares (the plan's objective phases)
    gpu_layers: int          # llama.cpp layer placement: leading layers that fit whole
    kernels: KernelTable | None = None  # each system's measured CPU kernel rates (None: all the cost model's own)

    def kernel(self, system: str):
        """`system`'s measured KernelRates; Ostinato's where it was not measured; None without a table."""
        if self.kernels is None:
            return None
        return self.kernels.systems.get(system, self.kernels.of(OURS))

    @cached_property
    def cost(self) -> CostModel:
        """The plan's cost model, its CPU kernel priced like every other system's (kernel())."""
        ours = self.kernel(OURS)
        return self.build.cost.with_host_kernel(ours) if ours is not None else self.build.cost

    @cached_property
    def kt_at_best(self) -> tuple[np.ndarray, int]:
        """KTransformers at its best: frequency-placed GPU experts in the GPU memory Ostinato's hot set
        gets (the same N per layer), and the prefill threshold where its layerwise prefill starts to win."""
        gpu = frequency_placed(self.shares, int(self.hot.sum()) // self.hot.shape[0])
        return gpu, best_threshold(self.cost, gpu, self.kernel("kt-kernel"))

    @cached_property
    def alike(self) -> tuple[Policy, Policy, Policy, Policy]:
        """The systems both configurations run the same way: Ostinato, Ostinato + MTP, llama.cpp's layer placement and
        its LRU cache, built once for both, so that a replay of both configurations (simulate_groups: a policy in two
        groups runs once) prices each of them once. A replay resets them at each session (Policy.reset)."""
        cost, ggml = self.cost, self.kernel("ggml")
        ours = Ostinato(cost, self.hot, self.build.threshold, self.build.buckets,
                        shard_threshold=self.build.shard_threshold)
        mtp = Ostinato(cost, self.hot, self.build.threshold, self.build.buckets, name=MTP_NAME,
                       mtp_acceptance=MTP_ACCEPTANCE, shard_threshold=self.build.shard_threshold)
        return ours, mtp, LayerPlacement(cost, self.gpu_layers, ggml), LruCache(cost, self.hot, kernel=ggml)

    @cached_property
    def kt_frequency(self) -> KTransformers:
        """KTransformers at its best without a prefix cache (BEST_DOCUMENTED), built once: the "best" configuration
        and the re-placement study (replacement.py, the same system) share it, so a replay of both prices it once."""
        kt_gpu, kt_threshold = self.kt_at_best
        return KTransformers(self.cost, kt_threshold, kt_gpu, self.kernel("kt-kernel"), name=BEST_DOCUMENTED)

    def policies(self, config: str = "best") -> list[Policy]:
        """Ostinato first, Ostinato with MTP speculative decoding (MTP_ACCEPTANCE) beside it, then the baselines
        `config`ured as documented or at their best."""
        if config not in CONFIGS:
            raise ValueError(f"config {config!r}: one of {CONFIGS}")
        cost, (L, E) = self.cost, self.hot.shape
        # GPU experts fill the GPU memory Ostinato's hot set gets: the same count, N per layer
        per_layer = int(self.hot.sum()) // L
        kt, ggml = self.kernel("kt-kernel"), self.kernel("ggml")
        ours, mtp, layers, lru = self.alike
        if config == "documented":
            return [ours, mtp,
                    KTransformers(cost, DOCUMENTED_THRESHOLD, uniform_placed((L, E), per_layer), kt,
                                  reuses_prefix=False, name=DOCUMENTED),
                    layers, CpuExperts(cost, ggml), lru]
        kt_gpu, kt_threshold = self.kt_at_best
        # llama.cpp --n-cpu-moe N: the same GPU memory as whole layers of experts (the last L - N layers)
        n_cpu_moe = L - int(self.hot.sum()) // E
        return [ours, mtp, self.kt_frequency,
                KTransformers(cost, kt_threshold, kt_gpu, kt, reuses_prefix=True, name=WITH_PREFIX_CACHE),
                layers, CpuExperts(cost, ggml, n_cpu_moe), lru]

    def ablations(self) -> list[Policy]:
        return ablations(self.cost, self.hot, self.build.threshold, self.build.buckets, self.kernel("kt-kernel"),
                         self.build.shard_threshold)


def build_world(model: Path = V4_FLASH, hardware: str = "rtx4090d-x4", profile: str = PROFILE,
                context: int = DEFAULT_CONTEXT, build: Build | None = None,
                kernels: Path | None = KERNEL_TABLES) -> World:
    """`kernels`: the side-by-side CPU kernel tables, one per ISA (a folder), or one table (a file): the box is
    priced with its host ISA's (kernels.py kernels_for); None: every system at the cost model's kernel."""
    b = build or compile_plan(CompileOptions(model=model, output=Path("unused.yaml"), hardware=hardware,
                                             profile=profile, context=context, build_kernels=False))
    hot = np.stack([l.hot for l in b.cost.layers])
    shares = np.stack([l.share for l in b.cost.layers])
    budgets = [b.hardware.gpus.usable_bytes - sum(f.values()) for f in b.gpu_fixed]
    fit = layers_that_fit([sum(l.values()) for l in b.layer_bytes], b.cost.expert_bytes, hot.shape[1], budgets)
    return World(b, hot, shares, fit,
                 kernels_for(kernels, b.hardware.host.isa) if kernels is not None else None)
