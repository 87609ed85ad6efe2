"""Launch the generated Triton expert kernels (rendered from templates/triton/moe_experts.py.j2).

The runtime imports the rendered module from its build path; it needs neither jinja2 nor the
compiler. On a machine without a GPU, set TRITON_INTERPRET=1 before the module is loaded and pass
CPU tensors.
Legend: T = tokens, D = hidden, I = expert intermediate (W: a pool's, I or a slice's I/G), P = pool slots,
R = routes, B = route blocks.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from ostinato.checkpoint.reader import PackedExpert

from .launch import launch
from .routes import GroupedRoutes


def load_triton_module(path: str | Path) -> ModuleType:
    """Import a rendered kernel module from its file; the name is unique per file content."""
    path = Path(path)
    name = "ostinato_kernel_" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class HotPool:
    """P experts stacked for the expert kernels, every byte as stored, held as uint8: MXFP4 pairs
    (the checkpoint's int8; the kernels read them as unsigned bytes) and raw e8m0 scales."""

    w1: torch.Tensor  # [P, I, D/2] uint8
    w1_scale: torch.Tensor  # [P, I, D/32] uint8
    w3: torch.Tensor
    w3_scale: torch.Tensor
    w2: torch.Tensor  # [P, D, I/2] uint8
    w2_scale: torch.Tensor  # [P, D, I/32] uint8

    @classmethod
    def stack(cls, experts: list[PackedExpert], device: str | torch.device = "cpu") -> HotPool:
        def st(name):
            return torch.stack([getattr(e, name).view(torch.uint8) for e in experts]).to(device).contiguous()
        return cls(*(st(n) for n in ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")))


ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # prefill: 16-bit x runs tl.dot in its dtype


def _check(mod: ModuleType, variant: str, x: torch.Tensor, out: torch.Tensor) -> None:
    if mod.VARIANT != variant:
        raise ValueError(f"module is the {mod.VARIANT!r} variant, this launcher needs {variant!r}")
    if x.dim() != 2 or x.shape[1] != mod.D or not x.is_contiguous() or x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x: need contiguous [T, {mod.D}] float32/bf16/fp16, got {tuple(x.shape)} {x.dtype}")
    if out.shape != (x.shape[0], mod.D) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out: need contiguous [{x.shape[0]}, {mod.D}] float32, got {tuple(out.shape)} {out.dtype}")


def route_blocks(routes: GroupedRoutes, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split every expert's routes into blocks of block_m: (slot, start, end), each [B] int32."""
    slots, starts, ends = [], [], []
    off = routes.offsets.tolist()
    for e in range(routes.n_experts):
        for s in range(off[e], off[e + 1], block_m):
            slots.append(e), starts.append(s), ends.append(min(s + block_m, off[e + 1]))
    return tuple(torch.tensor(v, dtype=torch.int32) for v in (slots, starts, ends))


def prefill_h_dtype(mod: ModuleType, x_dtype: torch.dtype) -> torch.dtype:
    """The prefill intermediate h's dtype: x's when 16-bit, so the down kernel's dot runs on bf16/fp16 tensor
    cores as gate/up's does; float32 for float32 x (the plan's dot_precision), and for fp16 x when
    |h| < LIMIT^2 could pass fp16's max."""
    fits = x_dtype == torch.bfloat16 or (x_dtype == torch.float16 and mod.LIMIT ** 2 <= torch.finfo(x_dtype).max)
    return x_dtype if fits else torch.float32


def pool_width(mod: ModuleType, pool: HotPool) -> int:
    """The intermediate width of `pool`'s experts, I: the module's own, or a sharded upload's slice width
    I/G (prefill's kernels take it as a constexpr: one compiled specialization per width). Refused unless
    the six tensors agree on it and it is whole row blocks and contraction steps of the module."""
    P, W = pool.w1.shape[:2]
    want = {"w1": (P, W, mod.D // 2), "w1_scale": (P, W, mod.D // 32), "w3": (P, W, mod.D // 2),
            "w3_scale": (P, W, mod.D // 32), "w2": (P, mod.D, W // 2), "w2_scale": (P, mod.D, W // 32)}
    for name, shape in want.items():
        if tuple(getattr(pool, name).shape) != shape:
            raise ValueError(f"pool {name}: need {shape} for experts {W} wide at D={mod.D}, "
                             f"got {tuple(getattr(pool, name).shape)}")
    if W <= 0 or W % mod.BLOCK_N or W % mod.BLOCK_K:
        raise ValueError(f"pool width {W}: the prefill kernels need a positive multiple of BLOCK_N {mod.BLOCK_N} and "
                         f"BLOCK_K {mod.BLOCK_K} (the module's I is {mod.I})")
    return W


def prefill_experts(mod: ModuleType, x: torch.Tensor, routes: GroupedRoutes, pool: HotPool,
                    out: torch.Tensor) -> torch.Tensor:
    """out [T, D] float32 += sum over routes of weight * expert(x[token]); routes grouped by pool slot. The
    pool's experts may be slices of I/G rows (pool_width): then out gets each slice's part of the output."""
    _check(mod, "prefill", x, out)
    dev = x.device
    slot, start, end = (t.to(dev) for t in route_blocks(routes, mod.BLOCK_M))
    if slot.numel() == 0:
        return out
    W = pool_width(mod, pool)
    tok, wgt = routes.token.to(dev), routes.weight.to(dev)
    h = torch.empty(routes.token.numel(), W, dtype=prefill_h_dtype(mod, x.dtype), device=dev)  # [R, W]
    launch(mod.gate_up_kernel, (slot.numel(), W // mod.BLOCK_N), x, pool.w1, pool.w1_scale, pool.w3, pool.w3_scale,
           h, tok, slot, start, end, I=W)
    launch(mod.down_kernel, (slot.numel(), mod.D // mod.BLOCK_N), h, pool.w2, pool.w2_scale, out, tok, wgt, slot, start,
           end, I=W)
    return out


def decode_experts(mod: ModuleType, x: torch.Tensor, slot: torch.Tensor, token: torch.Tensor, weight: torch.Tensor,
                   pool: HotPool, out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Fixed-shape launch: slot/token/weight [n] (slot -1 = padding; n = T * k, MAX_ROUTES for one token),
    h [n, I] float32 scratch kept by the caller (a CUDA graph captures its address). One program per
    route slot and row block, so a T-token bucket reads each route's weights once (no grouping by
    expert: that needs host-known counts). out += the valid routes' results."""
    _check(mod, "decode", x, out)
    n = slot.numel()
    # h float32 whatever x is: the decode GEMV runs float32 on the CUDA cores (no tensor-core dtype to match)
    if (n % mod.MAX_ROUTES or slot.shape != (n,) or token.shape != (n,) or weight.shape != (n,)
            or h.shape != (n, mod.I) or h.dtype != torch.float32):
        raise ValueError(f"decode launch needs slot/token/weight [T * {mod.MAX_ROUTES}] and h [n, {mod.I}] float32, "
                         f"got slot {tuple(slot.shape)}, token {tuple(token.shape)}, h {tuple(h.shape)} {h.dtype}")
    launch(mod.gate_up_kernel, (n, mod.I // mod.BLOCK_N), x, pool.w1, pool.w1_scale, pool.w3, pool.w3_scale, h, slot,
           token)
    launch(mod.down_kernel, (n, mod.D // mod.BLOCK_N), h, pool.w2, pool.w2_scale, out, slot, token, weight)
    return out
