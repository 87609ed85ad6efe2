"""Every Triton kernel launch of the runtime, on the device its tensors live on.

Triton launches on `torch.cuda.current_device()` and that device's current stream, whatever device
its pointer arguments are on. Nothing in the runtime sets the current device outside graph capture, so
without this helper a layer planned on GPU 1 would launch on GPU 0: "Pointer argument cannot be
accessed from Triton" without peer access, a silent cross-device race with it. `launch()` finds the
one device of the tensor arguments (refusing a launch whose tensors span devices) and enters it for
the launch; the device's current stream (a capture stream, a side stream) is kept.

tests/test_launch_device.py checks that no runtime module launches a kernel any other way, and runs
the 2-GPU plan mapped to the CPU with every launch recorded against the planned GPU of its tensors.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

# Replaced by tests that map a multi-GPU plan to the CPU (where every tensor says "cpu"): the device a
# tensor belongs to, and the context that makes a device current.
tensor_device = lambda t: t.device  # noqa: E731


def enter(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def launch_device(name: str, args) -> torch.device:
    """The one device of the tensor arguments; ValueError naming the kernel and arguments if they differ."""
    found: dict[torch.device, list[int]] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            found.setdefault(tensor_device(a), []).append(i)
    if len(found) != 1:
        where = ", ".join(f"arguments {idx} on {dev}" for dev, idx in found.items()) or "no tensor arguments"
        raise ValueError(f"Triton kernel {name}: its tensors must share one device, got {where}")
    return next(iter(found))


def launch(kernel, grid, *args, **meta):
    """kernel[grid](*args, **meta) with the tensors' device current."""
    name = getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))
    with enter(launch_device(name, args)):
        return kernel[grid](*args, **meta)
