"""ostinato-serve's command line, and `ostinato-run --serve` as its alias for one release (an exec, not an import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ostinato.server import cli as serve_cli


def test_a_missing_plan_is_refused_by_name(tmp_path, capsys):
    assert serve_cli.main([str(tmp_path / "nope.yaml"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ostinato-serve: error:") and "nope.yaml" in err


@pytest.mark.parametrize("argv, says", [
    (["p.yaml", "--port", "70000"], "--port must be in 0..65535, got 70000"),
    (["p.yaml", "--max-queue", "0"], "--max-queue must be positive, got 0"),
    (["p.yaml", "--session-idle", "-1"], "--session-idle must be positive, got -1.0"),
    (["p.yaml", "--max-body-bytes", "0"], "--max-body-bytes must be positive, got 0"),
    ([], "the following arguments are required: plan"),
])
def test_usage_errors_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        serve_cli.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter importing the runtime, seconds
def test_run_with_serve_becomes_ostinato_serve_and_says_so(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ostinato.runtime.cli.run", str(tmp_path / "p.yaml"), "--serve",
                        "--port", "70000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "`ostinato-run PLAN --serve` is now `ostinato-serve PLAN`" in r.stderr
    assert "usage: ostinato-serve" in r.stderr and "--port must be in 0..65535" in r.stderr


def test_run_no_longer_takes_server_options(capsys):
    from ostinato.runtime.cli import run as run_cli

    with pytest.raises(SystemExit) as e:
        run_cli.main(["p.yaml", "--api-key", "k"])
    assert e.value.code == 2 and "unrecognized arguments: --api-key" in capsys.readouterr().err


def test_a_busy_port_is_refused_by_name_before_the_model_loads(monkeypatch, capsys):
    import socket

    def load(a):
        raise AssertionError("the model was loaded before the port was checked")
    monkeypatch.setattr(serve_cli, "load_engine_from_args", load)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert serve_cli.main(["p.yaml", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ostinato-serve: error: cannot listen on") and f"127.0.0.1:{port}" in err


def test_max_body_bytes_is_an_option():
    assert serve_cli.parse_args(["p.yaml"]).max_body_bytes == 4 << 20
    assert serve_cli.parse_args(["p.yaml", "--max-body-bytes", "1000"]).max_body_bytes == 1000


def test_a_session_dir_in_use_is_refused_before_the_model_loads(monkeypatch, tmp_path, capsys):
    """Another process holds the folder's lock: refused by name with its pid; killed, the lock is gone."""
    import signal
    import time

    def load(a):
        raise AssertionError("the model was loaded before the session folder was checked")
    monkeypatch.setattr(serve_cli, "load_engine_from_args", load)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from ostinato.server.session_lock import SessionDirLock\n"
                               f"SessionDirLock.take({str(tmp_path)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert serve_cli.main(["p.yaml", "--port", "0", "--session-dir", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"ostinato-serve: error: --session-dir {tmp_path} is in use by another server")
        assert f"(pid {holder.pid})" in err
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no cleanup runs
        holder.wait()
    from ostinato.server.session_lock import SessionDirLock
    deadline = time.monotonic() + 5
    while True:  # the kernel drops a dead process's flock at once; allow the reaping a moment
        try:
            lock = SessionDirLock.take(tmp_path)
            break
        except OSError:
            assert time.monotonic() < deadline, "a killed server's lock stayed taken"
            time.sleep(0.05)
    with pytest.raises(OSError, match=f"in use by another server \\(pid {os.getpid()}\\)"):
        SessionDirLock.take(tmp_path)  # one holder at a time, within one process too
    lock.release()
    SessionDirLock.take(tmp_path).release()


def test_shutdown_timeout_is_an_option(capsys):
    assert serve_cli.parse_args(["p.yaml"]).shutdown_timeout == 60.0
    assert serve_cli.parse_args(["p.yaml", "--shutdown-timeout", "2.5"]).shutdown_timeout == 2.5
    with pytest.raises(SystemExit):
        serve_cli.parse_args(["p.yaml", "--shutdown-timeout", "0"])
    assert "--shutdown-timeout must be positive, got 0.0" in capsys.readouterr().err


SLOW_REPLY_SERVER = """
import asyncio, socket, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from ostinato.server.background import server_for

async def slow(request):
    print("replying", flush=True)
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise
    return JSONResponse({})

sock = socket.create_server(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
server_for(Starlette(routes=[Route("/slow", slow)]), "127.0.0.1", 0, float(sys.argv[1])).run(sockets=[sock])
"""


@pytest.mark.slow  # a fresh interpreter serving, seconds
def test_sigterm_says_what_it_waits_for_and_stops_within_the_bound():
    """The server ostinato-serve runs (server_for), stopped by SIGTERM with a reply in flight: it says it
    waits for 1 reply at most 1 s, then cancels it and exits, instead of waiting for the reply in silence."""
    import signal
    import threading

    import httpx

    proc = subprocess.Popen([sys.executable, "-c", SLOW_REPLY_SERVER, "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        threading.Thread(target=lambda: httpx.get(f"http://127.0.0.1:{port}/slow", timeout=150), daemon=True).start()
        assert proc.stdout.readline().strip() == "replying"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # without the bound: the 120 s reply, then this times out
    finally:
        proc.kill()
    assert "stopping: waiting for 1 reply in flight, at most 1 s (then it is cancelled)" in err
    assert "Cancel 1 running task(s)" in err and "Traceback" not in err, err
    assert out.split() == ["cancelled"] and proc.returncode == -signal.SIGTERM, (out, err)  # uvicorn re-raises it
