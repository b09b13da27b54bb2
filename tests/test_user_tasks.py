"""A user's own task end to end, on the CPU (issue 28): task files reach the judge, a failure
of ours stops the run once (status ``failed``, resumable, one clear line), the seed forms of a
user task, ``evo check`` argument checking, and exact integer/boolean outputs (the judge's
correctness trials).

The engine tests use a real local Ray and the real GPU actor; the GPU stage is a fake that
looks the task up the way the judge does, in the GPU actor's process (tests/fakes/harness_stages.py).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.harness_job import HarnessError
from evo.core.records import Candidate, Status

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "configs" / "examples"
MY_TASK = EXAMPLES / "my_task.py"
ARGMAX_TASK = EXAMPLES / "my_argmax_task.py"


# ----------------------------------------------------------------------------- the judge's task lookup


def test_task_files_from_the_settings_reach_the_gpu_stage_and_name_the_task():
    from fakes.harness_stages import isolated_evaluate

    hs = HarnessSettings(timeout_s=120, task_files=(str(MY_TASK),))
    ev = isolated_evaluate(Candidate.create("rownorm_l2", "x", {}), b"\x7fELF", hs)
    assert ev.correct and ev.env["task"] == "rownorm_l2" and ev.env["task_family"] == "user"


def test_a_task_the_judge_cannot_load_is_our_failure_with_the_fix():
    from evaluators.judge import Judge
    from evaluators.harness_job import HarnessJob

    hs = HarnessSettings(timeout_s=120)  # the task file is not passed
    judge = Judge(backend="host", start_runner=lambda **kw: pytest.fail("no runner before the task is known"))
    try:
        with pytest.raises(HarnessError) as e:
            judge.evaluate(HarnessJob(task="rownorm_l2", candidate_id="c" * 64, so_bytes=b"\x7fELF"), hs)
    finally:
        judge.close()
    assert e.value.kind == "task"
    line = e.value.one_line()
    assert "\n" not in line and "unknown task 'rownorm_l2' in the GPU process" in line
    assert "[tasks] files" in line and "evo tasks --task-file" in line


def test_the_judge_loads_task_files_and_siblings_in_a_fresh_process():
    code = textwrap.dedent(f"""
        from evaluators.judge.tasks import load_task as _load_task, TaskLoadError
        t = _load_task("rowargmax", [{str(ARGMAX_TASK)!r}])
        assert t.family == "user" and t.seed.endswith("my_argmax_seed.cu"), t
        try:
            _load_task("rowargmax_typo", [{str(ARGMAX_TASK)!r}])
        except TaskLoadError as e:
            assert "unknown task 'rowargmax_typo' in the GPU process" in str(e), e
        else:
            raise SystemExit("no error for an unknown task")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


# ----------------------------------------------------------------------------- engine

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    import ray.cloudpickle as cloudpickle

    from fakes import harness_stages, stages

    cloudpickle.register_pickle_by_value(stages)
    cloudpickle.register_pickle_by_value(harness_stages)
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _engine(store, run_id, rt, budget, **kw):
    from evo.engine.engine import Engine, EngineSettings
    from evo.core.records import StageResult
    from evo.engine.search import seeds_for
    from evo.tasks import BUILTIN_TASKS
    from mutators.knobs import KnobsMutator

    tasks = BUILTIN_TASKS.with_files([MY_TASK])
    settings = EngineSettings(islands_per_task=1, population_size=4, max_evaluations=budget, max_wall_seconds=300,
                              confirm_champions=kw.pop("confirm", True))
    return Engine(store=store, runtime=rt, mutator=KnobsMutator(0.3, 1), run_id=run_id, tasks=["rownorm_l2"],
                  seeds=seeds_for(["rownorm_l2"], "knobs", tasks), settings=settings, rng=random.Random(0),
                  policy=lambda src: StageResult("policy", Status.OK), task_registry=tasks, **kw)


def _runtime(evaluate, task_files=()):
    from evo.engine.runtime import Runtime
    from evo.engine.seams import Stages
    from fakes import stages as fake

    hs = HarnessSettings(timeout_s=120, task_files=task_files)
    return Runtime(stages=Stages(fake.fake_compile, evaluate, evaluate_concurrent=False), compile_settings=CompileSettings(),
                   harness_settings=hs).start()


def test_a_search_of_a_user_task_evaluates_and_confirms(local_ray, tmp_path):
    from evo.store import Store
    from fakes import harness_stages

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("user", {}, seed=0, config_hash="x")
    rt = _runtime(harness_stages.isolated_evaluate, (str(MY_TASK),))
    try:
        summary = _engine(store, run_id, rt, budget=3).run()
    finally:
        rt.shutdown()
    assert summary.evaluations == 3 and summary.correct == 3, summary
    evs = store.evaluations(run_id)
    assert {ev.env.get("task") for ev in evs} == {"rownorm_l2"}
    (champ,) = store.champions(run_id)
    assert champ["task"] == "rownorm_l2" and champ["confirmation"]["confirmed"] is True, champ
    assert store.get_run(run_id)["status"] == "finished"
    store.close()


def test_a_harness_failure_stops_the_run_once_and_the_run_resumes(local_ray, tmp_path):
    """The bug of issue 28: the task file never reached the GPU process. Now the first such
    failure stops the run (no retry storm), marks it failed with one line, and a resume
    with the cause fixed evaluates what was pending."""
    from evo.engine.engine import SearchFailed
    from evo.store import Store
    from fakes import harness_stages

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("user", {}, seed=0, config_hash="x")
    rt = _runtime(harness_stages.isolated_evaluate, ())  # task files missing: our failure
    try:
        with pytest.raises(SearchFailed) as e:
            _engine(store, run_id, rt, budget=6).run()
    finally:
        rt.shutdown()
    msg = str(e.value)
    assert "\n" not in msg
    assert "unknown task 'rownorm_l2' in the GPU process" in msg and "[tasks] files" in msg
    assert f"--resume {run_id}" in msg
    assert store.get_run(run_id)["status"] == "failed"
    (failed,) = store.events(run_id, "failed")
    assert failed["payload"]["pending"], failed
    assert store.evaluations(run_id) == []  # nothing charged to a candidate
    # fixed: resume with the task file and finish
    rt = _runtime(harness_stages.isolated_evaluate, (str(MY_TASK),))
    try:
        summary = _engine(store, run_id, rt, budget=6, confirm=False).run(resume=True)
    finally:
        rt.shutdown()
    assert summary.correct >= 1 and store.get_run(run_id)["status"] == "finished"
    store.close()


def test_repeated_evaluator_failures_trip_the_breaker(local_ray, tmp_path):
    from evo.engine.engine import BREAKER_THRESHOLD, SearchFailed
    from evo.store import Store
    from fakes import harness_stages

    store = Store(tmp_path / "evo.db")
    run_id = store.create_run("user", {}, seed=0, config_hash="x")
    rt = _runtime(harness_stages.raising_evaluate, (str(MY_TASK),))
    try:
        with pytest.raises(SearchFailed) as e:
            _engine(store, run_id, rt, budget=40).run()
    finally:
        rt.shutdown()
    assert f"{BREAKER_THRESHOLD} GPU evaluations in a row failed with ValueError" in str(e.value)
    assert "simulated bug in the GPU stage" in str(e.value)
    assert store.get_run(run_id)["status"] == "failed"
    store.close()


# ----------------------------------------------------------------------------- seeds


def _task_file(tmp_path: Path, name: str, seed_line: str) -> Path:
    body = textwrap.dedent(f'''
        import torch
        from evo.tasks import InputSpec, Task, TensorInputs, FP32_ELEMENTWISE

        def relu(x):
            return torch.relu(x)

        def flops(shape):
            return float(shape["N"])

        def nbytes(shape):
            return 8.0 * shape["N"]

        TASKS = [Task(name={name!r}, family="user", dtype="float32", description="relu",
                      reference=relu, make_inputs=TensorInputs((InputSpec(("N",)),), "float32"),
                      shapes=({{"N": 4096}},), tolerance=FP32_ELEMENTWISE, flops=flops, bytes=nbytes,
                      {seed_line})]
    ''')
    f = tmp_path / f"{name}.py"
    f.write_text(body)
    return f


def test_user_task_seed_forms(tmp_path):
    from evo.engine.search import SearchError, seed_for, seeds_for
    from evo.tasks import BUILTIN_TASKS
    from evo.tasks.seeds import seed_params, seed_source

    tasks = BUILTIN_TASKS.with_files([_task_file(tmp_path, "u_builtin_seed", 'seed="kb19_relu"'),
                                      _task_file(tmp_path, "u_no_seed", 'seed=""'),
                                      _task_file(tmp_path, "u_bad_seed", 'seed="no_such_seed"'), MY_TASK])
    assert seed_for("u_builtin_seed", tasks) == (seed_source("kb19_relu"), seed_params("kb19_relu"))
    assert seed_for("u_no_seed", tasks) is None
    assert "u_no_seed" not in seeds_for(["u_no_seed"], "llm", tasks)
    with pytest.raises(SearchError, match="has no seed kernel, and the knobs mutator only changes an existing"):
        seeds_for(["u_no_seed"], "knobs", tasks)
    with pytest.raises(SearchError, match="neither a .cu file nor a built-in seed"):
        seed_for("u_bad_seed", tasks)
    src, params = seed_for("rownorm_l2", tasks)
    assert "rownorm_l2_kernel" in src and params == {"BLOCK": "256"}
    with pytest.raises(KeyError, match="rownorm_l2"):
        seed_for("rownorm_l2")  # the built-in tasks alone do not know it


def test_dry_run_of_a_seedless_user_task_with_the_llm_mutator_says_genesis(tmp_path):
    from evo.config import parse_config
    from evo.engine.search import dry_run

    f = _task_file(tmp_path, "u_genesis", 'seed=""')
    cfg = parse_config({"tasks": {"files": [str(f)], "include": ["u_genesis"]},
                        "mutator": {"kind": "llm"},
                        "llm": {"models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "model": "x"}]}})
    rep = dry_run(cfg, probe=False)  # no endpoint listens there: a failed probe would stop it before the seeds
    (row,) = rep["seeds"]
    assert row["task"] == "u_genesis" and "genesis: the first kernel will be written by the model" in row["note"]


# ----------------------------------------------------------------------------- evo check


def _cli(*args: str, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "evo.cli", *args], capture_output=True, text=True,
                          cwd=str(cwd or REPO), timeout=300)


@pytest.mark.parametrize("params, expect", [
    (["NOPE=1"], "unknown tunable 'NOPE'; the kernel declares: BLOCK"),
    (["BLOCK=333"], "BLOCK = '333' is not allowed; choose one of {128, 256, 512, 1024}"),
])
def test_check_rejects_params_outside_the_declared_tunables(params, expect):
    args = ["check", str(EXAMPLES / "my_task_seed.cu"), "--task", "rownorm_l2", "--task-file", str(MY_TASK)]
    for p in params:
        args += ["--params", p]
    out = _cli(*args)
    assert out.returncode == 2  # the CLI's exit code for a usage error
    assert expect in out.stderr + out.stdout
    assert "Traceback" not in out.stderr and "compile" not in out.stdout  # nothing was built


def test_check_rejects_a_violated_constraint(tmp_path):
    k = tmp_path / "k.cu"
    k.write_text((EXAMPLES / "my_task_seed.cu").read_text().replace(
        "// @tunable BLOCK = 256 in {128, 256, 512, 1024}",
        "// @tunable BLOCK = 256 in {128, 256, 512, 1024}\n// @constraint BLOCK <= 512"))
    out = _cli("check", str(k), "--task", "rownorm_l2", "--task-file", str(MY_TASK), "--params", "BLOCK=1024")
    assert out.returncode == 2 and "constraint violated at line 12: BLOCK <= 512" in out.stderr + out.stdout


@pytest.mark.parametrize("content, expect", [(None, "task file not found"), ("def broken(:\n", "syntax error")])
def test_check_with_a_bad_task_file_gives_one_clean_line(tmp_path, content, expect):
    f = tmp_path / "tasks.py"
    if content is not None:
        f.write_text(content)
    out = _cli("check", str(EXAMPLES / "my_task_seed.cu"), "--task", "rownorm_l2", "--task-file", str(f))
    assert out.returncode == 2 and expect in out.stderr
    assert "Traceback" not in out.stderr


# ----------------------------------------------------------------------------- exact outputs


def _argmax_task(**kw):
    from evo.tasks import load_task_file

    (t,) = [t for t in load_task_file(ARGMAX_TASK) if t.name == "rowargmax"]
    from dataclasses import replace

    return replace(t, shapes=({"R": 33, "C": 257}, {"R": 2, "C": 5}), **kw)


def _run(task, kernel):
    """The judge's correctness trials of ``kernel`` (a Python function of inputs and outputs)."""
    from fakes.judge_trials import judge_correctness

    return judge_correctness(task, kernel, trials=3, seed=1)


def test_integer_outputs_are_compared_exactly():
    task = _argmax_task()
    good = _run(task, lambda ins, outs: outs[0].copy_(torch.argmax(ins[0], dim=1)))
    assert good.status is Status.OK, good.reason

    def lazy(ins, outs):  # leaves the last row unwritten (poison)
        outs[0][:-1].copy_(torch.argmax(ins[0][:-1], dim=1))

    bad = _run(task, lazy)
    assert bad.status is Status.INCORRECT and "exact match required" in bad.reason and "unwritten" in bad.reason

    def last_index(ins, outs):  # argmax from the right: differs on ties only
        x = ins[0]
        outs[0].copy_(x.shape[1] - 1 - torch.argmax(x.flip(1), dim=1))

    ties = _argmax_task(make_inputs=_tied_inputs)
    assert _run(ties, last_index).status is Status.INCORRECT  # torch breaks ties to the first index
    from evo.tasks import ArgExtremum

    lenient = _argmax_task(make_inputs=_tied_inputs, index_rule=ArgExtremum(dim=1))
    assert _run(lenient, last_index).status is Status.OK
    wrong = _run(lenient, lambda ins, outs: outs[0].copy_(torch.argmin(ins[0], dim=1)))
    assert wrong.status is Status.INCORRECT and "not the largest" in wrong.reason


def _tied_inputs(shape, gen, dist, device):
    x = torch.randint(0, 3, (shape["R"], shape["C"]), generator=gen, device=device).to(torch.float32)
    return (x,)


def test_boolean_outputs_catch_unwritten_elements():
    from evo.tasks.tolerance import check, check_deterministic

    ref = torch.tensor([True, False, True])
    from evaluators.judge.checks import poison_

    out = poison_(torch.empty(3, dtype=torch.bool))
    out[1] = False  # two elements unwritten
    ok, why, m = check(out, ref, None)
    assert not ok and m["n_mismatch"] == 2 and "unwritten" in why
    out[0], out[2] = True, True
    assert check(out, ref, None)[0]
    assert not check(out.to(torch.int64), ref, None)[0]  # dtype kept exactly
    again = poison_(torch.empty(3, dtype=torch.bool))
    assert not check_deterministic(out, again, None)[0]


def test_zero_dim_outputs_work_like_any_other():
    from evo.tasks import FP32_ELEMENTWISE
    from evo.tasks.tolerance import check

    ref = torch.tensor(2.5, dtype=torch.float64)
    assert check(torch.tensor(2.5, dtype=torch.float32), ref, FP32_ELEMENTWISE, dtype="float32")[0]
    ok, why, _ = check(torch.tensor(float("nan")), ref, FP32_ELEMENTWISE, dtype="float32")
    assert not ok and "non-finite" in why


# ----------------------------------------------------------------------------- export


def test_export_of_a_user_task_run_loads_its_task_file_and_keeps_integer_outputs(tmp_path):
    """`evo export` of a run of user tasks finds the tasks through the run's stored config
    (no --task-file), and an integer output stays int64 in the exported op and its check."""
    from evo.results.export import export
    from evo.core.records import Candidate, Evaluation, Operator, StageResult
    from evo.store import Store

    src = (EXAMPLES / "my_argmax_seed.cu").read_text()
    cand = Candidate.create("rowargmax", src, {"BLOCK": "256"}, operator=Operator.SEED)
    ev = Evaluation(cand.id, (StageResult("correctness", Status.OK),
                              StageResult("timing", Status.OK, metrics={"fitness": 1.1})), 1.1, gpu="NVIDIA H200")
    db = tmp_path / "evo.db"
    with Store(db) as store:
        rid = store.create_run("u", {"tasks": {"files": [str(ARGMAX_TASK)], "include": ["rowargmax"]}},
                               seed=0, config_hash="h")
        store.add_candidate(rid, cand)
        store.add_evaluation(rid, ev)
        store.set_champion(rid, "rowargmax", cand.id, 1.1, {"confirmed": True})
    # a fresh process: nothing registered rowargmax before the export
    code = textwrap.dedent(f"""
        from evo.results.export import export
        from evo.store import Store
        with Store.open_reader({str(db)!r}) as s:
            res = export(s, {rid!r}, {str(tmp_path / 'out')!r}, build=False)
        print(res.exported[0].directory)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    d = Path(out.stdout.strip().splitlines()[-1])
    assert "OUTPUT_DTYPES = ['int64']" in (d / "op.py").read_text()
    check = textwrap.dedent(f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("ref", {str(d / 'reference.py')!r})
        ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
        x = torch.randn(5, 7)
        want = ref.reference(x.double())
        assert ref.check(torch.argmax(x, dim=1), want) == (True, "ok")
        assert not ref.check(torch.argmin(x, dim=1), want)[0]
        assert not ref.check(torch.argmax(x, dim=1).float(), want)[0]
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-I", "-c", check], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_dry_run_of_user_tasks_in_another_directory_works_from_anywhere(tmp_path):
    """`evo search CONFIG --dry-run` with the task files next to the config, run from an
    unrelated working directory: both seeds go through policy and nvcc."""
    import shutil

    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("needs nvcc")
    out = _cli("search", str(EXAMPLES / "user_tasks.toml"), "--dry-run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for task in ("rownorm_l2", "rowargmax"):
        row = next(line for line in out.stdout.splitlines() if f" {task} " in line)
        assert row.count(" ok ") >= 2, row  # policy ok, compile ok
    assert "Traceback" not in out.stderr
