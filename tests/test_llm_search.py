"""Acceptance of LLM mutation: a whole search on the in-process runtime (evo.engine.local_runtime,
one fake GPU), driven by a scripted OpenAI-compatible endpoint over real HTTP (127.0.0.1), with
fake compile/GPU stages.

genesis (typo) -> compile failure -> repair -> correct -> optimize (faster); the lineage and
the llm_calls rows are asserted, and replaying the run from its stored calls, without the
endpoint, reproduces the same lineage.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest


from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.engine.engine import Engine, EngineSettings  # noqa: E402
from evo.engine.llm_context import StoreContextProvider  # noqa: E402
from evo.core.records import StageResult, Status  # noqa: E402
from evo.engine.local_runtime import LocalRuntime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from evo.store import Store  # noqa: E402
from fakes import stages as fake  # noqa: E402
from mutators.llm.replay.cassette import Cassette, ReplayClient  # noqa: E402
from mutators.llm.client.budget import Budget  # noqa: E402
from mutators.llm.client.chat import LLMClient
from mutators.llm.client.model_spec import ModelSpec
from mutators.llm.replay.fake_server import FakeLLMServer  # noqa: E402
from mutators.llm.mutator import LLMMutator  # noqa: E402

CASSETTE = Path(__file__).parent / "fixtures" / "llm" / "lineage.jsonl"
TASK = "kb19_relu"  # a real task (for the prompt's reference and shapes), searched with no seed



def _search(store, run_id, client, model):
    mut = LLMMutator(client, [model], StoreContextProvider(store, run_id, gpu_name="H200"),
                     attempt_sink=lambda rec: store.log_event(run_id, "llm_attempt", {"ok": rec.ok, "kind": rec.kind}))
    mut.max_failed_attempts = 2
    rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                      harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
    eng = Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK], seeds={},
                 settings=EngineSettings(islands_per_task=1, max_evaluations=3, in_flight=1,
                                         confirm_champions=False),
                 rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK))
    summary = eng.run()
    rt.shutdown()
    return summary


def _lineage(store, run_id):
    out = []
    for c in store.candidates(run_id):
        ev = store.get_evaluation(c.id, run_id)
        out.append((c.id, c.parents, c.operator, ev.status.value, ev.fitness))
    return out


def test_genesis_repair_optimize_over_http_then_replay(tmp_path):
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("llm", {}, seed=5, config_hash="x")
    with FakeLLMServer(Cassette.load(CASSETTE)) as server:
        model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY",
                          price_in_per_mtok=1.0, price_out_per_mtok=2.0)
        client = LLMClient([model], timeout_s=5, max_attempts=1, backoff_base_s=0.01,
                           budget=Budget(1.0), sink=lambda call: store.add_llm_call(run_id, **call.to_row()))
        summary = _search(store, run_id, client, model)
        assert len(server.requests) >= 3
    assert summary.evaluations == 3

    lineage = _lineage(store, run_id)
    (g_id, g_par, g_op, g_st, _), (r_id, r_par, r_op, r_st, r_fit), (o_id, o_par, o_op, o_st, o_fit) = lineage
    assert (g_par, g_op, g_st) == ((), "llm:fake", "compile_error")
    assert (r_par, r_op, r_st) == ((g_id,), "llm:fake", "ok")
    assert (o_par, o_op, o_st) == ((r_id,), "llm:fake", "ok")
    assert o_fit > r_fit, "the optimize child is faster than its parent"
    assert "* BLOK +" in store.get_candidate(g_id).source and "* BLOK +" not in store.get_candidate(r_id).source
    assert "__launch_bounds__" in store.get_candidate(o_id).source

    calls = store.llm_calls(run_id)
    kinds = [c["kind"] for c in calls[:3]]
    assert kinds == ["genesis", "repair", "optimize"]
    assert all(c["tokens_in"] > 0 and c["cost"] > 0 and c["prompt_hash"] for c in calls[:3])
    repair_prompt = json.loads(calls[1]["prompt"])[-1]["content"]
    assert 'identifier "BLOK" is undefined' in repair_prompt, "repair prompt quotes the compile error"
    assert store.llm_totals(run_id)["cost"] == pytest.approx(sum(c["cost"] for c in calls))

    # Replay: no endpoint, same prompts -> same answers -> the same lineage.
    run2 = store.create_run("llm-replay", {}, seed=5, config_hash="x")
    model = ModelSpec("fake", "http://127.0.0.1:9/v1", "fake-coder", key_env="EVO_TEST_NO_KEY")
    replay = ReplayClient(calls, sink=lambda call: store.add_llm_call(run2, **call.to_row()))
    _search(store, run2, replay, model)
    assert [x[:3] for x in _lineage(store, run2)] == [x[:3] for x in lineage]
    assert all(c["cached"] for c in store.llm_calls(run2))
    store.close()


def test_an_endpoint_that_rejects_the_key_stops_the_run_after_one_request(tmp_path):
    """Before: 401 on every call, 600 requests (3 x max_evaluations) until the engine gave up."""
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("llm-401", {}, seed=5, config_hash="x")
    body = ('{"error": {"message": "Incorrect API key provided: sk-x. You can find your API key at '
            'https://platform.openai.com/account/api-keys.", "type": "invalid_request_error", "param": null, '
            '"code": "invalid_api_key"}}')
    with FakeLLMServer(Cassette([{"status": 401, "raw": body, "repeat": True}])) as server:
        model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY")
        client = LLMClient([model], timeout_s=5, max_attempts=1, budget=Budget(1.0),
                           sink=lambda call: store.add_llm_call(run_id, **call.to_row()))
        mut = LLMMutator(client, [model], StoreContextProvider(store, run_id, gpu_name="H200"))
        rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                          harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
        try:
            eng = Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK], seeds={},
                         settings=EngineSettings(islands_per_task=1, max_evaluations=200, in_flight=1,
                                                 confirm_champions=False),
                         rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK))
            summary = eng.run()
        finally:
            rt.shutdown()
        assert len(server.requests) == 1
    assert "model 'fake' stopped" in summary.stop_reason and "[fatal:auth]" in summary.stop_reason
    store.close()


def test_a_seeded_run_repairs_a_broken_optimize_child(tmp_path):
    """The CuTeGen loop in a seeded run: an optimize child that fails to compile is offered
    for repair as it is recorded and repaired before any new optimize prompt; lineage reads
    seed -> broken -> repaired (before, repair happened only on islands with no correct member,
    which a seeded run never has)."""
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("llm-seeded-repair", {}, seed=5, config_hash="x")
    seed_src = (Path(__file__).parent / "fixtures" / "llm" / "tiny_kernel.cu").read_text()
    with FakeLLMServer(Cassette.load(Path(__file__).parent / "fixtures" / "llm" / "seeded_repair.jsonl")) as server:
        model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY",
                          price_in_per_mtok=1.0, price_out_per_mtok=2.0)
        client = LLMClient([model], timeout_s=5, max_attempts=1, backoff_base_s=0.01,
                           budget=Budget(1.0), sink=lambda call: store.add_llm_call(run_id, **call.to_row()))
        mut = LLMMutator(client, [model], StoreContextProvider(store, run_id, gpu_name="H200"))
        rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                          harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
        try:
            eng = Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK],
                         seeds={TASK: (seed_src, {"BLOCK": "128"})},
                         settings=EngineSettings(islands_per_task=1, max_evaluations=3, in_flight=1,
                                                 confirm_champions=False),
                         rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK))
            eng.run()
        finally:
            rt.shutdown()
    (s_id, s_par, s_op, s_st, _), (b_id, b_par, _b_op, b_st, _), (r_id, r_par, _r_op, r_st, _) = \
        _lineage(store, run_id)
    assert (s_par, s_op, s_st) == ((), "seed", "ok")
    assert (b_par, b_st) == ((s_id,), "compile_error")
    assert (r_par, r_st) == ((b_id,), "ok"), "the repair's parent is the broken child"
    kinds = [c["kind"] for c in store.llm_calls(run_id)]
    assert kinds == ["optimize", "repair"], kinds
    repaired = store.get_candidate(r_id).source
    assert "__launch_bounds__(BLOCK) tiny_copy_kernel" in repaired and "* BLOCK + threadIdx.x" in repaired
    repair_prompt = json.loads(store.llm_calls(run_id)[1]["prompt"])[-1]["content"]
    assert 'identifier "BLOK" is undefined' in repair_prompt
    store.close()
