"""bench/kernel_side_by_side.py: the call shapes, the YAML table it writes, and (where kt-kernel imports) kt's
process agreeing with our kernel. Nothing here times anything."""

from __future__ import annotations

import importlib.util
import math
import time

import pytest
import torch
import yaml

from ostinato.bench import kernel_side_by_side as ks
from ostinato.bench.expert_layer import SEED, layer_checksum, random_layer
from ostinato.bench.kt_process import KtProcess


def test_shapes_tokens_per_expert_and_distinct():
    g = torch.Generator().manual_seed(0)
    names = []
    for shape in ks.shapes():
        names.append(shape.name)
        ids, w = shape.draw(4, g)
        assert ids.shape == (4, shape.n, 6) and w.shape == ids.shape and ids.dtype == torch.int64
        assert int(ids.min()) >= 0 and int(ids.max()) < 256
        # each token's 6 experts are distinct; weights positive, ~1/6, summing to 1 per token
        assert (ids.sort(-1).values.diff(dim=-1) > 0).all()
        assert (w > 0).all() and torch.allclose(w.sum(-1), torch.ones(4, shape.n))
        distinct, tpe = ks.route_stats(ids)
        assert tpe == pytest.approx(shape.n * 6 / distinct, rel=0.05)  # mean of ratios vs ratio of means
        if shape.kind == "grouped":
            t = shape.n // shape.groups
            assert distinct == 6 * shape.groups and tpe == t
            for c in ids:  # every expert of a group gets exactly t tokens
                assert (torch.bincount(c.reshape(-1), minlength=256)[c.unique()] == t).all()
        else:
            assert distinct == pytest.approx(shape.expected_distinct(), rel=0.1)
            if shape.n == 1:
                assert (distinct, tpe) == (6.0, 1.0)
    assert names == [f"uniform n={n}" for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)] + \
        [f"grouped n=512 t={t}" for t in (16, 32, 64)]
    expected_t = [s.n * 6 / s.expected_distinct() for s in ks.shapes()]
    assert expected_t == sorted(expected_t)  # listed ascending in tokens per expert
    assert [s.name for s in ks.shapes(quick=True)] == ["uniform n=1", "uniform n=8", "uniform n=64",
                                                       "grouped n=512 t=64"]


def test_timed_calls_budget():
    for shape in ks.shapes():
        n = ks.timed_calls(shape, samples=30, rounds=3)
        assert 6 <= n <= 30
    assert ks.timed_calls(ks.Shape("uniform", 1), 30, 3) == 30
    assert ks.timed_calls(ks.Shape("grouped", 512, 8), 30, 3) == 6
    assert ks.median([3.0, 1.0, 2.0]) == 2.0 and ks.median([4.0, 1.0, 2.0, 3.0]) == 2.5


def fake_table(tmp_path):
    names = ["grouped n=512 t=16", "uniform n=1", "uniform n=8"]  # out of order: the writer sorts
    tpe, distinct = [16.0, 1.0, 1.066666], [192.0, 6.0, 45.0]
    systems = {"ostinato": {"threads": 2, "reserved_cores": 0, "seconds": [2.0, 0.006, 0.0451234], "driven": "ours"},
               "kt-kernel": {"threads": 1, "reserved_cores": 1, "seconds": [5.0, 0.02, 0.2], "driven": "kt, 1 worker"},
               "ggml": {"threads": 2, "reserved_cores": 0, "seconds": [3.0, 0.008, 0.06], "driven": "ggml"}}
    meta = {"source": "python -m ostinato.bench.kernel_side_by_side, one run, AMD EPYC, 2026-01-01, load average "
                      "0.05/2.10", "cpu": "AMD EPYC", "isa": "avx2", "cores": 2, "read_bandwidth": 29_123_456_789.0}
    data = ks.table_data(meta, names, tpe, distinct, systems)
    path = tmp_path / "cpu_expert_kernels.yaml"
    ks.write_table(path, data)
    return path, systems


def test_table_schema_round_trip(tmp_path):
    path, systems = fake_table(tmp_path)
    text = path.read_text()
    assert text.startswith("#") and "kernel_side_by_side" in text.splitlines()[0] + text.splitlines()[1]
    got = yaml.safe_load(text)
    assert list(got) == ["source", "cpu", "isa", "cores", "read_bandwidth", "expert_bytes", "layer_experts", "top_k",
                         "shapes", "tokens_per_expert", "distinct_experts", "systems"]
    assert got["source"].startswith("python -m ostinato.bench.kernel_side_by_side, one run, AMD EPYC, ")
    assert (got["cpu"], got["isa"], got["cores"]) == ("AMD EPYC", "avx2", 2)
    assert got["read_bandwidth"] == 2.912e10 and isinstance(got["read_bandwidth"], float)
    assert (got["expert_bytes"], got["layer_experts"], got["top_k"]) == (13369344, 256, 6)
    assert got["shapes"] == ["uniform n=1", "uniform n=8", "grouped n=512 t=16"]
    assert got["tokens_per_expert"] == [1.0, 1.067, 16.0]
    assert got["distinct_experts"] == [6.0, 45.0, 192.0]
    assert list(got["systems"]) == ["ostinato", "kt-kernel", "ggml"]
    order = [1, 2, 0]  # input index of each written shape
    for name, s in got["systems"].items():
        assert list(s) == ["threads", "reserved_cores", "per_core", "ms", "driven"]
        assert s["threads"] == systems[name]["threads"] and s["reserved_cores"] == systems[name]["reserved_cores"]
        assert s["driven"] == systems[name]["driven"]
        for key in ("per_core", "ms"):
            assert len(s[key]) == len(got["shapes"]) and all(isinstance(v, float) for v in s[key])
        for j, i in enumerate(order):
            secs = systems[name]["seconds"][i]
            assert s["ms"][j] == pytest.approx(secs * 1e3, rel=5e-4)
            want = got["distinct_experts"][j] * 13369344 / (secs * s["threads"])
            assert s["per_core"][j] == pytest.approx(want, rel=1e-3)
            assert s["per_core"][j] == float(f"{s['per_core'][j]:.4g}")  # 4 significant digits
    assert got["systems"]["ostinato"]["ms"][1] == 45.12
    assert got["systems"]["ostinato"]["per_core"][0] == pytest.approx(6 * 13369344 / 0.012, rel=1e-3)


def test_table_rewrite_is_whole(tmp_path):
    path, _ = fake_table(tmp_path)
    first = path.read_text()
    fake_table(tmp_path)
    assert path.read_text() == first and not list(tmp_path.glob("*.part"))


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ks.main(["--threads", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        ks.main(["--out", str(tmp_path / "no" / "such" / "t.yaml")])
    assert e.value.code == 2 and "no directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # --doc writes the block of the table the run writes: none here
        ks.main(["--out", "", "--doc"])
    assert e.value.code == 2 and "--doc writes the block" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        ks.main(["--out", str(tmp_path / "t.yaml"), "--doc", str(tmp_path / "no-such.md")])
    assert e.value.code == 2 and "no-such.md: no such file" in capsys.readouterr().err


def test_cli_refuses_an_isa_this_cpu_lacks_and_a_table_of_cpu_seconds(tmp_path, capsys):
    from ostinato.isa import ISAS, supports

    lacking = next((isa for isa in reversed(ISAS) if not supports(isa)), None)
    if lacking is not None:  # every CPU lacks something of the list but the richest one
        with pytest.raises(SystemExit) as e:
            ks.main(["--isa", lacking, "--out", ""])
        assert e.value.code == 2 and "cannot run it" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # CPU seconds are not the wall seconds the simulator's table holds
        ks.main(["--clock", "cpu", "--out", str(tmp_path / "t.yaml")])
    assert e.value.code == 2 and "--clock cpu" in capsys.readouterr().err


@pytest.mark.slow  # compiles our kernel (small)
def test_ours_builds_the_isa_asked_for_and_times_cpu_seconds(tmp_path):
    experts = random_layer(E, DIM, INTER, SEED)
    ours = ks.Ours(experts, 1, DIM, INTER, build_root=str(tmp_path / "kernels"), isa="avx2", cpu_time=True)
    assert ours.kern.info["isa"] == "avx2" and ours.clock is time.process_time
    secs = ours.run(*ks.Shape("uniform", 3).draw(3, torch.Generator().manual_seed(2), E, K), warmup=1)
    assert len(secs) == 2 and all(s >= 0 and math.isfinite(s) for s in secs)


def test_busy_processes_and_load():
    assert ks.load_average() >= 0.0
    for pid, name, share in ks.busy_processes(interval=0.2):
        assert pid > 0 and isinstance(name, str) and share > 0.1


# ---- kt-kernel (where installed): a small layer, so the test stays fast ----

E, K, DIM, INTER = 8, 2, 256, 128


@pytest.mark.slow  # compiles our kernel (small) and starts kt's process
def test_kt_process_agrees_with_ours_and_stops_cleanly(tmp_path):
    # never import kt_kernel here: its extension turns on flush-to-zero for the whole process when it
    # loads, and later tests of exact denormal decoding would fail; KtProcess runs it in a child
    if importlib.util.find_spec("kt_kernel") is None:
        pytest.skip("kt-kernel is not installed (pip install --no-deps kt-kernel==0.7.2 gguf)")
    kt = KtProcess(1, n_experts=E, top_k=K, dim=DIM, inter=INTER, max_len=16)
    try:
        assert kt.info["backend"] and kt.info["version"]
        experts = random_layer(E, DIM, INTER, SEED)
        assert kt.checksum == layer_checksum(experts)  # the same bytes in both processes
        ours = ks.Ours(experts, 2, DIM, INTER, build_root=str(tmp_path / "kernels"))
        g = torch.Generator().manual_seed(5)
        ids, w = ks.Shape("uniform", 5).draw(1, g, E, K)
        x = torch.randn(5, DIM, generator=g).bfloat16()
        a = ours.forward(x, ids[0], w[0])
        b = kt.forward(x, ids[0], w[0]).float()
        assert float(a.abs().max()) > 0
        assert float((a - b).abs().max() / a.abs().max()) < 2e-2  # bf16 activations and output
        kt.stop()
        assert kt.stopped
        time.sleep(0.05)
        assert kt.proc.poll() is None
        kt.cont()
        secs = kt.run(*ks.Shape("uniform", 3).draw(3, g, E, K), warmup=1)
        assert len(secs) == 2 and all(s > 0 and math.isfinite(s) for s in secs)
        assert len(ours.run(*ks.Shape("uniform", 3).draw(3, g, E, K), warmup=1)) == 2
        kt.stop()  # close continues a stopped process before it ends it
    finally:
        kt.close()
    assert kt.proc.returncode == 0


@pytest.mark.slow  # compiles bench/ggml_expert_kernel.c against a llama.cpp build, where one is found
@pytest.mark.parametrize("cpu_time", [False, True])
def test_ggml_process_runs_routed_calls(cpu_time):
    from ostinato.bench.ggml_kernel import GgmlMxfp4, GgmlNotFound, uniform_routes

    try:
        g = GgmlMxfp4(2, n_experts=8, top_k=2, cpu_time=cpu_time)
    except GgmlNotFound as e:
        pytest.skip(f"no llama.cpp build: {e}")
    try:
        assert g.check_rel_err_q8 < 1e-2 and g.check_rel_err < 5e-2  # its own float reference, 2 tokens x top-2
        ids, w = uniform_routes(3, 4, 8, 2)
        secs = g.run(ids, w, warmup=1)
        assert len(secs) == 2 and all(s > 0 for s in secs)
        with pytest.raises(ValueError):
            g.run(ids + 8, w, warmup=1)  # expert ids past the layer
    finally:
        g.close()
