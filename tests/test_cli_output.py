"""What the tools print as the demo shows them: progress on stderr while a long step runs (bars with rates and
time left, a line every few seconds while one call blocks), off when stderr is not a terminal unless asked; the
replay's summary; a command whose reader stops early (`ostinato-inspect DIR | head` under pipefail, with
PYTHONUNBUFFERED=1 as CI often sets) exits 0 without a traceback. And the recording's thread rule, which took the
demo's recording from minutes to seconds on a busy machine."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ostinato.compiler.cli import compile as compile_cli
from ostinato.plan import load_plan
from ostinato.plans import plans_dir
from ostinato.runtime import load_model
from ostinato.runtime.cli import record as record_cli
from ostinato.runtime.engine import ticker
from ostinato.runtime.engine.replay import TurnResult, summary
from ostinato.runtime.engine.step_runner import StepRunner
from ostinato.runtime.profile_recording import record_profile
from ostinato.workload import SessionShape, Turn

WORKLOAD = plans_dir() / "workloads" / "agent_turns.csv"
REPO = Path(__file__).resolve().parent.parent

CLOSED_READER = """
import os, sys
from ostinato.cli.inspect import main
r, w = os.pipe()
os.close(r)              # the reader is gone before the first byte: every write is a broken pipe
os.dup2(w, sys.stdout.fileno())
sys.exit(main([sys.argv[1], "--tensors"]))
"""


@pytest.mark.slow  # a fresh interpreter importing the CLI, seconds
def test_inspect_into_a_closed_pipe_exits_0(tiny_ckpt):
    r = subprocess.run([sys.executable, "-c", CLOSED_READER, str(tiny_ckpt)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr


# ----- recording --------------------------------------------------------------------------------
class _ThreadsSeen:
    """Wraps a model: every forward of its sessions notes torch's intra-op thread count."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def new_session(self):
        inner, seen = self.model.new_session(), self.seen

        class S:
            def prefill(self, ids, last_only=False):
                seen.append(torch.get_num_threads())
                return inner.prefill(ids, last_only)

            def decode(self, token):
                seen.append(torch.get_num_threads())
                return inner.decode(token)

        return S()


def test_a_small_model_is_recorded_on_one_thread_and_the_threads_are_given_back(tiny_ckpt):
    model = _ThreadsSeen(load_model(tiny_ckpt))
    shape = SessionShape("test/one", (Turn(12, 2), Turn(5, 1)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # as on the 2-core machine the demo runs on, whatever this one has
    try:
        record_profile(model, tiny_ckpt, [shape], phase_boundary=16, seed=3, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert model.seen and set(model.seen) == {1}, model.seen  # every prefill and decode step


def _record(tiny_ckpt, tmp_path, *flags):
    return record_cli.main([str(tiny_ckpt), "--sessions", str(WORKLOAD), "--limit-sessions", "1", "--limit-turns",
                            "2", "--max-generated", "1", "--scale", "0.01", "--no-mtp", "-o",
                            str(tmp_path / f"p{len(flags)}.safetensors"), *flags])


def test_record_shows_its_bar_when_asked_and_only_then_off_a_terminal(tiny_ckpt, tmp_path, capsys):
    assert _record(tiny_ckpt, tmp_path) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and "wrote" in quiet.out  # stderr here is not a terminal: no bar by default
    assert _record(tiny_ckpt, tmp_path, "--progress") == 0
    err = capsys.readouterr().err
    assert "recording routes" in err and "2/2" in err and "turn/s" in err and "session 1/1" in err, err
    with pytest.raises(SystemExit):  # one or the other
        record_cli.parse_args([str(tiny_ckpt), "--sessions", "x", "-o", "y", "--progress", "--quiet"])


# ----- ostinato-compile -------------------------------------------------------------------------
def test_compile_shows_its_passes_when_asked_and_only_then_off_a_terminal(tiny_ckpt, tmp_path, capsys):
    argv = [str(tiny_ckpt), str(tmp_path / "p.yaml"), "--hardware", "cpu-only", "--no-kernels", "--context", "1024"]
    assert compile_cli.main(argv) == 0
    assert capsys.readouterr().err == ""
    assert compile_cli.main([*argv, "--progress"]) == 0
    err = capsys.readouterr().err
    n = len(compile_cli.PASSES)
    assert "ostinato-compile: 100%" in err and f"{n}/{n}" in err and "pass/s" in err, err


# ----- the compiled decode step's build: a line every few seconds --------------------------------
def _wait_for(text: str, stream: io.StringIO, timeout: float = 60.0) -> None:
    """Block (as a build does) until `text` has been written: the ticker must speak while its call blocks."""
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if text in stream.getvalue():
            done.set()
            break
        done.wait(0.01)
    assert done.is_set(), f"no {text!r} within {timeout} s: {stream.getvalue()!r}"


def test_the_ticker_speaks_while_its_call_blocks_and_says_how_long_it_took():
    out = io.StringIO()
    with ticker.Ticker("building a step", "cached next time", every=0.01, enabled=True, file=out):
        _wait_for("building a step: ", out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  building a step (cached next time) ..."
    assert lines[1].startswith("  building a step: ") and lines[1].endswith(" s so far")
    assert lines[-1].startswith("  building a step: done in ")
    silent = io.StringIO()
    with ticker.Ticker("building a step", every=0.01, enabled=False, file=silent):
        threading.Event().wait(0.05)
    assert silent.getvalue() == ""


def test_progress_is_wanted_on_a_terminal_or_when_asked(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv(ticker.PROGRESS_ENV, raising=False)
    assert ticker.progress_wanted(Terminal()) and not ticker.progress_wanted(io.StringIO())
    monkeypatch.setenv(ticker.PROGRESS_ENV, "1")
    assert ticker.progress_wanted(io.StringIO())
    monkeypatch.setenv(ticker.PROGRESS_ENV, "0")
    assert not ticker.progress_wanted(Terminal())


def test_each_decode_step_build_is_said_with_its_context_and_time(monkeypatch, capsys):
    """StepRunner.compile_cpu_step over two stand-in steps whose build blocks until the ticker has spoken."""
    monkeypatch.setenv(ticker.PROGRESS_ENV, "1")
    monkeypatch.setattr(ticker, "TICK_SECONDS", 0.01)
    built = []

    class Graphs:
        def __init__(self, context):
            self.context = context

        def compile_cpu(self):
            for _ in range(6000):  # until this step's "so far" line is out (stderr is captured: read it back)
                err = capsys.readouterr().err
                built.append(err)
                if f"positions up to {self.context:,d}: " in err and "so far" in err:
                    return
                threading.Event().wait(0.01)
            raise AssertionError(f"the ticker never spoke while the {self.context}-token step was built")

    class Runner:  # speculative: every step built at load (a plain runner builds the larger ones when needed)
        cpu_step, decode_steps, speculative = "compiled", [(512, Graphs(512)), (2048, Graphs(2048))], True
        _build = StepRunner._build

        def release(self):
            pass

        def release_drafter(self):
            pass

    contexts = []
    assert StepRunner.compile_cpu_step(Runner(), contexts.append) is True
    said = "".join(built) + capsys.readouterr().err
    assert contexts == [512, 2048]
    assert "building decode step 1/2 for positions up to 512 (the first time" in said
    assert "building decode step 2/2 for positions up to 2,048: done in " in said


# ----- the replay's summary ---------------------------------------------------------------------
def test_the_replay_summary_puts_the_plans_predicted_wait_beside_the_measured_one():
    plan = load_plan(plans_dir() / "tiny.cpu-only.yaml")

    def turn(i, wait_ms, predicted_ms):
        return TurnResult(i, 10, 4, "split", wait_ms / 1e3, 100.0, 0.8, 3, predicted_ms / 1e3)

    # the first turn (the session's start, not a tool output) counts in neither median
    results = [turn(0, 900.0, 90.0), turn(1, 10.0, 12.0), turn(2, 30.0, 16.0), turn(3, 20.0, 14.0)]
    first = summary(results, plan, 1.0).splitlines()[0]
    assert first == ("wait after tool output (turns after the first): median 20.0 ms, p90 28.0 ms "
                     "(plan predicts median 14.0 ms)")


def test_the_demos_closing_summary_finds_every_figure_it_quotes_in_the_replays_output(tmp_path):
    """tools/demo.sh reads its closing figures back from ostinato-run's summary lines (its `pick` calls, sed -E
    expressions): each must find its figure in what summary() prints, else the demo would say "?"."""
    plan = load_plan(plans_dir() / "tiny.cpu-only.yaml")
    results = [TurnResult(i, 10, 4, "split", 0.02, 100.0, 0.8, 3, 0.015) for i in range(3)]
    printed = summary(results, plan, 1.0)
    (tmp_path / "replay.txt").write_text(printed + "\n")
    demo = (REPO / "tools" / "demo.sh").read_text()
    picks = re.findall(r"^(\w+)=\$\(pick '([^']+)'\)$", demo, flags=re.MULTILINE)
    assert len(picks) >= 6, picks
    for name, expression in picks:
        got = subprocess.run(["sed", "-nE", f"s#{expression}#\\1#p", str(tmp_path / "replay.txt")],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert got, f"tools/demo.sh: {name}'s expression {expression!r} finds nothing in:\n{printed}"


def test_openmp_threads_in_tests_sleep_when_idle():
    """conftest.py sets OMP_WAIT_POLICY=PASSIVE before torch loads libgomp (why: its comment); the test
    process and the subprocesses it starts inherit it."""
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "PASSIVE"
