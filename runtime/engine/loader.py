"""Load a plan and run its model as planned: checks, weight placement, kernels, the executor.

    engine = load_engine("plan.yaml", device="cpu")
    session = engine.new_session()       # prefill picks split-route or upload-once by the plan's threshold

The plan is checked against the checkpoint first (fingerprints; a mismatch names the field). Each
layer's hot experts go to its planned device, packed (and dequantized for the torch backend); its
cold experts stay in host memory (pinned when a GPU is used) behind the generated CPU kernel.
With device="cpu" every planned GPU maps to the CPU, which is how tests and CI run all of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint.fingerprint import model_fingerprint
from ..checkpoint.reader import Checkpoint, PackedExpert
from ..kernels.cpu_experts import CpuExpertKernel
from ..kernels.host_isa import detect_isa, supports
from ..kernels.triton_experts import HotPool, load_triton_module
from ..model.model import Model, load_model
from ..plan import Plan, PlanError, check_fingerprint, load_plan
from .decode_runner import DecodeRunner
from .executor import LayerExperts, PlacementExecutor
from .hot_compute import DensePool, TorchPoolCompute, TritonPoolCompute
from .session import EngineSession


@dataclass
class Engine:
    plan: Plan
    model: Model
    executor: PlacementExecutor
    devices: list
    decode_runner: DecodeRunner | None  # the fixed-shape decode step; None: dynamic decode

    def new_session(self) -> EngineSession:
        return EngineSession(self.model.new_session(), self.executor, self.plan.policy.prefill_threshold,
                             self.decode_runner)

    def close(self) -> None:
        self.executor.close()


def plan_devices(plan: Plan, device: str | None) -> list[torch.device]:
    """The torch device of each planned GPU: all the CPU with device='cpu' (or without CUDA)."""
    n = plan.hardware["gpus"]["count"]
    if device == "cpu" or plan.hardware.get("cpu_only") or not torch.cuda.is_available():
        return [torch.device("cpu")] * n
    if torch.cuda.device_count() < n:
        raise PlanError(f"the plan needs {n} GPUs (hardware.gpus.count), this machine has {torch.cuda.device_count()}")
    return [torch.device("cuda", g) for g in range(n)]


def resolve_artifact(plan_path: Path | None, path: str) -> Path:
    """A kernel path of the plan: relative to the directory compile ran in (usually the current one),
    else to the plan file's directory."""
    for base in (Path.cwd(), plan_path.parent if plan_path else None):
        if base is not None and (base / path).exists():
            return base / path
    raise PlanError(f"kernel artifact {path} not found (looked in {Path.cwd()}"
                    f"{' and ' + str(plan_path.parent) if plan_path else ''}): run ostinato-compile again")


def _kernel_entry(plan: Plan, name: str) -> dict:
    for k in plan.kernels:
        if k["name"] == name:
            return k
    raise PlanError(f"field 'kernels' has no '{name}' entry: compile the plan with kernels (without --no-kernels)")


def _kernel(plan: Plan, name: str, plan_path: Path | None) -> Path:
    return resolve_artifact(plan_path, _kernel_entry(plan, name)["path"])


def _cpu_kernel_for_this_host(plan: Plan, plan_path: Path | None) -> Path:
    """The plan's CPU kernel library, after checking this CPU can run its ISA (else SIGILL on load)."""
    entry = _kernel_entry(plan, "cold_experts_cpu")
    path, isa = resolve_artifact(plan_path, entry["path"]), entry["params"]["isa"]
    if not supports(isa):
        raise PlanError(f"the plan's CPU kernel {path} was built for {isa} (its hardware spec's host.isa), but this "
                        f"CPU supports at most {detect_isa()}: compile the plan with a hardware spec whose host.isa "
                        f"this machine has")
    return path


def _packed(ckpt: Checkpoint, layer: int, experts: list[int], pin: bool) -> list[PackedExpert]:
    out = []
    for e in experts:
        p = ckpt.expert_packed(layer, e)
        tensors = [t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t for t in (
            p.w1, p.w1_scale, p.w3, p.w3_scale, p.w2, p.w2_scale)]
        out.append(PackedExpert(*((t.pin_memory() if pin else t.contiguous()) for t in tensors)))
    return out


def _staging(n: int, D: int, I: int, device: torch.device) -> HotPool:
    def z(rows, cols, dtype):
        return torch.zeros(n, rows, cols, dtype=dtype, device=device)
    return HotPool(z(I, D // 2, torch.int8), z(I, D // 32, torch.uint8), z(I, D // 2, torch.int8),
                   z(I, D // 32, torch.uint8), z(D, I // 2, torch.int8), z(D, I // 32, torch.uint8))


def load_engine(plan: str | Path | Plan, model_dir: str | Path | None = None, device: str | None = None,
                dtype: torch.dtype = torch.float32, hot_backend: str | None = None, static_decode: bool = True,
                decode_graphs: bool = True) -> Engine:
    """The plan's engine. `static_decode`: decode through the fixed-shape step sized for the plan's
    context (else the dynamic model); `decode_graphs`: capture that step as CUDA graphs on GPUs."""
    plan_path = None
    if not isinstance(plan, Plan):
        plan_path = Path(plan)
        plan = load_plan(plan_path)
    model_dir = Path(model_dir or plan.model.path)
    fp = model_fingerprint(model_dir)
    check_fingerprint(plan, fp.config_sha256, fp.index_sha256)
    devices = plan_devices(plan, device)
    cuda = devices[0].type == "cuda"
    backend = hot_backend or ("triton" if cuda else "torch")
    if backend not in ("triton", "torch"):
        raise ValueError(f"hot_backend must be 'triton' or 'torch', got {backend!r}")
    if backend == "triton" and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise PlanError("the triton hot backend on the CPU needs TRITON_INTERPRET=1 (or use the torch backend)")
    cpu_kernel = CpuExpertKernel(_cpu_kernel_for_this_host(plan, plan_path))
    layers = []
    with Checkpoint.open(model_dir) as ckpt:
        cfg = ckpt.config
        if backend == "triton":
            compute = TritonPoolCompute(load_triton_module(_kernel(plan, "hot_experts_prefill", plan_path)),
                                        load_triton_module(_kernel(plan, "hot_experts_decode", plan_path)))
        else:
            compute = TorchPoolCompute(cfg.swiglu_limit)
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        for lp in plan.layers:
            dev = devices[lp.gpu]
            hot = list(lp.hot_experts)
            cold = sorted(set(range(E)) - set(hot))
            slot_of = torch.full((E,), -1, dtype=torch.int64)
            slot_of[hot] = torch.arange(len(hot))
            cold_of = torch.full((E,), -1, dtype=torch.int64)
            cold_of[cold] = torch.arange(len(cold))
            pool = HotPool.stack(_packed(ckpt, lp.layer, hot, False), dev) if hot else _staging(0, D, I, dev)
            dense = DensePool.from_packed(pool, len(hot), dtype) if backend == "torch" else None
            cold_packed = _packed(ckpt, lp.layer, cold, pin=cuda)
            layers.append(LayerExperts(dev, slot_of.to(dev), cold_of, pool, dense, cold_packed,
                                       cpu_kernel.table(cold_packed) if cold else None,
                                       [_staging(plan.policy.upload_group, D, I, dev) for _ in range(2)]))
    executor = PlacementExecutor(layers, compute, cpu_kernel, plan.policy.cpu_threads, plan.policy.upload_group,
                                 plan.model.expert_bytes, dtype, cfg.num_experts_per_tok)
    model = load_model(model_dir, dtype=dtype, device=devices[0], executor=executor,
                       prefill_chunk=plan.policy.prefill_chunk, layer_devices=[devices[lp.gpu] for lp in plan.layers])
    runner = DecodeRunner(model, executor, plan.policy.context, decode_graphs) if static_decode else None
    return Engine(plan, model, executor, devices, runner)

