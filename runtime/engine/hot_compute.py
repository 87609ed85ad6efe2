"""Device-side expert compute over a pool of packed experts: the hot pool or an upload staging buffer.

Three backends compute the same function:
- `cpu`: what a plan runs on `--device cpu` by default, where the "GPU" is the host itself: the
  plan's CPU expert kernel over the pool's packed bytes, one call per forward (as the Triton kernels
  are one or two launches on a GPU), instead of torch's dequantize-and-matmul per expert;
- `triton`: the generated Triton kernels (MXFP4 dequantized in-kernel); the GPU path, and on a
  CPU-only machine the same kernels under TRITON_INTERPRET=1 (slow: tests use small inputs); its
  prefill takes pools of any width the kernels tile (`any_width`: a sharded upload's slices, I/G);
- `torch`: the reference on any device (`hot_backend="torch"`). It holds nothing but the packed
  pool: a call dequantizes only the experts it is about to use, one expert at a time and one matrix
  at a time (its gate|up rows [2I, D], then its down matrix [D, I]), each dropped as soon as its
  matmul is done; so besides the pool it holds one matrix of one expert in the compute dtype.
Routes are flat arrays: token [R], slot [R] (index into the pool), weight [R] float32.
Legend: R routes, K decode route slots, P pool slots, D hidden, I expert intermediate.
"""

from __future__ import annotations

import torch

from ostinato.checkpoint.reader import PackedExpert

from ..kernels.cold_task import run_on_host
from ..kernels.cpu_experts import CpuExpertKernel, ExpertTable
from ..kernels.mxfp4 import Mxfp4Table, dequantize
from ..kernels.routes import group_flat_routes
from ..kernels.triton_experts import HotPool, decode_experts, prefill_experts
from ..model.experts import swiglu


class TorchPoolCompute:
    name = "torch"
    any_width = True  # pools of slices I/G wide too (a sharded upload's staging): it reads the pool's shapes

    def __init__(self, limit: float):
        self.limit = limit
        self._tables: dict[tuple[torch.device, torch.dtype], Mxfp4Table] = {}

    def prepare(self, device: torch.device | str, dtype: torch.dtype) -> None:
        """Make the dequantization table for `device` and compute `dtype` (before any graph capture)."""
        self.table(torch.device(device), dtype)

    def table(self, device: torch.device, dtype: torch.dtype) -> Mxfp4Table:
        key = (device, dtype)
        if key not in self._tables:
            self._tables[key] = Mxfp4Table.make(device, dtype)
        return self._tables[key]

    def _expert(self, pool: HotPool, e: int | torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                table: Mxfp4Table) -> None:
        """y [n, D] = the expert at pool slot e (an int, or a [1] index tensor on the pool's device)
        applied to x [n, D], in the compute dtype; its matrices dequantized one at a time."""
        w13 = dequantize(torch.cat((pool.w1[e], pool.w3[e]), dim=-2),
                         torch.cat((pool.w1_scale[e], pool.w3_scale[e]), dim=-2), table)  # [2I, D]
        h = swiglu(x @ w13.T, self.limit)  # [n, I]
        del w13
        w2 = dequantize(pool.w2[e], pool.w2_scale[e], table)  # [D, I]
        torch.mm(h, w2.T, out=y)

    def prefill(self, pool: HotPool, x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor,
                weight: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, D] float32 += routes' weighted expert outputs; only the slots with routes are dequantized."""
        if token.numel() == 0:
            return
        table = self.table(x.device, x.dtype)
        order = slot.argsort(stable=True)
        token, slot, weight = token[order], slot[order], weight[order]
        counts = torch.bincount(slot, minlength=pool.w1.shape[0]).tolist()
        used = [(s, c) for s, c in enumerate(counts) if c]
        xs = x[token]  # [R, D] grouped by slot
        ys = torch.empty_like(xs)  # [R, D]
        sizes = [c for _, c in used]
        for (s, _), xe, ye in zip(used, xs.split(sizes), ys.split(sizes)):
            self._expert(pool, s, xe, ye, table)
        out.index_add_(0, token, ys.float() * weight[:, None])

    def decode(self, pool: HotPool, x: torch.Tensor, slot: torch.Tensor, token: torch.Tensor,
               weight: torch.Tensor, out: torch.Tensor) -> None:
        """Fixed shapes: slot/token/weight [K], slot -1 = padding (contributes nothing). All K route slots
        run, one expert at a time (padding as slot 0 with weight 0): the same ops and shapes whatever the
        routes are and no host reads, so the step stays capturable (on the CPU it runs eagerly)."""
        table = self.table(x.device, x.dtype)
        xs = x.index_select(0, token)  # [K, D]
        ys = torch.empty_like(xs)  # [K, D]
        for e, xe, ye in zip(slot.clamp(min=0).split(1), xs.split(1), ys.split(1)):  # K of each: fixed
            self._expert(pool, e, xe, ye, table)
        out.index_add_(0, token, ys.float() * (weight * (slot >= 0))[:, None])


class CpuPoolCompute:
    """Pools on the host, computed by the plan's CPU expert kernel (`n_threads` threads)."""

    name = "cpu"
    any_width = False  # the kernel is compiled for the plan's I: a sharded upload's slices need another backend

    def __init__(self, kernel: CpuExpertKernel, n_threads: int):
        self.kernel, self.n_threads = kernel, n_threads
        # id(pool) -> (table, slot map, the pool itself: held so that its id is never reused while cached)
        self._tables: dict[int, tuple[ExpertTable, torch.Tensor, HotPool]] = {}

    def prepare(self, device: torch.device | str, dtype: torch.dtype) -> None:
        if torch.device(device).type != "cpu":
            raise ValueError(f"the cpu hot backend computes pools in host memory, not on {device}")

    def pool_table(self, pool: HotPool) -> ExpertTable:
        """The pool's slots as a kernel table (row s: slot s)."""
        return self._table(pool)[0]

    def _table(self, pool: HotPool) -> tuple[ExpertTable, torch.Tensor]:
        """The pool's slots as a kernel table, and the map [P + 1] from slot + 1 to table index (slot -1,
        padding, maps to -1: no route). Made once per pool: its slots never move (staging pools are
        refilled in place)."""
        key = id(pool)
        if key not in self._tables:
            # A staging pool can have more slots (upload_group) than the model has experts, the kernel's
            # limit; an upload fills at most one slot per distinct expert, so the slots past it stay unused.
            n = min(pool.w1.shape[0], int(self.kernel.info["max_experts"]))
            table = self.kernel.table([PackedExpert(pool.w1[s], pool.w1_scale[s], pool.w3[s], pool.w3_scale[s],
                                                    pool.w2[s], pool.w2_scale[s]) for s in range(n)])
            self._tables[key] = (table, torch.arange(-1, n, dtype=torch.int64), pool)
        return self._tables[key][:2]

    def prefill(self, pool: HotPool, x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor,
                weight: torch.Tensor, out: torch.Tensor) -> None:
        if token.numel() == 0:
            return
        table, _ = self._table(pool)
        x = x if x.dtype in (torch.float32, torch.bfloat16) else x.float()
        self.kernel(x, group_flat_routes(token, slot, weight, table.n_experts), table, out, self.n_threads)

    def decode(self, pool: HotPool, x: torch.Tensor, slot: torch.Tensor, token: torch.Tensor,
               weight: torch.Tensor, out: torch.Tensor) -> None:
        """T tokens' K = T * k route slots (slot -1: padding; slot r belongs to token r // k, the order
        decode_step lays them out in): the kernel's decode task (the one a step's cold routes use) groups
        them itself, so this reads nothing on the host and issues two torch ops."""
        T = x.shape[0]
        if slot.numel() % T:
            raise ValueError(f"decode takes k route slots per token: {slot.numel()} slots for {T} tokens")
        table, slot_map = self._table(pool)
        x = (x if x.dtype in (torch.float32, torch.bfloat16) else x.float()).contiguous()
        ids = (slot + 1).reshape(T, -1)  # [T, k] into slot_map
        w = weight.to(torch.float32).contiguous()
        result = torch.empty_like(out)  # [T, D] float32, overwritten by the task
        run_on_host(self.kernel, x, ids, w, slot_map, table, result, self.n_threads, "hot expert task")
        out.add_(result)


class TritonPoolCompute:
    name = "triton"
    any_width = True  # prefill launches at the pool's width (a constexpr: compiled once per width, I and I/G)

    def __init__(self, prefill_module, decode_module):
        self.prefill_mod, self.decode_mod = prefill_module, decode_module

    def prepare(self, device: torch.device | str, dtype: torch.dtype) -> None:
        pass

    @staticmethod
    def _activations(x: torch.Tensor) -> torch.Tensor:
        """bf16/fp16 x stays so off the CPU: prefill then multiplies on tensor cores in its dtype, exactly
        (docs/model.md 2.2). Anything else becomes float32, bf16 on the CPU too: Triton's interpreter
        computes bf16 wrongly."""
        keep = x.dtype == torch.float32 or (x.device.type != "cpu" and x.dtype in (torch.bfloat16, torch.float16))
        return (x if keep else x.float()).contiguous()

    def prefill(self, pool: HotPool, x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor,
                weight: torch.Tensor, out: torch.Tensor) -> None:
        if token.numel() == 0:
            return
        routes = group_flat_routes(token, slot, weight, pool.w1.shape[0])
        prefill_experts(self.prefill_mod, self._activations(x), routes, pool, out)

    def decode(self, pool: HotPool, x: torch.Tensor, slot: torch.Tensor, token: torch.Tensor,
               weight: torch.Tensor, out: torch.Tensor) -> None:
        h = torch.empty(slot.numel(), self.decode_mod.I, dtype=torch.float32, device=x.device)  # [T * k, I]
        decode_experts(self.decode_mod, self._activations(x), slot.int(), token.int(), weight.float(), pool, out, h)
