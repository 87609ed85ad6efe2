"""The placement engine computes the plain model's function under every placement and mode."""

import shutil

import pytest
import torch
from conftest import compile_tiny_plan
from engine_helpers import IDS, _close, _engine, _variant, on_gpus

from ostinato.plan import PlanError
from ostinato.runtime.cli.run import main as run_main
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.kernels import launch as launch_module

# compiled (the plan, session-wide) and reference (the plain model) are fixtures of tests/conftest.py
pytestmark = pytest.mark.slow  # compiled kernels, the plain model as reference


@pytest.fixture
def compiled_beside_its_build(compiled, tiny_ckpt, tmp_path_factory):
    """The shared plan compiled again into a folder of its own, its kernels in build/kernels beside it (the
    layout ostinato-compile makes by default), copied from the session's kernel folder: nothing rebuilds."""
    plan, _ = compiled
    work = tmp_path_factory.mktemp("engine_own_build")
    for k in plan.kernels:
        folder = plan.resolve(k.path).parent
        shutil.copytree(folder, work / "build" / "kernels" / folder.name, dirs_exist_ok=True)
    return compile_tiny_plan(tiny_ckpt, work, context=4096, max_hot_per_layer=6), work


@pytest.mark.parametrize("placement", ["all-hot", "all-cold", "mixed", "random"])
@pytest.mark.parametrize("mode", ["split", "upload"])
@pytest.mark.parametrize("hot_backend", ["cpu", "torch"])  # the CPU's default, and the reference backend
def test_prefill_and_decode_equal_the_plain_model(compiled, tiny_ckpt, reference, placement, mode, hot_backend):
    engine = _engine(compiled, tiny_ckpt, placement, threshold=None if mode == "split" else 16,
                     hot_backend=hot_backend)
    ours, ref = engine.new_session(), reference.new_session()
    _close(ours.prefill(IDS[:100]), ref.prefill(IDS[:100]))
    _close(ours.prefill(IDS[100:110]), ref.prefill(IDS[100:110]))  # 10 tokens: split even in upload plans
    token = int(IDS[110])
    for _ in range(4):  # decode steps: the fixed-shape step
        a, b = ours.decode(token), ref.decode(token)
        _close(a, b)
        token = int(b.argmax())
    c, k, L = engine.executor.counters, engine.plan.model.top_k, engine.plan.model.layers
    assert c.routes_hot + c.routes_cold == 114 * k * L
    if placement == "all-hot":
        assert c.routes_cold == 0
    if placement == "all-cold":
        assert c.routes_hot == 0
    engine.close()


def test_counters_add_up_in_upload_mode(compiled, tiny_ckpt, reference):
    engine = _engine(compiled, tiny_ckpt, "mixed", threshold=16)
    seen = []
    reference.set_observer(lambda layer, tokens, ids: seen.append((layer, ids.clone())))
    try:
        reference.new_session().prefill(IDS[:64])
    finally:
        reference.set_observer(None)
    engine.new_session().prefill(IDS[:64])
    c = engine.executor.counters
    hot = {lp.layer: set(lp.hot_experts) for lp in engine.plan.layers}
    distinct_cold = sum(len(set(ids.reshape(-1).tolist()) - hot[layer]) for layer, ids in seen)
    routes_cold = sum(sum(1 for e in ids.reshape(-1).tolist() if e not in hot[layer]) for layer, ids in seen)
    assert c.routes_cold == routes_cold and c.routes_hot + c.routes_cold == 64 * engine.plan.model.top_k * 4
    assert c.experts_uploaded == c.distinct_cold == distinct_cold > 0
    assert c.bytes_uploaded == distinct_cold * engine.plan.model.expert_bytes
    engine.close()


def test_greedy_tokens_of_a_multi_turn_session_match(compiled, tiny_ckpt, reference):
    engine = _engine(compiled, tiny_ckpt, "mixed", threshold=40)
    ours, ref = engine.new_session(), reference.new_session()
    got, want = [], []
    for start, stop in [(0, 60), (60, 75), (75, 140)]:  # upload, split, upload prefills
        for sess, out in ((ours, got), (ref, want)):
            tok = int(sess.prefill(IDS[start:stop])[-1].argmax())
            for _ in range(6):
                out.append(tok)
                tok = int(sess.decode(tok).argmax())
    assert got == want
    engine.close()


def test_truncate_and_fork_through_the_engine(compiled, tiny_ckpt, reference):
    engine = _engine(compiled, tiny_ckpt, "mixed")
    s = engine.new_session()
    s.prefill(IDS[:50])
    s.prefill(IDS[50:80])
    other = s.fork()
    s.truncate(50)
    _close(s.prefill(IDS[50:60]), reference.new_session().prefill(IDS[:60])[50:])
    assert len(other) == 80
    engine.close()


def test_triton_hot_backend_under_the_interpreter(compiled, tiny_ckpt, reference, monkeypatch):
    """Exact in every mode, on the 2-GPU plan mapped to the CPU; every kernel launched through launch()
    (runtime/kernels/launch.py) with the tensors of one planned GPU only, on both GPUs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    plan = on_gpus(_variant(compiled[0], "mixed", 4), 2)
    engine = load_engine(plan, tiny_ckpt, device="cpu", hot_backend="triton")
    planned = {}  # storage -> the planned GPU of the tensors the plan puts there
    for lp, le in zip(plan.layers, engine.executor.layers):
        for pool in (le.hot_pool, *le.staging):
            planned.update({t.untyped_storage().data_ptr(): lp.gpu for t in vars(pool).values()})
    launches, real = [], launch_module.launch_device

    def recorded(name, args):
        launches.append({planned.get(a.untyped_storage().data_ptr()) for a in args if isinstance(a, torch.Tensor)})
        return real(name, args)

    monkeypatch.setattr(launch_module, "launch_device", recorded)
    ours, ref = engine.new_session(), reference.new_session()
    _close(ours.prefill(IDS[:3]), ref.prefill(IDS[:3]))      # split
    _close(ours.prefill(IDS[3:9]), ref.prefill(IDS[3:9]))    # upload
    _close(ours.decode(int(IDS[9])), ref.decode(int(IDS[9])))  # decode variant
    engine.close()
    gpus = [g - {None} for g in launches]
    assert gpus and all(len(g) == 1 for g in gpus), [g for g in gpus if len(g) != 1][:3]
    assert set().union(*gpus) == {0, 1}


def test_a_plan_for_another_checkpoint_is_refused(compiled, small_ckpt):
    plan, _ = compiled
    with pytest.raises(PlanError, match="field 'provenance.config_sha256'"):
        load_engine(plan, small_ckpt, device="cpu")


def test_missing_kernel_artifact_is_a_clear_error(compiled_beside_its_build, tiny_ckpt, tmp_path):
    plan, work = compiled_beside_its_build
    shutil.copy(work / "plan.yaml", tmp_path / "plan.yaml")  # a plan copied without its build/ folder
    with pytest.raises(PlanError, match="kernel artifact .*/build/kernels/.* not found.*run ostinato-compile again"):
        load_engine(tmp_path / "plan.yaml", tiny_ckpt, device="cpu")


def test_ostinato_run_replays_a_session(compiled, tiny_ckpt, capsys, monkeypatch):
    plan, work = compiled
    monkeypatch.chdir(work)
    from ostinato.plans import plans_dir

    rc = run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--session",
                   str(plans_dir() / "workloads" / "agent_turns.csv"), "--limit-turns", "3", "--scale", "0.05",
                   "--max-generated", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [l for l in out.splitlines() if l[:4].strip().isdigit()]
    assert len(rows) == 3 and "wait after tool output" in out and "session time" in out


def test_a_two_gpu_pipeline_plan(compiled, tiny_ckpt, reference):
    """Layers split over two planned GPUs (both the CPU here): the pipeline path computes the same."""
    plan, work = compiled
    hardware = plan.hardware.replace(gpus=plan.hardware.gpus.replace(count=2))
    layers = [lp.replace(gpu=0 if lp.layer < 2 else 1) for lp in plan.layers]
    memory = [plan.memory[0], plan.memory[0].replace(device="gpu1"), plan.memory[1]]
    two = plan.replace(hardware=hardware, layers=layers, memory=memory, mtp=plan.mtp and plan.mtp.replace(gpu=1))
    engine = load_engine(two, tiny_ckpt, device="cpu")
    assert engine.model.layer_devices == [torch.device("cpu")] * 4 and len(engine.devices) == 2
    _close(engine.new_session().prefill(IDS[:40]), reference.new_session().prefill(IDS[:40]))
    engine.close()


def test_a_cpu_engine_of_small_matrices_prefills_a_short_prompt_on_one_thread(compiled, tiny_ckpt, reference):
    """Engine.prefill_threads: the tiny model's matrices are all small (cpu_step.graph_threads' rule), so a prompt
    of up to ONE_THREAD_PREFILL_TOKENS tokens runs the dynamic model's torch ops on one thread and a longer one
    on torch's count, which is back as it was afterwards; the logits are the plain model's either way."""
    from ostinato.runtime.engine.cpu_step import ONE_THREAD_PREFILL_TOKENS

    plan, _ = compiled
    engine = load_engine(_variant(plan, "mixed", None), tiny_ckpt, device="cpu")
    threads, seen, head = torch.get_num_threads(), [], engine.model.head
    engine.model.head = lambda *a, **k: seen.append(torch.get_num_threads()) or head(*a, **k)
    long_ids = torch.randint(0, engine.model.config.vocab_size, (ONE_THREAD_PREFILL_TOKENS + 8,),
                             generator=torch.Generator().manual_seed(4))
    for ids, want_threads in ((IDS[:40], 1), (long_ids, threads)):
        seen.clear()
        got = engine.new_session().prefill(ids)
        assert seen and set(seen) == {want_threads} and torch.get_num_threads() == threads
        _close(got, reference.new_session().prefill(ids))
    engine.close()


def test_lru_cache_baseline_is_exact_and_follows_its_rules(compiled, tiny_ckpt, reference):
    from ostinato.bench.lru_executor import FILL_MAX_TOKENS, lru_cache_engine

    plan, _ = compiled
    hot_sets = [list(lp.hot_experts) for lp in plan.layers]
    engine = lru_cache_engine(_engine(compiled, tiny_ckpt, "all-cold"), hot_sets)
    lru = engine.executor
    before = [list(c) for c in lru.cache]
    ours, ref = engine.new_session(), reference.new_session()
    _close(ours.prefill(IDS[:FILL_MAX_TOKENS + 1]), ref.prefill(IDS[:FILL_MAX_TOKENS + 1]))  # 33 tokens: read only
    assert [list(c) for c in lru.cache] == before and lru.counters.experts_uploaded > 0  # misses uploaded, not kept
    uploads = lru.counters.experts_uploaded
    _close(ours.prefill(IDS[33:33 + FILL_MAX_TOKENS - 1]), ref.prefill(IDS[33:33 + FILL_MAX_TOKENS - 1]))  # 31: fill
    assert [list(c) for c in lru.cache] != before and lru.counters.experts_uploaded > uploads
    assert all(len(c) == len(h) for c, h in zip(lru.cache, hot_sets))  # bounded by the hot set's bytes
    token = int(IDS[70])
    for _ in range(3):
        a, b = ours.decode(token), ref.decode(token)
        _close(a, b)
        token = int(b.argmax())
    engine.close()


def test_ostinato_run_answers_a_prompt_and_names_bad_input(compiled, tiny_ckpt, reference, capsys, monkeypatch):
    from tokenizers import Tokenizer

    plan, work = compiled
    monkeypatch.chdir(work)
    assert run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--prompt", "Hello",
                     "--max-new", "4"]) == 0
    tok = Tokenizer.from_file(str(tiny_ckpt / "tokenizer.json"))
    session, out = reference.new_session(), []
    nxt = int(session.prefill([0] + tok.encode("Hello").ids)[-1].argmax())
    while len(out) < 4:
        out.append(nxt)
        if nxt == 1:
            break
        nxt = int(session.decode(nxt).argmax())
    assert capsys.readouterr().out.endswith(tok.decode(out) + "\n")  # the plain model's greedy reply
    from ostinato.plans import plans_dir

    rc = run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--session",
                   str(plans_dir() / "workloads" / "agent_turns.csv"), "--session-index", "99"])
    assert rc == 1 and "--session-index 99 out of range (the file has 45 sessions: 0..44)" in capsys.readouterr().err
