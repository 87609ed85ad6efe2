"""ostinato-compile: parse the command line into CompileOptions and run the passes."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tqdm import tqdm

from ostinato.buckets import CAPTURE_RUNS, bucket_rule_error
from ostinato.checkpoint import CheckpointError
from ostinato.cli.common import InputError, check_model_dir, check_output_file, refuse
from ostinato.hardware import HardwareError, available_presets
from ostinato.plan import PlanError
from ostinato.profile_format import ProfileError
from ostinato.workload import WorkloadError

from ..codegen.cxx import KernelCompileError
from ..compile import (
    ADAPT,
    CHAT_ENCODINGS,
    CPU_STEP,
    DEFAULT_CONTEXT,
    DEFAULT_WORKLOADS,
    PASSES,
    SPECULATIVE,
    Build,
    CompileError,
    CompileOptions,
    compile_plan,
)
from ..explain import explain
from ..passes.predictions import predictions_position


def _buckets(text: str) -> tuple[int, ...]:
    """--prefill-buckets: 'none' or comma-separated powers of two >= 2."""
    if text.strip().lower() == "none":
        return ()
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts or 'none', got {text!r}") from None
    # The rule is the plan schema's (ostinato/buckets.py); here only its shape, before --context is known:
    # a context of CAPTURE_RUNS x the largest bucket puts no bound on the sizes.
    error = bucket_rule_error(sorted(set(sizes)), CAPTURE_RUNS * max(sizes, default=0))
    if error:
        raise argparse.ArgumentTypeError(error)
    return sizes


def parse_args(argv: list[str] | None) -> tuple[CompileOptions, bool, bool | None]:
    p = argparse.ArgumentParser(
        prog="ostinato-compile",
        description="Plan where every expert of a DeepSeek-V4 checkpoint lives (hot on a GPU or cold on the host) "
                    "for a routing profile and a hardware spec, and write a fully resolved, fingerprinted plan.yaml. "
                    "Reads only config.json, the index and safetensors headers.")
    p.add_argument("model", type=Path, help="checkpoint directory (config.json + index suffice for planning)")
    p.add_argument("plan", type=Path, help="where to write plan.yaml")
    p.add_argument("--hardware", required=True,
                   help=f"hardware spec: a YAML file or a preset ({', '.join(available_presets())})")
    p.add_argument("--profile", help="routing profile (.safetensors from ostinato-record), or 'synthetic:ALPHA' "
                                     "for a documented Zipf profile; default: uniform routing (said in the plan)")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                   help=f"context tokens per session to reserve KV for ({DEFAULT_CONTEXT}: agent scale; the plan's "
                        "--explain says what it costs in hot experts)")
    p.add_argument("--sessions", type=int, default=1,
                   help="sessions whose KV cache stays resident: at most this many generate at once "
                        "(ostinato-serve --parallel) (1)")
    p.add_argument("--prefill-chunk", type=int, default=4096, help="largest prefill chunk in tokens (4096)")
    p.add_argument("--upload-group", type=int, default=16, help="experts per upload staging buffer (16)")
    p.add_argument("--snapshots", type=int, default=64,
                   help="turn-boundary snapshots a session keeps for truncation; each costs the sliding ring and "
                        "the compressors' open windows of every layer (64)")
    p.add_argument("--dense-format", choices=("fp8", "bf16", "float32"),
                   help="fp8: dense FP8 matrices kept as stored, computed in bf16; bf16 / float32: dequantized to "
                        "that compute dtype; activations and KV rows use the compute dtype (default: float32 on "
                        "cpu-only hardware, fp8 with GPUs)")
    p.add_argument("--prefill-buckets", type=_buckets, metavar="T,T,..|none",
                   help="token counts of the captured short-prefill steps, powers of two (e.g. 8,16,32,64), or "
                        "'none' (default: the cost model keeps those predicted faster than an eager forward)")
    p.add_argument("--max-hot-per-layer", type=int, help="cap on hot experts per layer (default: memory decides)")
    p.add_argument("--adapt", choices=ADAPT,
                   help="re-place hot experts between turns, while the agent's tool runs (policy.adapt): idle (the "
                        "default with GPUs) or off (the default on a cpu-only spec, whose hot pools are host memory)")
    p.add_argument("--cpu-step", choices=CPU_STEP, default="compiled",
                   help="the decode step's layers on the CPU (a cpu-only spec: all of them): compiled = one compiled "
                        "call per token (torch.compile's C++ wrapper, built at the first load and cached by "
                        "content), the CPU's analogue of a CUDA graph; eager = op by op (compiled)")
    p.add_argument("--chat-encoding", choices=CHAT_ENCODINGS, default="auto",
                   help="the release's chat encoder, which sets the reasoning-effort levels the server offers: "
                        "dsv4 (the original release: high, max), dsv4-0731 (DeepSeek-V4-Flash-0731: low, high, max); "
                        "auto: from the checkpoint's encoding/encoding_dsv4.py, else its config's 0731 keys, else "
                        "dsv4 (auto)")
    p.add_argument("--speculative", choices=SPECULATIVE, default="auto",
                   help="decode with the checkpoint's MTP block (speculative decoding): auto: where the cost model "
                        "says it pays, the block placed beside the head with its hot experts from the profile; "
                        "off: never (no memory for it); mtp: always (the checkpoint must have it) (auto)")
    p.add_argument("--workload", action="append", metavar="CSV|none",
                   help="a workload CSV (plans/workloads/README.md) the prefill threshold, the buckets and the "
                        "re-placement budget are priced on; repeat for several, each weighing the same; 'none': "
                        "the plan's context alone (default: the shipped "
                        f"{' and '.join(w.name for w in DEFAULT_WORKLOADS)})")
    p.add_argument("--no-kernels", action="store_true", help="skip rendering and building the expert kernels")
    p.add_argument("--kernel-dir", type=Path, help="content-addressed folder for generated kernels "
                                                   "(default: build/kernels in the working directory)")
    p.add_argument("--explain", action="store_true", help="print a readable table of the plan")
    p.add_argument("-v", "--verbose", action="store_true", help="log each compiler pass")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true",
                       help="a bar over the passes on stderr even when it is not a terminal (default: on a terminal)")
    shown.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    for name in ("context", "sessions", "prefill_chunk", "upload_group", "snapshots"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.max_hot_per_layer is not None and a.max_hot_per_layer < 0:
        p.error(f"--max-hot-per-layer must be >= 0, got {a.max_hot_per_layer}")
    workloads = DEFAULT_WORKLOADS
    if a.workload:
        if "none" in a.workload and len(a.workload) > 1:
            p.error("--workload none prices the choices on no workload: give it alone")
        workloads = () if a.workload == ["none"] else tuple(Path(w) for w in a.workload)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(name)s: %(message)s")
    return CompileOptions(model=a.model, output=a.plan, hardware=a.hardware, profile=a.profile, context=a.context,
                          sessions=a.sessions, prefill_chunk=a.prefill_chunk, upload_group=a.upload_group,
                          snapshots=a.snapshots, prefill_buckets=a.prefill_buckets,
                          dense_format=a.dense_format, max_hot_per_layer=a.max_hot_per_layer,
                          speculative=a.speculative, adapt=a.adapt, cpu_step=a.cpu_step,
                          chat_encoding=a.chat_encoding, workloads=workloads,
                          build_kernels=not a.no_kernels, kernel_dir=a.kernel_dir), a.explain, \
        True if a.progress else False if a.quiet else None


def run_passes(options: CompileOptions, progress: bool | None) -> Build:
    """compile_plan with a bar on stderr naming the pass that runs (the kernels' build is the long one);
    `progress` None: only when stderr is a terminal (tqdm's rule)."""
    with tqdm(total=len(PASSES), desc="ostinato-compile", unit="pass", file=sys.stderr,
              disable=None if progress is None else not progress) as bar:
        def on_pass(name: str) -> None:
            if bar.n or name != PASSES[0].__name__:  # the pass before this one has ended
                bar.update()
            bar.set_postfix_str(name)

        build = compile_plan(options, on_pass)
        bar.update()
    return build


def main(argv: list[str] | None = None) -> int:
    options, show, progress = parse_args(argv)
    try:
        check_model_dir(options.model)
        check_output_file(options.output, "plan")
        build = run_passes(options, progress)
    except (InputError, CompileError, CheckpointError, HardwareError, ProfileError, PlanError,
            KernelCompileError, WorkloadError) as e:
        return refuse("ostinato-compile", e)
    build.plan.write(options.output)
    for note in build.notes:
        print(f"note: {note}")
    if show:
        print(explain(build.plan, build.cost, predictions_position(build)))
    print(f"wrote {options.output} (sha256 {build.plan.sha256[:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
