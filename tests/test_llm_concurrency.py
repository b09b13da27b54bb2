"""Proposals off the engine's loop (issue 31): a whole search on the in-process runtime
(evo.engine.local_runtime, one fake GPU) with fake compile/GPU stages, driven by the fake
endpoint over real HTTP (127.0.0.1) answering every call after 2 s.

Before, ``mutator.propose`` ran in the engine's loop: 8 calls of 2 s at concurrency 4 finished
at 0, 2.1, 4.1 ... 14.4 s, and no GPU result was collected while a call was on the wire.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from evaluators.base import CompileSettings, HarnessSettings  # noqa: E402
from evo.engine.engine import Engine, EngineSettings  # noqa: E402
from evo.engine.llm_context import StoreContextProvider  # noqa: E402
from evo.core.records import StageResult, Status  # noqa: E402
from evo.engine.local_runtime import LocalRuntime  # noqa: E402
from evo.engine.seams import Stages  # noqa: E402
from evo.store import Store  # noqa: E402
from fakes import stages as fake  # noqa: E402
from mutators import base as mb  # noqa: E402
from mutators.llm.client.budget import Budget  # noqa: E402
from mutators.llm.replay.cassette import Cassette, ReplayClient  # noqa: E402
from mutators.llm.client.chat import LLMClient  # noqa: E402
from mutators.llm.replay.fake_server import FakeLLMServer  # noqa: E402
from mutators.llm.mutator import LLMMutator  # noqa: E402
from mutators.llm.client.model_spec import ModelSpec  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
TASK = "kb19_relu"
DELAY_S = 2.0


def variant(k: int) -> str:
    """An optimize answer that applies to the seed and to any of its descendants."""
    return (f"Variant {k}.\n\n<<<<<<< SEARCH\n#include \"evo_abi.h\"\n=======\n#include \"evo_abi.h\"\n"
            f"#define EVO_VARIANT_{k} 1\n>>>>>>> REPLACE\n")



def test_the_mutators_concurrency_is_the_models_within_the_clients_cap():
    m = ModelSpec("a", "http://127.0.0.1:9/v1", "x", key_env="EVO_TEST_NO_KEY", concurrency=2)
    n = ModelSpec("b", "http://127.0.0.1:9/v1", "y", key_env="EVO_TEST_NO_KEY")
    provider = None
    assert LLMMutator(None, [m], provider).concurrency == 1  # default: proposals on the engine's loop
    assert LLMMutator(None, [m], provider, concurrency=4).concurrency == 2
    assert LLMMutator(None, [m, n], provider, concurrency=4).concurrency == 4
    assert mb.concurrency(LLMMutator(None, [m, n], provider, concurrency=3)) == 3
    assert mb.concurrency(object()) == 1


def test_eight_calls_of_2s_at_concurrency_4_overlap_and_gpu_results_are_collected_meanwhile(tmp_path):
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("llm-concurrent", {}, seed=5, config_hash="x")
    seed_src = (FIXTURES / "tiny_kernel.cu").read_text()
    cassette = Cassette([{"response": variant(k), "delay_s": DELAY_S, "tokens_in": 100, "tokens_out": 40}
                         for k in range(1, 9)])
    records: list[tuple[float, int]] = []
    with FakeLLMServer(cassette) as server:
        model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY",
                          price_in_per_mtok=1.0, price_out_per_mtok=2.0)
        client = LLMClient([model], timeout_s=10, max_attempts=1, concurrency=4, budget=Budget(1.0),
                           sink=lambda call: store.add_llm_call(run_id, **call.to_row()))
        mut = LLMMutator(client, [model], StoreContextProvider(store, run_id, gpu_name="H200"), concurrency=4)
        rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                          harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
        try:
            eng = Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK],
                         seeds={TASK: (seed_src, {"BLOCK": "128"})},
                         settings=EngineSettings(islands_per_task=1, max_evaluations=9, in_flight=8,
                                                 confirm_champions=False),
                         rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK),
                         on_progress=lambda p: records.append((time.monotonic(), p.evaluations)))
            summary = eng.run()
        finally:
            rt.shutdown()
        starts = sorted(r["time"] for r in server.requests)
    assert summary.evaluations == 9 and len(starts) == 8
    span = starts[-1] + DELAY_S - starts[0]
    assert span < 5.0, f"8 calls of {DELAY_S} s at concurrency 4 took {span:.1f} s (serial: 16 s)"
    assert sum(1 for t in starts if t - starts[0] < 0.5) == 4, "the first four calls go out together"
    evaluated_at = [t for (t, n), (_, prev) in zip(records[1:], records) if n > prev]
    during_calls = [t for t in evaluated_at if any(s <= t < s + DELAY_S for s in starts)]
    assert len(during_calls) >= 4, "the first wave's children are evaluated while the second wave's calls are on " \
                                   f"the wire (evaluations at {evaluated_at}, calls from {starts})"
    calls = store.llm_calls(run_id)
    assert len(calls) == 8 and all(c["error"] is None for c in calls)
    lineage = [(c.parents, store.get_evaluation(c.id, run_id).status.value) for c in store.candidates(run_id)]
    assert len(lineage) == 9 and all(st == "ok" for _, st in lineage)
    store.close()


def typo(k: int) -> str:
    """Variant ``k`` with a compile error (fixed by FIX)."""
    return variant(k) + ("\n<<<<<<< SEARCH\n  int64_t i = int64_t(blockIdx.x) * BLOCK + threadIdx.x;\n=======\n"
                         "  int64_t i = int64_t(blockIdx.x) * BLOK + threadIdx.x;\n>>>>>>> REPLACE\n")
FIX = ("The macro name is misspelled.\n\n<<<<<<< SEARCH\n  int64_t i = int64_t(blockIdx.x) * BLOK + threadIdx.x;\n"
       "=======\n  int64_t i = int64_t(blockIdx.x) * BLOCK + threadIdx.x;\n>>>>>>> REPLACE\n")


def _ordered_search(store, run_id, client, model):
    """2 islands, 4 in flight, 4 concurrent proposals, ordered; every attempt logged as the CLI logs it."""
    def log_attempt(rec):
        store.log_event(run_id, "llm_attempt", {"attempt_key": rec.attempt_key, "prompt_hash": rec.prompt_hash,
                                                "ok": rec.ok, "kind": rec.kind})
    mut = LLMMutator(client, [model], StoreContextProvider(store, run_id, gpu_name="H200"), attempt_sink=log_attempt,
                     concurrency=4)
    mut.max_failed_attempts = 50
    rt = LocalRuntime(stages=Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                      harness_settings=HarnessSettings(), num_gpus=1, num_cpus=2).start()
    try:
        eng = Engine(store=store, runtime=rt, mutator=mut, run_id=run_id, tasks=[TASK],
                     seeds={TASK: ((FIXTURES / "tiny_kernel.cu").read_text(), {"BLOCK": "128"})},
                     settings=EngineSettings(islands_per_task=2, max_evaluations=14, in_flight=4, migration_every=5,
                                             migration_count=1, ordered=True, confirm_champions=False),
                     rng=random.Random(5), policy=lambda s: StageResult("policy", Status.OK))
        return eng.run()
    finally:
        rt.shutdown()


def _lineage(store, run_id):
    return sorted((c.id, c.parents, c.island, store.get_evaluation(c.id, run_id).status.value)
                  for c in store.candidates(run_id))


def test_an_ordered_run_with_2_islands_and_4_in_flight_replays_identically(tmp_path):
    """Before: answers were replayed by prompt hash, and prompts (attempt outcomes, other
    islands' kernels) and parent choices depended on which result came first: 3 of 3 replays
    of such a run raised ReplayMiss as a traceback."""
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("recorded", {}, seed=5, config_hash="x")
    rng = random.Random(7)  # answers arrive out of order: delays of 0 to 0.4 s
    entries = [{"response": typo(k) if k in (3, 9) else variant(k), "delay_s": rng.choice([0.0, 0.1, 0.4])}
               for k in range(1, 30)]
    entries += [{"match": "[kind:repair]", "response": FIX, "repeat": True}]
    with FakeLLMServer(Cassette(entries)) as server:
        model = ModelSpec("fake", server.base_url, "fake-coder", key_env="EVO_TEST_NO_KEY")
        client = LLMClient([model], timeout_s=10, max_attempts=1, concurrency=4,
                           sink=lambda call: store.add_llm_call(run_id, **call.to_row()))
        recorded = _ordered_search(store, run_id, client, model)
    assert recorded.evaluations == 14
    lineage = _lineage(store, run_id)
    statuses = [st for *_, st in lineage]
    assert "compile_error" in statuses and len({isl for _, _, isl, _ in lineage}) == 3  # seed (-1) + 2 islands
    repaired = [c for c in store.candidates(run_id) if c.parents and store.get_evaluation(c.parents[0], run_id)
                and store.get_evaluation(c.parents[0], run_id).status.value == "compile_error"]
    assert repaired, "a broken child was repaired"
    calls = store.llm_calls(run_id)
    attempts = [e["payload"] for e in store.events(run_id, "llm_attempt")]

    offline = ModelSpec("fake", "http://127.0.0.1:9/v1", "fake-coder", key_env="EVO_TEST_NO_KEY")
    for i in range(3):
        rid = store.create_run(f"replay{i}", {}, seed=5, config_hash="x")
        summary = _ordered_search(store, rid, ReplayClient.from_run(calls, attempts), offline)
        assert "replay" not in summary.stop_reason, summary.stop_reason
        assert _lineage(store, rid) == lineage, f"replay {i} differs from the recorded run"

    # A recording cut short: the run ends with one line naming the missing attempt, no traceback.
    rid = store.create_run("replay-cut", {}, seed=5, config_hash="x")
    summary = _ordered_search(store, rid, ReplayClient.from_run(calls[:5], attempts), offline)
    assert summary.stop_reason.startswith("mutator stopped: replay has no recorded answer for attempt ")
    assert "\n" not in summary.stop_reason
    store.close()
