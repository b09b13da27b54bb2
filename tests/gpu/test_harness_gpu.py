"""The judge and its runner on a real GPU: a correct seed, every exploit fixture, and faults followed by a
healthy candidate on the same GPU. Fixtures live in tests/fixtures/bad/ (each names its
exploit and expected verdict in its header); all target kb19_relu (fp32 ReLU)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from pathlib import Path

import pytest

from evaluators.base import CompileSettings, HarnessSettings
from evaluators.harness_job import HarnessJob, HarnessReport
from evaluators.pipeline import check_kernel, judge_job
from evo.core.records import Candidate, Operator, Status

pytestmark = pytest.mark.gpu
log = logging.getLogger(__name__)

BAD = Path(__file__).resolve().parents[1] / "fixtures" / "bad"
TASK = "kb19_relu"
SMALL = (1, 2)  # the two small shapes of kb19_relu; index 0 is the 4096 x 393216 benchmark
FAST = HarnessSettings(trials=5, warmup=2, reps=10, flush_mb=256, timeout_s=180)


@pytest.fixture(scope="module")
def compile_settings(tmp_path_factory) -> CompileSettings:
    return CompileSettings(cache_dir=str(tmp_path_factory.mktemp("cc")))


@pytest.fixture(scope="module")
def built(compile_settings) -> dict[str, bytes]:
    """Every fixture plus the seed, compiled in parallel: name -> .so bytes."""
    from evaluators.compile import compile_candidate
    from evo.tasks.seeds import seed_params, seed_source

    srcs = {p.stem: (p.read_text(), {}) for p in sorted(BAD.glob("*.cu"))}
    srcs["seed"] = (seed_source(TASK), seed_params(TASK))

    def build(item):
        name, (src, params) = item
        cand = Candidate.create(TASK, src, params, operator=Operator.USER)
        return name, compile_candidate(cand, compile_settings)

    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        outs = dict(pool.map(build, srcs.items()))
    bad = {n: o.result.reason + o.result.artifacts.get("log", "")[:800] for n, o in outs.items() if not o.ok}
    assert not bad, f"fixtures failed to compile: {bad}"
    return {n: o.so_bytes for n, o in outs.items()}


def _run(built, name, *, mode="check", shapes=SMALL, bench=None, settings=FAST) -> HarnessReport:
    rep = judge_job(
        HarnessJob(task=TASK, candidate_id=name, so_bytes=built[name], mode=mode,
                   shapes=shapes, bench_shapes=bench),
        settings,
    )
    for s in rep.stages:
        print(f"[{name}] {s.stage}: {s.status.value} {s.reason[:300]}")
    return rep


def _seed_still_passes(built) -> None:
    rep = _run(built, "seed")
    assert rep.stage("correctness").status is Status.OK, rep.stage("correctness").reason


def test_seed_passes_the_whole_cascade(compile_settings):
    from evo.tasks.seeds import seed_params, seed_source

    stages = check_kernel(seed_source(TASK), TASK, seed_params(TASK), compile_settings=compile_settings,
                          harness_settings=HarnessSettings(warmup=3, reps=20, timeout_s=300), gpu=True)
    for s in stages:
        print(f"[seed] {s.stage}: {s.status.value} {s.reason[:300]}")
    assert [s.stage for s in stages] == ["policy", "compile", "correctness", "timing"]
    assert all(s.status is Status.OK for s in stages), [(s.stage, s.status, s.reason) for s in stages]
    corr, timing = stages[2], stages[3]
    assert len(corr.metrics["shapes"]) == 3 and corr.metrics["trials"] >= 5
    row = timing.metrics["shapes"][0]
    print(f"[seed] bench {row['shape']}: seed {row['median_ms']:.4f} ms (IQR {row['iqr_ms']:.4f}), "
          f"torch {row['ref_median_ms']:.4f} ms, speedup {row['speedup']:.3f}, "
          f"SOL {row['sol_ms']} ms, leftover {row['leftover_median_ms']:.4f} ms, copies {row['input_copies']}")
    assert len(row["samples_ms"]) == 20 and 0.3 < timing.metrics["fitness"] < 3.0
    assert not timing.metrics["needs_reconfirm"]


@pytest.mark.parametrize(
    "name, shapes, expect, words",
    [
        ("stale_memory", SMALL, {Status.INCORRECT}, "non-finite"),
        ("input_mutation", SMALL, {Status.INCORRECT}, "modified input 0"),
        ("partial_write", SMALL, {Status.INCORRECT}, "non-finite"),
        ("pointer_cache", SMALL, {Status.INCORRECT}, ""),
        ("hard_coded_shape", None, {Status.INCORRECT}, "'R': 129"),
        ("bad_launch_config", SMALL, {Status.INCORRECT, Status.CRASH}, ""),
        ("error_return", SMALL, {Status.CRASH}, "evo_launch returned"),
    ],
)
def test_exploit_fails_correctness(built, name, shapes, expect, words):
    rep = _run(built, name, shapes=shapes)
    c = rep.stage("correctness")
    assert c.status in expect, c.reason
    assert words in c.reason
    assert rep.stage("timing").status is Status.SKIPPED and rep.fitness is None


def test_side_stream_is_caught_by_timing(built):
    # the runner's events see an empty interval; the judge's clock over the same calls does not
    rep = _run(built, "side_stream", mode="check+time", bench=(0,))
    assert rep.stage("correctness").status is Status.OK
    t = rep.stage("timing")
    assert t.status is Status.INVALID and "not what the call took" in t.reason, t.reason
    assert rep.fitness is None


def test_call_counter_is_caught_after_timing(built):
    # one runner does correctness and timing: its counter (24) runs out among the timed calls,
    # and the last timed call is always checked
    rep = _run(built, "call_counter", mode="check+time", bench=(0,),
               settings=HarnessSettings(trials=5, warmup=2, reps=30, flush_mb=256, timeout_s=180))
    assert rep.stage("correctness").status is Status.OK
    t = rep.stage("timing")
    assert t.status is Status.INCORRECT and "output of a timed call is wrong" in t.reason, t.reason


def test_hang_times_out_then_gpu_is_healthy(built):
    rep = _run(built, "hang", settings=HarnessSettings(trials=5, timeout_s=25))
    c = rep.stage("correctness")
    assert c.status is Status.TIMEOUT and "no answer within" in c.reason, c.reason
    _seed_still_passes(built)


def test_illegal_address_crashes_then_gpu_is_healthy(built):
    rep = _run(built, "illegal_address")
    assert rep.stage("correctness").status in (Status.CRASH, Status.INCORRECT)
    _seed_still_passes(built)


def test_host_segfault_crashes_then_gpu_is_healthy(built):
    rep = _run(built, "host_segfault")
    c = rep.stage("correctness")
    assert c.status is Status.CRASH and "SIGSEGV" in c.reason
    _seed_still_passes(built)


def test_time_only_reconfirmation(built):
    rep = _run(built, "seed", mode="time-only", bench=(1,))
    assert rep.stage("correctness").status is Status.SKIPPED
    assert rep.stage("timing").status is Status.OK and rep.fitness and rep.fitness > 0
    from evaluators.protocol import PROTOCOL_VERSION

    assert rep.env["protocol"] == PROTOCOL_VERSION and rep.env["gpu"]
    print("[env]", rep.env)


def test_paired_confirmation_times_champion_and_baseline_call_by_call(built):
    """Champion confirmation's mode: the seed checked again and timed beside the same seed
    binary in a second sandboxed runner (both map the judge's buffers), rep by rep; the two
    members' times of one kernel agree within the run's noise, and a baseline that crashes
    (a fixture that segfaults on the host) fails the pairing, not the champion."""
    job = dict(task=TASK, candidate_id="seed", so_bytes=built["seed"], mode="paired", shapes=SMALL,
               bench_shapes=(1,), baseline_id="seed-again")
    rep = judge_job(HarnessJob(**job, baseline_so=built["seed"]), FAST)
    timing = rep.stage("timing")
    assert rep.stage("correctness").status is Status.OK and timing.status is Status.OK, timing.reason
    paired = timing.metrics["paired"]
    assert "error" not in paired, paired
    assert len(paired["baseline_ms"][0]) == len(paired["candidate_ms"][0]) == FAST.reps
    ratio = sorted(b / c for b, c in zip(paired["baseline_ms"][0], paired["candidate_ms"][0]))[FAST.reps // 2]
    print("[paired]", ratio, paired["baseline_fitness"], rep.fitness)
    assert 0.8 < ratio < 1.25 and paired["baseline_fitness"] > 0
    rep = judge_job(HarnessJob(**job, baseline_so=built["host_segfault"]), FAST)
    assert rep.stage("timing").status is Status.OK and rep.fitness
    assert "baseline" in rep.stage("timing").metrics["paired"]["error"]
    _seed_still_passes(built)


def test_hang_with_default_settings_is_killed_in_seconds(built):
    """Issue 40's acceptance: with the default [evaluator] settings (timeout_s = 300,
    call_timeout_s = 10), the GPU actor's judge kills a hanging kb19_relu candidate well under
    30 s and records it as a timeout; the next candidate is evaluated as usual."""
    import time

    from evaluators.actor import GpuEvaluator

    gpu = GpuEvaluator(None, HarnessSettings(), concurrent=True)  # the real evaluate_built, default settings
    try:
        seed = Candidate.create(TASK, "// seed\n", {}, operator=Operator.SEED)
        hang = Candidate.create(TASK, "// hang\n", {}, operator=Operator.USER)
        t0 = time.monotonic()
        ev = gpu.evaluate(hang, built["hang"]).evaluation
        took = time.monotonic() - t0
        c = ev.stage("correctness")
        print(f"[hang] killed after {took:.1f} s: {c.status.value} {c.reason[:300]}")
        assert c.status is Status.TIMEOUT and took < 30, (took, c.reason)
        after = gpu.evaluate(seed, built["seed"]).evaluation
        assert after.correct, [(s.stage, s.status.value, s.reason) for s in after.stages]
    finally:
        gpu.close()
