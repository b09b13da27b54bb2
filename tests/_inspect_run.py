"""A synthetic, fully populated run for the inspection tests (status, lineage, report, export).

``build_run(path, cache_dir)`` writes a lineage database with one run over two tasks:

kb19_relu (fp32 ReLU; real, compilable seed source so export can build it):
    seed (gen 0, island 0, 1.00)
      -> knobs child: BLOCK (seed default) -> 512 (gen 1, island 0, 1.20, profiled)
          -> llm child: source edit + CACHE_HINT (gen 2, island 1, 1.50, profiled) = champion (confirmed)
          -> crossover child of (knobs child, seed): incorrect at correctness
      -> policy-rejected child, compile_error child, timeout child
kb21_sigmoid: a seed that fails correctness only (so export must skip the task).

Plus two LLM calls (0.25 + 0.5 USD; the second one produced the llm child), progress events,
a finish event and the champion row. Returns a :class:`Built` with the ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evo.core.records import Candidate, Evaluation, StageResult, Status
from evo.store import Store
from evo.tasks.seeds import seed_params, seed_source

TASK = "kb19_relu"
BAD_TASK = "kb21_sigmoid"
ENV = {"gpu": "NVIDIA H200", "driver": "570.86.15", "cuda": "12.8", "torch": "2.11.0", "python": "3.12.3",
       "capability": "9.0", "protocol": "1"}


@dataclass(frozen=True)
class Built:
    db: Path
    run_id: str
    seed: Candidate
    knobs: Candidate
    llm: Candidate
    cross: Candidate
    rejected: Candidate
    broken: Candidate
    slow: Candidate
    bad_seed: Candidate


def _ok(name: str, **metrics) -> StageResult:
    return StageResult(name, Status.OK, metrics=metrics, seconds=0.5)


def _timing(median_ms: float, ref_ms: float = 3.3) -> StageResult:
    row = {"shape": {"R": 4096, "C": 393216}, "median_ms": median_ms, "iqr_ms": 0.004,
           "ref_median_ms": ref_ms, "ref_iqr_ms": 0.005, "speedup": ref_ms / median_ms, "sol_ms": 3.0,
           "pct_sol": 100 * 3.0 / median_ms, "samples_ms": [median_ms] * 5, "ref_samples_ms": [ref_ms] * 5}
    return StageResult("timing", Status.OK, metrics={"shapes": [row], "fitness": ref_ms / median_ms,
                                                      "reps": 50, "warmup": 10, "flush_mb": 256}, seconds=4.0)


def _passed(fitness: float, median_ms: float) -> tuple[tuple[StageResult, ...], float]:
    return (_ok("policy"), _ok("compile", registers=22, smem_bytes=0, spill_stores=0, spill_loads=0),
            _ok("correctness"), _timing(median_ms, median_ms * fitness)), fitness


def build_run(path: Path, cache_dir: Path, *, finished: bool = True) -> Built:
    src = seed_source(TASK)
    params = seed_params(TASK)
    assert params.get("BLOCK") != "512", "the tests expect the knobs child to change BLOCK to 512"
    with Store(path) as store:
        rid = store.create_run("inspect-test", {"compile": {"arch": "sm_90a", "cache_dir": str(cache_dir)},
                                                "tasks": {"names": [TASK, BAD_TASK]}},
                               seed=7, config_hash="cfg-hash-123")
        seed = Candidate.create(TASK, src, params, operator="seed")
        knobs = Candidate.create(TASK, src, {**params, "BLOCK": "512"}, parents=(seed.id,), operator="knobs",
                                 generation=1, island=0)
        llm_src = src.replace("namespace evo_seed {", "// evolved: comment-only change for the test\nnamespace evo_seed {", 1)
        assert llm_src != src
        llm = Candidate.create(TASK, llm_src, {**params, "BLOCK": "512"}, parents=(knobs.id,),
                               operator="llm:test-model", generation=2, island=1, notes="tighter tail")
        cross = Candidate.create(TASK, src + "\n// x\n", {**params, "BLOCK": "1024"}, parents=(knobs.id, seed.id),
                                 operator="crossover", generation=2, island=0)
        rejected = Candidate.create(TASK, src + "\n// system()\n", params, parents=(seed.id,), operator="knobs",
                                    generation=1)
        broken = Candidate.create(TASK, src + "\nint broken(\n", params, parents=(seed.id,), operator="knobs",
                                  generation=1)
        slow = Candidate.create(TASK, src + "\n// slow\n", params, parents=(seed.id,), operator="knobs", generation=1)
        bad_seed = Candidate.create(BAD_TASK, seed_source(BAD_TASK), seed_params(BAD_TASK), operator="seed")
        for c in (seed, knobs, llm, cross, rejected, broken, slow, bad_seed):
            store.add_candidate(rid, c)

        def add(c: Candidate, stages, fitness=None) -> None:
            store.add_evaluation(rid, Evaluation(c.id, tuple(stages), fitness, gpu="NVIDIA H200", env=ENV))

        st, f = _passed(1.0, 3.3)
        add(seed, st, f)
        store.log_event(rid, "progress", {"evaluations": 1, "correct": 1, "evals_per_min": 2.0, "gpu_busy": 0.5})
        st, f = _passed(1.2, 2.75)
        add(knobs, st, f)
        add(rejected, [StageResult("policy", Status.REJECTED, "policy rule host-call: system() at line 3"),
                       StageResult("compile", Status.SKIPPED, "not run")])
        add(broken, [_ok("policy"), StageResult("compile", Status.COMPILE_ERROR, "nvcc failed (exit 2): error",
                                                 artifacts={"errors": "candidate.cu(400): error: expected a ')'"})])
        add(slow, [_ok("policy"), _ok("compile"), _ok("correctness"),
                   StageResult("timing", Status.TIMEOUT, "harness timed out after 300 s")])
        st, f = _passed(1.5, 2.2)
        add(llm, st, f)
        add(cross, [_ok("policy"), _ok("compile"), StageResult("correctness", Status.INCORRECT,
                                                               "shape {'R': 129, 'C': 1031}: max error 1.0")])
        add(bad_seed, [_ok("policy"), _ok("compile"), StageResult("correctness", Status.INCORRECT, "wrong")])
        store.add_profile(knobs.id, shape="R=4096,C=393216", gpu="H200",
                          metrics={"dram_throughput_pct": 80.0, "registers": 22, "stalls": {"long_scoreboard": 40.0}})
        store.add_profile(llm.id, shape="R=4096,C=393216", gpu="H200",
                          metrics={"dram_throughput_pct": 91.5, "registers": 22, "stalls": {"long_scoreboard": 25.0}})
        store.add_llm_call(rid, prompt="optimize this kernel", response="<<<SEARCH ... >>>", model="test-model",
                           kind="optimize", tokens_in=1200, tokens_out=300, cost=0.25, latency_s=3.2)
        store.add_llm_call(rid, prompt="PROMPT-FOR-LLM-CHILD", response="RESPONSE-FOR-LLM-CHILD",
                           model="test-model", kind="optimize", tokens_in=1500, tokens_out=400, cost=0.5,
                           latency_s=4.1, candidate_id=llm.id)
        store.log_event(rid, "progress", {"evaluations": 8, "correct": 3, "evals_per_min": 12.5, "gpu_busy": 0.875,
                                          "in_flight": 2, "compile_queue": 1, "gpu_queue": 0})
        store.set_champion(rid, TASK, llm.id, 1.5, {"confirmed": True, "fitness_confirmed": 1.48, "ratio": 0.987})
        if finished:
            store.log_event(rid, "finish", {"reason": "max_evaluations", "evaluations": 8, "correct": 3,
                                            "evals_per_min": 12.0, "gpu_busy": 0.9})
            store.set_run_status(rid, "finished")
    return Built(Path(path), rid, seed, knobs, llm, cross, rejected, broken, slow, bad_seed)
