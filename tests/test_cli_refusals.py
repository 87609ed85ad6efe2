"""Bad input to any command is refused in one line naming the file, field or value, with exit code 1
(usage errors: 2); plans run from any working directory; an all-cold plan is a plan."""

import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import compile_tiny_plan

from ostinato.cli import inspect as inspect_cli
from ostinato.compiler.cli import compile as compile_cli
from ostinato.compiler.cli import profile as profile_cli
from ostinato.plans import plans_dir
from ostinato.runtime.cli import record as record_cli
from ostinato.runtime.cli import run as run_cli


@pytest.fixture(scope="module")
def compiled(tiny_ckpt, tmp_path_factory, kernel_dir):
    work = tmp_path_factory.mktemp("refusals")
    compile_tiny_plan(tiny_ckpt, work, kernel_dir, context=1024, max_hot_per_layer=4)
    return work / "plan.yaml"


def _edited_plan(plan_file, tmp_path, edit):
    data = yaml.safe_load(plan_file.read_text())
    edit(data)
    out = plan_file.parent / f"edited-{tmp_path.name}.yaml"  # beside the original: its relative paths hold
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _spec_with(tmp_path, edit):
    data = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    edit(data)
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "hw.yaml")


def _a_file(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    return str(tmp_path / "afile")


def _without_mtp(tmp_path):
    from ostinato.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path / "nomtp", "tiny", seed=0, progress=False, mtp=False)


def _run_plan(edit):
    return lambda ckpt, plan, tmp: (run_cli.main, [str(_edited_plan(plan, tmp, edit)), "--device", "cpu",
                                                   "--prompt", "hi", "--max-new", "1"])


CASES = {
    "synthetic profile with a bad alpha": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(ckpt), str(tmp / "p.yaml"), "--hardware", "cpu-only",
                                                    "--profile", "synthetic:abc", "--no-kernels"]),
        r"--profile synthetic:abc: ALPHA must be a number >= 0 .* got 'abc'"),
    "unwritable plan path": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(ckpt), _a_file(tmp) + "/plan.yaml", "--hardware", "cpu-only",
                                                    "--kernel-dir", str(tmp / "kernels")]),
        r"plan .*afile/plan.yaml: .*afile is not a directory"),
    "report for a hardware spec that does not exist": (
        lambda ckpt, plan, tmp: (profile_cli.main, ["report", str(plans_dir() / "profiles/tiny-planted.safetensors"),
                                                    "--hardware", "nonexist", "--model", str(ckpt)]),
        r"hardware nonexist: no such file, and not a preset \(presets: cpu-only"),
    "plan with gpu: zero": (
        _run_plan(lambda d: d["layers"][0].update(gpu="zero")),
        r"edited-.*\.yaml: field 'layers\[0\]\.gpu': Input should be a valid integer, got 'zero'"),
    "plan with a hot expert id past the expert count": (
        _run_plan(lambda d: d["layers"][1].update(hot_experts=[3, 16])),
        r"field 'layers\[1\]\.hot_experts' holds expert id 16, the model has 16 experts"),
    "plan with cpu_threads: two": (
        _run_plan(lambda d: d["policy"].update(cpu_threads="two")),
        r"field 'policy\.cpu_threads': Input should be a valid integer, got 'two'"),
    "plan with prefill_threshold: -5": (
        _run_plan(lambda d: d["policy"].update(prefill_threshold=-5)),
        r"field 'policy\.prefill_threshold': Input should be greater than or equal to 0, got -5"),
    "plan with a misspelled key": (
        _run_plan(lambda d: d["policy"].update(cpu_thread=2)),
        r"field 'policy\.cpu_thread' is not a known field \(known fields here: context, "),
    "plan of schema version 1": (
        _run_plan(lambda d: d.update(schema_version=1)),
        r"field 'schema_version' is 1; this Ostinato reads 9: recompile the plan"),
    "plan that decodes with MTP but places no block": (
        _run_plan(lambda d: (d.update(mtp=None), d["policy"].update(speculative="mtp"))),
        r"field 'policy\.speculative' is mtp, but the plan places no MTP block \(field 'mtp'\)"),
    "plan whose MTP block is on a GPU the hardware lacks": (
        _run_plan(lambda d: d.update(mtp={**d["layers"][-1], "layer": 4, "gpu": 1})),
        r"field 'mtp\.gpu' is 1, the hardware has 1 GPU\(s\)"),
    "compile --speculative mtp for a checkpoint without the block": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(_without_mtp(tmp)), str(tmp / "p.yaml"), "--hardware",
                                                    "cpu-only", "--speculative", "mtp", "--no-kernels"]),
        r"--speculative mtp: .*nomtp has no MTP block to draft with .*use --speculative auto or off"),
    "plan whose memory does not add up": (
        _run_plan(lambda d: d["memory"][0].update(total_bytes=5)),
        r"field 'memory\[0\]': gpu0: total_bytes 5 is not the sum of its components"),
    "hardware spec with a misspelled key": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(ckpt), str(tmp / "p.yaml"), "--no-kernels", "--hardware",
                                                    _spec_with(tmp, lambda d: d.update(cpu_onyl=True))]),
        r"hw.yaml: field 'cpu_onyl' is not a known field"),
    "hardware spec with a string count": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(ckpt), str(tmp / "p.yaml"), "--no-kernels", "--hardware",
                                                    _spec_with(tmp, lambda d: d["host"].update(cores="2"))]),
        r"hw.yaml: field 'host\.cores': Input should be a valid integer, got '2'"),
    "compile with a bucket past context / 3": (
        lambda ckpt, plan, tmp: (compile_cli.main, [str(ckpt), str(tmp / "p.yaml"), "--no-kernels", "--hardware",
                                                    "cpu-only", "--context", "60", "--prefill-buckets", "8,32"]),
        r"prefill bucket 32: buckets are powers of two from 2 up to context / 3 \(20"),
    "compile a model path that is a file": (
        lambda ckpt, plan, tmp: (compile_cli.main, [_a_file(tmp), str(tmp / "p.yaml"), "--hardware", "cpu-only"]),
        r"MODEL .*afile: is a file, expected a checkpoint directory"),
    "run with --model a file": (
        lambda ckpt, plan, tmp: (run_cli.main, [str(plan), "--model", _a_file(tmp), "--device", "cpu"]),
        r"model .*afile is not a directory"),
    "run a plan that does not exist": (
        lambda ckpt, plan, tmp: (run_cli.main, [str(tmp / "nope.yaml"), "--device", "cpu"]),
        r"nope.yaml: no such file"),
    "inspect a file": (
        lambda ckpt, plan, tmp: (inspect_cli.main, [_a_file(tmp)]),
        r"DIRECTORY .*afile: is a file"),
    "record into an unwritable path": (
        lambda ckpt, plan, tmp: (record_cli.main, [str(ckpt),
                                                   "--sessions", str(plans_dir() / "workloads/agent_turns.csv"),
                                                   "-o", _a_file(tmp) + "/p.safetensors"]),
        r"--output .*afile/p.safetensors: .*afile is not a directory"),
    "profile report plot into a directory": (
        lambda ckpt, plan, tmp: (profile_cli.main, ["report", str(plans_dir() / "profiles/tiny-planted.safetensors"),
                                                    "--plot", str(tmp)]),
        r"--plot .*: is a directory, expected a file path"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow  # a compiled plan (C++ kernels)
def test_bad_input_is_refused_by_name(case, tiny_ckpt, compiled, tmp_path, capsys):
    make, message = CASES[case]
    main, argv = make(tiny_ckpt, compiled, tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err       # one line
    assert re.search(message, err), err
    assert not (tmp_path / "kernels").exists()                       # refused before any work


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.slow  # a compiled plan (C++ kernels)
def test_device_cuda_without_cuda_is_refused(compiled, capsys):
    assert run_cli.main([str(compiled), "--device", "cuda", "--prompt", "hi", "--max-new", "1"]) == 1
    assert "--device cuda: this machine has no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("edit, says", [
    (lambda d: (d.update(mtp=None), d["policy"].update(speculative="mtp")),
     r"field 'policy\.speculative' is mtp, but the plan places no MTP block \(field 'mtp'\)"),
    (lambda d: d["mtp"].update(layer=3), r"field 'mtp\.layer' is 3, expected 4"),
    (lambda d: d["mtp"].update(gpu=2), r"field 'mtp\.gpu' is 2, the hardware has 1 GPU\(s\)"),
    (lambda d: d["mtp"].update(hot_experts=[16]), r"field 'mtp\.hot_experts' holds expert id 16, the model has 16"),
])
def test_the_plan_schema_refuses_a_misplaced_mtp_block(tiny_ckpt, tmp_path, edit, says):
    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.plan import PlanError, plan_from_dict

    plan = compile_plan(CompileOptions(tiny_ckpt, tmp_path / "p.yaml", "cpu-only", context=1024,
                                       speculative="mtp", build_kernels=False)).plan
    data = yaml.safe_load(plan.dumps())
    plan_from_dict(data)  # as compiled: valid
    edit(data)
    with pytest.raises(PlanError, match=says):
        plan_from_dict(data, "edited.yaml")


@pytest.mark.parametrize("argv", [[], ["MODEL"], ["MODEL", "p.yaml", "--context", "0", "--hardware", "cpu-only"],
                                  ["MODEL", "p.yaml", "--hardware", "cpu-only", "--speculative", "maybe"],
                                  ["MODEL", "p.yaml", "--hardware", "cpu-only", "--prefill-buckets", "8,12"],
                                  ["MODEL", "p.yaml", "--hardware", "cpu-only", "--prefill-buckets", "eight"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        compile_cli.main(argv)
    assert e.value.code == 2


def test_profile_without_a_command_is_a_usage_error(tiny_ckpt, capsys):
    assert profile_cli.main([str(tiny_ckpt), "--sessions", "x.csv", "-o", "p.safetensors"]) == 2
    assert "use ostinato-record" in capsys.readouterr().err


@pytest.mark.slow  # compiles kernels into its own folder, in subprocesses
def test_a_plan_runs_from_any_working_directory(tiny_ckpt, tmp_path):
    """Compile in one folder, move the plan's folder elsewhere with its build/, run from a third."""
    work = tmp_path / "compiled-here"
    work.mkdir()
    model = work / "models" / "tiny"
    shutil.copytree(tiny_ckpt, model)
    subprocess.run([sys.executable, "-m", "ostinato.compiler.cli.compile", "models/tiny", "plans/plan.yaml",
                    "--hardware", "cpu-only", "--context", "1024"], cwd=work, check=True, capture_output=True)
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    moved = tmp_path / "moved"
    shutil.move(work, moved)  # the plan, its model and its kernels keep their relative places
    r = subprocess.run([sys.executable, "-m", "ostinato.runtime.cli.run", str(moved / "plans/plan.yaml"),
                        "--device", "cpu", "--prompt", "Hello", "--max-new", "3"],
                       cwd=elsewhere, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "plan " in r.stdout and "4 layers on cpu-only" in r.stdout


@pytest.mark.slow  # a compiled plan (C++ kernels)
def test_a_moved_model_is_given_with_model(tiny_ckpt, compiled, tmp_path, capsys):
    plan = yaml.safe_load(compiled.read_text())
    assert plan["model"]["path"] != str(tiny_ckpt)          # relative to the plan file
    copy = tmp_path / "elsewhere.yaml"                      # a plan whose model.path leads nowhere
    plan["model"]["path"] = "no/such/model"
    plan["kernels"] = [dict(k, path=str((compiled.parent / k["path"]).resolve())) for k in plan["kernels"]]
    copy.write_text(yaml.safe_dump(plan, sort_keys=False))
    assert run_cli.main([str(copy), "--device", "cpu", "--prompt", "hi", "--max-new", "1"]) == 1
    assert "give the checkpoint with --model" in capsys.readouterr().err
    assert run_cli.main([str(copy), "--model", str(tiny_ckpt), "--device", "cpu", "--prompt", "hi",
                         "--max-new", "1"]) == 0


@pytest.mark.slow  # a compiled plan (C++ kernels)
def test_an_all_cold_plan_compiles_and_runs(tiny_ckpt, tmp_path, kernel_dir, capsys):
    out = tmp_path / "cold.yaml"
    assert compile_cli.main([str(tiny_ckpt), str(out), "--hardware", "cpu-only", "--max-hot-per-layer", "0",
                             "--context", "1024", "--kernel-dir", str(kernel_dir)]) == 0
    plan = yaml.safe_load(out.read_text())
    assert all(layer["hot_experts"] == [] for layer in plan["layers"])
    assert plan["predictions"]["hot_route_share"] == 0.0
    assert run_cli.main([str(out), "--device", "cpu", "--prompt", "Hello", "--max-new", "3"]) == 0


def _no_engine(monkeypatch):
    def load(a):
        raise AssertionError("the engine was loaded before the inputs were checked")
    monkeypatch.setattr(run_cli, "load_engine_from_args", load)


@pytest.mark.parametrize("argv, says", [
    (["--session", "{tmp}/missing.csv"], r"^ostinato-run: error: .*missing.csv: sessions file not found$"),
    (["--session", "{tmp}"], r"^ostinato-run: error: .*: cannot read it as a sessions CSV: .*Is a directory"),
    (["--session", "{csv}", "--session-index", "9999"],
     r"^ostinato-run: error: .*agent_turns.csv: --session-index 9999 out of range "
     r"\(the file has \d+ sessions: 0\.\.\d+\)$"),
])
def test_run_checks_its_session_inputs_before_loading_the_engine(monkeypatch, tmp_path, capsys, argv, says):
    _no_engine(monkeypatch)
    csv = str(plans_dir() / "workloads/agent_turns.csv")
    argv = [a.format(tmp=tmp_path, csv=csv) for a in argv]
    assert run_cli.main([str(tmp_path / "plan.yaml"), *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(says, err.strip()), err


@pytest.mark.parametrize("argv, says", [
    (["--session-index", "2"], "--session-index picks a session of --session FILE, and no --session was given"),
    (["--session", "s.csv", "--session-index", "-1"], "--session-index must be >= 0, got -1"),
])
def test_run_session_index_usage_errors(monkeypatch, capsys, argv, says):
    _no_engine(monkeypatch)
    with pytest.raises(SystemExit) as e:
        run_cli.main(["plan.yaml", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
