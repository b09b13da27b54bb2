"""Engine contract with fake (simulated) compile and GPU stages, on the in-process runtime
(evo.engine.local_runtime: threads, two fake GPUs, plain islands): no Ray instance starts.

Two of these checks (``check_*``) also run end to end on a real local Ray instance, in
tests/test_engine_on_ray.py (marked ``ray``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evo.engine.engine import Engine, EngineSettings
from evo.engine.local_runtime import LocalRuntime
from evo.core.records import StageResult, Status
from evo.engine.seams import Stages
from evo.store import Store
from fakes import stages as fake

TASKS = ["synthetic_a", "synthetic_b"]


def ok_policy(source: str) -> StageResult:
    return StageResult("policy", Status.OK)


def _engine(store, run_id, rt, budget=40, seed=0, **kw):
    from mutators.knobs import KnobsMutator

    settings = EngineSettings(islands_per_task=2, population_size=8, max_evaluations=budget,
                              max_wall_seconds=120, migration_every=10, migration_count=1,
                              confirm_champions=kw.pop("confirm", True))
    return Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id, tasks=TASKS,
                  seeds={t: (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"}) for t in TASKS},
                  settings=settings, rng=random.Random(seed), policy=ok_policy, **kw)


_RUNTIMES: list = []


@pytest.fixture(autouse=True)
def _shutdown_runtimes():
    """Every runtime a test started gives its GPU actors (or threads) back when the test ends:
    on Ray the module shares one instance with 2 GPUs, and actors left alive (an engine kept by
    a reference cycle keeps its runtime's handles) would hold them, so the next test's actors
    never start."""
    yield
    while _RUNTIMES:
        _RUNTIMES.pop().shutdown()


def _runtime(stages: Stages | None = None, on: str = "local"):
    """A runtime of kind ``on`` (``local``: in-process, two fake GPUs; ``ray``: the Ray
    runtime, on the Ray instance the caller started), shut down when the test ends."""
    stages = stages or Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False)
    if on == "ray":
        from evo.engine.runtime import Runtime

        rt = Runtime(stages=stages, compile_settings=CompileSettings(), harness_settings=HarnessSettings())
    else:
        rt = LocalRuntime(stages=stages, compile_settings=CompileSettings(), harness_settings=HarnessSettings(),
                          num_gpus=2, num_cpus=2)
    _RUNTIMES.append(rt)
    return rt


def test_search_records_everything_and_improves_on_the_seed(tmp_path):
    check_search_records_everything(tmp_path)


def check_search_records_everything(tmp_path, on: str = "local"):
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("engine-test", {}, seed=0, config_hash="x")
    rt = _runtime(on=on).start()
    assert rt.n_gpus == 2
    summary = _engine(store, run_id, rt, budget=40).run()
    assert summary.evaluations == 40
    cands = store.candidates(run_id)
    assert len(cands) == 40
    evs = {c.id: store.get_evaluation(c.id, run_id) for c in cands}
    assert all(ev is not None for ev in evs.values()), "every proposed candidate is evaluated"
    ids = {c.id for c in cands}
    for c in cands:
        assert set(c.parents) <= ids, "lineage is whole: every parent is in the run"
    seed_fit = fake.fitness_of({"TILE": "32", "STAGES": "2", "VEC": "1"})
    for task in TASKS:
        assert summary.best[task]["fitness"] > seed_fit
    failures = Counter(ev.failed_stage.stage for ev in evs.values() if ev.failed_stage)
    assert set(failures) <= {"compile", "correctness"}
    assert summary.gpu_busy > 0
    # GPU work went to both evaluator actors
    gpu_ids = {ev.env.get("gpu_ids") for ev in evs.values() if ev.env}
    assert len(gpu_ids) == 2, gpu_ids
    champs = store.champions(run_id)
    assert {c["task"] for c in champs} == set(TASKS)
    seeds = {c.task: c.id for c in cands if c.operator == "seed"}
    for ch in champs:  # the engine's own seed is what the champion's gain is measured against
        assert ch["gain"] is not None and ch["gain"]["baseline"] == seeds[ch["task"]], ch
    kinds = {e["kind"] for e in store.events(run_id)}
    assert {"progress", "finish", "new_best"} <= kinds
    store.close()


def test_in_flight_is_bounded_by_back_pressure(tmp_path):
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("bp", {}, seed=1, config_hash="x")
    rt = _runtime().start()
    seen = []
    eng = _engine(store, run_id, rt, budget=24, seed=1, confirm=False,
                  on_progress=lambda p: seen.append((p.in_flight, eng.max_inflight)))
    eng.run()
    # the bound follows the measured rates (evo.engine.inflight), so it is read at every step
    assert seen and all(n <= cap for n, cap in seen), seen
    store.close()


DRIVER = textwrap.dedent('''
    import random, sys
    sys.path.insert(0, {tests!r})
    from fakes import stages as fake
    from evo.store import Store
    from evo.engine.seams import Stages
    from evo.engine.engine import Engine, EngineSettings
    from evaluators.base import CompileSettings, HarnessSettings
    from evo.core.records import StageResult, Status
    from mutators.knobs import KnobsMutator
    store = Store({db!r})
    run_id = store.create_run("killed", {{}}, seed=3, config_hash="x")
    print(run_id, flush=True)
    stages = Stages(fake.fake_compile, fake.fake_evaluate, evaluate_concurrent=False)
    {runtime}
    s = EngineSettings(islands_per_task=2, population_size=8, max_evaluations=400, max_wall_seconds=300,
                       confirm_champions=False)
    Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 2), run_id=run_id, tasks=["synthetic_a"],
           seeds={{"synthetic_a": (fake.SOURCE, {{"TILE": "32", "STAGES": "2", "VEC": "1"}})}},
           settings=s, rng=random.Random(3), policy=lambda src: StageResult("policy", Status.OK)).run()
''')


#: the killed driver's runtime, per kind
DRIVER_RUNTIME = {
    "local": "from evo.engine.local_runtime import LocalRuntime; rt = LocalRuntime(stages=stages, "
             "compile_settings=CompileSettings(), harness_settings=HarnessSettings(), num_gpus=2, num_cpus=2).start()",
    "ray": "import ray, ray.cloudpickle as cp; cp.register_pickle_by_value(fake); "
           "ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False); "
           "from evo.engine.runtime import Runtime; rt = Runtime(stages=stages, compile_settings=CompileSettings(), "
           "harness_settings=HarnessSettings()).start()",
}


def test_resume_after_sigkill_evaluates_nothing_twice(tmp_path):
    check_resume_after_sigkill(tmp_path)


def check_resume_after_sigkill(tmp_path, on: str = "local"):
    """A driver killed by SIGKILL mid-run (on runtime ``on``), then resumed here: nothing
    evaluated before the kill is evaluated again, and the lineage stays whole."""
    db = tmp_path / "evo.db"
    log = tmp_path / "evaluated.log"
    env = dict(os.environ, EVO_FAKE_LOG=str(log), EVO_FAKE_GPU_S="0.1")
    script = DRIVER.format(tests=os.path.dirname(__file__), db=str(db), runtime=DRIVER_RUNTIME[on])
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                            start_new_session=True, text=True)
    run_id = proc.stdout.readline().strip()
    deadline = time.time() + 120
    reader = None
    while time.time() < deadline:
        time.sleep(0.5)
        if db.exists():
            reader = reader or Store.open_reader(db)
            if len(reader.evaluated_ids(run_id)) >= 15:
                break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if reader:
        reader.close()
    with Store(db) as store:
        before = store.evaluated_ids(run_id)
        n_cands = len(store.candidates(run_id))
    assert len(before) >= 15, "the killed driver recorded evaluations"
    log.write_text("")  # from now on, log only what the resumed search evaluates
    os.environ["EVO_FAKE_LOG"] = str(log)
    try:
        store = Store(db)
        rt = _runtime(on=on).start()
        eng = Engine(store=store, runtime=rt, mutator=__import__("mutators.knobs").knobs.KnobsMutator(0.3, 2),
                     run_id=run_id, tasks=["synthetic_a"],
                     seeds={"synthetic_a": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})},
                     settings=EngineSettings(islands_per_task=2, population_size=8,
                                             max_evaluations=len(before) + 10, confirm_champions=False),
                     rng=random.Random(4), policy=ok_policy)
        eng.run(resume=True)
    finally:
        os.environ.pop("EVO_FAKE_LOG", None)
    again = set(log.read_text().split())
    assert not (again & before), "a candidate evaluated before the kill was evaluated again"
    after = store.evaluated_ids(run_id)
    assert before <= after and len(after) >= len(before) + 10 - 1
    cands = store.candidates(run_id)
    assert len(cands) >= n_cands
    ids = {c.id for c in cands}
    assert all(set(c.parents) <= ids for c in cands), "lineage stays whole"
    assert all(store.get_evaluation(c.id, run_id) is not None for c in cands)
    store.close()


def test_a_mutator_that_reads_no_profile_gets_its_champion_profiled_before_confirmation(tmp_path):
    """The knobs mutator reads fitness only: no survivor is profiled while the run searches;
    the champion is profiled once per benchmark shape as the run ends, before its
    confirmation (which compares the profile's ncu time with the re-timing where both exist:
    tests/test_survivors_noise.py)."""
    from types import SimpleNamespace

    from evaluators.profile import ProfileSettings
    from mutators.knobs import KnobsMutator

    synthetic = SimpleNamespace(get=lambda name: SimpleNamespace(bench_shapes=1, shapes=({"N": 1},)))
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("prof", {}, seed=2, config_hash="x")
    rt = _runtime(Stages(fake.fake_compile, fake.fake_evaluate, fake.fake_profile, evaluate_concurrent=False)).start()
    settings = EngineSettings(islands_per_task=1, population_size=8, max_evaluations=12, max_wall_seconds=120,
                              confirm_champions=True, profile=ProfileSettings(enabled=True, top_k=3, cache_dir=""))
    eng = Engine(store=store, runtime=rt, mutator=KnobsMutator(0.0, 1), run_id=run_id, tasks=["synthetic_a"],
                 seeds={"synthetic_a": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})},
                 settings=settings, rng=random.Random(2), policy=ok_policy, task_registry=synthetic)
    eng.run()
    events = store.events(run_id)
    profiled = [e["payload"]["id"] for e in events if e["kind"] == "profile"]
    (champ,) = store.champions(run_id)
    assert profiled == [champ["candidate_id"]], (profiled, champ)
    kinds = [e["kind"] for e in events]
    last_best = max(i for i, k in enumerate(kinds) if k == "new_best")
    assert last_best < kinds.index("profile") < kinds.index("champion"), kinds
    store.close()


def test_profiling_and_tuning_through_the_engine(tmp_path):
    """Delayed profiling of top-k members and an Optuna study over a survivor's tunables,
    through the real engine: studies are opened, trials flow through the same compile
    pool and GPU actors, constraint violations never compile, the best trial (operator
    optuna) beats its parent, and profiles land in the store."""
    from types import SimpleNamespace

    from evaluators.profile import ProfileSettings
    from evo.tuning.tuning_settings import TuningSettings

    synthetic = SimpleNamespace(get=lambda name: SimpleNamespace(bench_shapes=1, shapes=({"N": 1},)))
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("tune", {}, seed=2, config_hash="x")
    rt = _runtime(Stages(fake.fake_compile, fake.fake_evaluate, fake.fake_profile, evaluate_concurrent=False)).start()
    from mutators.knobs import KnobsMutator

    settings = EngineSettings(islands_per_task=1, population_size=8, max_evaluations=40, max_wall_seconds=120,
                              confirm_champions=False,
                              profile=ProfileSettings(enabled=True, top_k=1, cache_dir=""),
                              tuning=TuningSettings(enabled=True, trials_per_survivor=8, top_k=1),
                              tuning_storage=str(tmp_path / "studies.journal"))
    class ReadingKnobs(KnobsMutator):
        """Knobs whose proposals would read profiles (as an LLM's prompts do)."""

        reads_profiles = True

    eng = Engine(store=store, runtime=rt, mutator=ReadingKnobs(0.0, 1), run_id=run_id, tasks=["synthetic_a"],
                 seeds={"synthetic_a": (fake.SOURCE, {"TILE": "32", "STAGES": "2", "VEC": "1"})},
                 settings=settings, rng=random.Random(2), policy=ok_policy, task_registry=synthetic)
    eng.run()
    trials = store.tuning_trials(run_id)
    assert trials, ("a tuning study ran", [e["kind"] for e in store.events(run_id)][:50])
    events = store.events(run_id)
    starts = [e for e in events if e["kind"] == "tuning_start"]
    assert starts and trials[0]["parent_id"] in {s["payload"]["parent"] for s in starts}  # studies record their known points at once
    cands = {c.id: c for c in store.candidates(run_id)}
    optuna_children = [c for c in cands.values() if c.operator == "optuna"]
    assert optuna_children and all(c.parents == (trials[0]["parent_id"],) for c in optuna_children
                                   if c.parents[0] == trials[0]["parent_id"])
    from evo.core.tunables import violated_constraints

    assert not any(violated_constraints(c.source, c.params_dict) for c in optuna_children), \
        "constraint violations never reach compile"
    parent_fit = starts[0]["payload"]["fitness"]
    best = max((store.get_evaluation(c.id, run_id).fitness or 0) for c in optuna_children)
    assert best > parent_fit, "the best trial beat its parent"
    profiled = [e for e in events if e["kind"] == "profile"]
    assert profiled and all(e["payload"]["status"] == "ok" for e in profiled)
    assert store.get_profile(profiled[0]["payload"]["id"]) is not None
    store.close()



def test_the_wall_clock_limit_leaves_what_is_not_on_a_gpu_pending_for_resume(tmp_path):
    """At the wall-clock limit the run ends once the GPUs' evaluations are in: what is still
    compiling or queued is not waited for (a run overshot its limit by its whole queue on an
    H100) but stays pending, and --resume evaluates it. A fake clock: the limit passes on the
    loop's first check, while the seeds are still compiling."""
    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("deadline", {}, seed=0, config_hash="x")
    rt = _runtime().start()
    ticks = iter([0.0] + [1e9] * 10_000)
    eng = _engine(store, run_id, rt, budget=20, confirm=False, clock=lambda: next(ticks))
    summary = eng.run()
    assert summary.stop_reason == "wall-clock limit reached" and summary.evaluations == 0
    cands = store.candidates(run_id)
    assert {c.operator for c in cands} == {"seed"} and len(cands) == len(TASKS)
    assert all(store.get_evaluation(c.id, run_id) is None for c in cands)
    (ev,) = [e for e in store.events(run_id) if e["kind"] == "deadline"]
    assert sorted(ev["payload"]["pending"]) == sorted(c.id for c in cands)
    resumed = _engine(store, run_id, rt, budget=20, confirm=False).run(resume=True)
    assert resumed.evaluations == 20
    assert all(store.get_evaluation(c.id, run_id) is not None for c in cands), "the pending seeds were evaluated"
    store.close()


def test_the_engine_feeds_pacing_each_task_s_latency_and_proposals(tmp_path):
    """evo.engine.pacing is told every compile's and GPU result's seconds with its task, and every
    proposal: a task whose compiles take longer shows the longer latency, and the proposals it
    counts are the run's mutation children."""
    import dataclasses

    from evo.core.records import Candidate

    def compile_by_task(candidate: Candidate, settings: CompileSettings):
        out = fake.fake_compile(candidate, settings)
        slow = 30.0 if candidate.task == TASKS[0] else 10.0
        return dataclasses.replace(out, result=dataclasses.replace(out.result, seconds=slow))

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("engine-test", {}, seed=0, config_hash="x")
    rt = _runtime(Stages(compile_by_task, fake.fake_evaluate, evaluate_concurrent=False)).start()
    engine = _engine(store, run_id, rt, budget=16, confirm=False)
    engine.run()
    latency = engine.pacing.latency()
    assert set(latency) == set(TASKS) and latency[TASKS[0]] > latency[TASKS[1]] + 15.0, latency
    children = [c for c in store.candidates(run_id) if c.operator != "seed"]
    assert sum(engine.pacing.proposals().values()) == len(children) > 0
    store.close()


def test_a_cache_hit_tells_the_meters_what_its_build_cost_not_its_read(tmp_path):
    """A compile read from the content cache takes no time, but the next children are new
    sources that must be built: the rate meter and pacing are told the build's stored nvcc
    seconds (a rerun with the same seed meets the cache first, and counting its hits as free
    made a 30 s GEMM the "fastest" task), and a hit that stored none tells them nothing."""
    import dataclasses

    from evo.core.records import Candidate

    def cached_by_task(candidate: Candidate, settings: CompileSettings):
        out = fake.fake_compile(candidate, settings)
        nvcc = {TASKS[0]: 30.0}.get(candidate.task)   # TASKS[1]'s cache entries stored no build time
        metrics = {**out.result.metrics, **({"nvcc_seconds": nvcc} if nvcc else {})}
        return dataclasses.replace(out, cached=True, result=dataclasses.replace(out.result, seconds=0.01,
                                                                                metrics=metrics))

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("engine-test", {}, seed=0, config_hash="x")
    rt = _runtime(Stages(cached_by_task, fake.fake_evaluate, evaluate_concurrent=False)).start()
    engine = _engine(store, run_id, rt, budget=12, confirm=False)
    engine.run()
    assert set(engine.pacing.latency()) == {TASKS[0]} and engine.pacing.latency()[TASKS[0]] >= 30.0
    assert engine.rates._compiles == sum(1 for c in store.candidates(run_id) if c.task == TASKS[0]) > 0
    assert engine.rates._compile_sum == 30.0 * engine.rates._compiles
    assert [e["kind"] for e in store.events(run_id)].count("first_compiled") == 1
    store.close()
