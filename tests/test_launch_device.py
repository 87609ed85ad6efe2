"""Every Triton launch runs on the device its tensors live on (runtime/kernels/launch.py).

Triton launches on the current CUDA device, which nothing else in the runtime sets: a layer planned
on GPU 1 would launch on GPU 0. Checked on the CPU three ways: no module launches a kernel except
through `launch()`; `launch()` enters the one device of its tensors and refuses tensors on two; and
(tests/test_engine.py, beside its run of the Triton hot backend under the interpreter, which it
shares) the 2-GPU plan mapped to the CPU launches every kernel through `launch()` with the tensors of
one planned GPU only, on both GPUs.
"""

import ast
from pathlib import Path

import pytest
import torch

from ostinato.runtime.kernels import launch as launch_module

ROOT = Path(__file__).resolve().parents[1]


def direct_launches(path: Path) -> list[int]:
    """Lines of `..._kernel[grid](...)` calls in a Python file (every Triton kernel's name ends so)."""
    def name(node) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
            and name(n.func.value).endswith("kernel")]


def test_no_kernel_is_launched_around_the_helper():
    files = [p for folder in ("runtime", "bench") for p in (ROOT / folder).rglob("*.py")]
    found = {str(p.relative_to(ROOT)): lines for p in files if p.name != "launch.py" and (lines := direct_launches(p))}
    assert not found, f"Triton launches outside runtime/kernels/launch.py: {found}"


class Kernel:
    """A stand-in Triton kernel: records the device current at its launch."""

    def __init__(self, current: list):
        self.current, self.launched = current, []

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launched.append((grid, self.current[-1]))


@pytest.fixture
def fake_gpus(monkeypatch):
    """Tensors report the device in their `gpu` attribute; entering a device makes it current."""
    current = [torch.device("cuda", 0)]

    class Enter:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            current.append(self.device)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(launch_module, "tensor_device", lambda t: getattr(t, "gpu", t.device))
    monkeypatch.setattr(launch_module, "enter", Enter)
    return current


def on(gpu: int) -> torch.Tensor:
    t = torch.zeros(2)
    t.gpu = torch.device("cuda", gpu)
    return t


def test_a_launch_enters_its_tensors_device(fake_gpus):
    kernel = Kernel(fake_gpus)
    launch_module.launch(kernel, (4,), on(1), on(1), 7, BLOCK=16)
    assert kernel.launched == [((4,), torch.device("cuda", 1))] and fake_gpus == [torch.device("cuda", 0)]
    with pytest.raises(ValueError, match=r"its tensors must share one device, got arguments \[0\] on cuda:0, "
                                         r"arguments \[1\] on cuda:1"):
        launch_module.launch(kernel, (4,), on(0), on(1))
    with pytest.raises(ValueError, match="no tensor arguments"):
        launch_module.launch(kernel, (4,), 3)
