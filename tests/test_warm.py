"""CPU tests of warm children (evaluators.warm) and the GPU's schedule (evaluators.gpu_schedule).

The children are tests/fixtures/isolation/warm.py, a stand-in that speaks the warm
protocol (spec, ``imported``, ``cuda``, ``ready``, job, gate) and records when it held the
"GPU" (its CUDA start-up, its correctness or timing work) in ``events.log``. No GPU.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from evaluators.base import HarnessSettings
from evaluators.gpu_schedule import GpuSchedule
from evaluators.isolation import HarnessJob, run_isolated
from evaluators.warm import MAX_DEATHS, WarmPool
from evo.core.records import Status

FIX = Path(__file__).parent / "fixtures" / "isolation"
SO = b"\x7fELF-not-really"


@pytest.fixture(autouse=True)
def _fixtures_may_write_to_tmp_path(tmp_path, monkeypatch):
    monkeypatch.setenv("EVO_SANDBOX_WRITABLE", str(tmp_path))


def _job(task="kb19_relu", cid="c" * 64, check_s=0.05, time_s=0.05) -> HarnessJob:
    return HarnessJob(task=task, candidate_id=cid, so_bytes=SO,
                      params=(("check_s", str(check_s)), ("time_s", str(time_s))))


def _pool(tmp_path, concurrency=2, warm=2) -> WarmPool:
    return WarmPool(GpuSchedule(check_concurrency=concurrency), warm_children=warm,
                    entry=str(FIX / "warm.py"), workdir=tmp_path)


def _events(tmp_path) -> list[tuple[str, float, float, int]]:
    log = tmp_path / "events.log"
    if not log.exists():
        return []
    return [(k, float(a), float(b), int(p)) for k, a, b, p in
            (line.split() for line in log.read_text().splitlines())]


def _wait_ready(pool: WarmPool, n: int, limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        with pool._lock:
            ready = sum(1 for ws in pool._warm.values() for w in ws if w.cuda_done)
        if ready >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} warm children became ready in {limit}s")


def _dirs(tmp_path) -> list[Path]:
    return list(tmp_path.glob("evo-harness-*"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_warm_children_get_the_next_jobs_and_unused_ones_are_killed(tmp_path):
    pool = _pool(tmp_path)
    s = HarnessSettings(timeout_s=30)
    try:
        first = run_isolated(_job(), s, pool=pool)   # cold: nothing was warm yet
        assert first.passed and first.fitness == 2.0
        assert pool.counts["cold"] == 2
        _wait_ready(pool, 4)   # two per (task, kind)
        second = run_isolated(_job(cid="d" * 64), s, pool=pool)
        assert second.passed and second.env["timing_process"] == "fresh"
        assert pool.counts["warm"] == 2 and pool.counts["cold"] == 2
        _wait_ready(pool, 4)   # the used ones were replaced
        waiting = [w.child.proc.pid for ws in pool._warm.values() for w in ws]
    finally:
        pool.close()
    assert pool.counts["discarded"] == 4
    assert not _dirs(tmp_path), "a warm child's directory survived close()"
    assert not [p for p in waiting if _alive(p)]


def test_a_warm_childs_timeout_starts_when_its_job_arrives(tmp_path):
    pool = _pool(tmp_path, warm=1)
    try:
        run_isolated(_job(task="hang"), HarnessSettings(timeout_s=0.6, fresh_timing_process=False,
                                                        check_only=True), pool=pool)
        _wait_ready(pool, 1)
        time.sleep(1.0)   # waiting longer than the timeout costs the next candidate nothing
        t0 = time.monotonic()
        rep = run_isolated(_job(task="hang", cid="e" * 64),
                           HarnessSettings(timeout_s=0.6, check_only=True), pool=pool)
        took = time.monotonic() - t0
    finally:
        pool.close()
    assert pool.counts["warm"] == 1
    assert rep.stages[0].status is Status.TIMEOUT
    assert 0.5 < rep.seconds < 3.0 and took < 4.0   # from the job's arrival (0.6 s), never the 1 s wait before it


def test_a_warm_child_that_died_waiting_is_replaced_not_given_a_job(tmp_path):
    pool = _pool(tmp_path, warm=1)
    s = HarnessSettings(timeout_s=30, check_only=True)
    try:
        run_isolated(_job(task="dies"), s, pool=pool)
        end = time.monotonic() + 20
        while pool.counts["replaced"] < MAX_DEATHS and time.monotonic() < end:
            time.sleep(0.05)
        rep = run_isolated(_job(task="dies", cid="f" * 64), s, pool=pool)
    finally:
        pool.close()
    assert pool.counts["replaced"] >= MAX_DEATHS
    assert pool.counts["warm"] == 0   # no job ever went to a dying child
    assert rep.passed   # the candidate started cold and was evaluated
    assert not _dirs(tmp_path)


def test_failed_correctness_takes_no_timing_child(tmp_path):
    pool = _pool(tmp_path, warm=1)
    try:
        rep = run_isolated(_job(task="bad"), HarnessSettings(timeout_s=30), pool=pool)
    finally:
        pool.close()
    assert rep.stage("correctness").status is Status.INCORRECT
    assert rep.stage("timing").status is Status.SKIPPED
    assert not [e for e in _events(tmp_path) if e[0] == "time-only"]


def test_correctness_overlaps_and_timing_has_the_gpu_alone(tmp_path):
    pool = _pool(tmp_path, concurrency=3, warm=2)
    s = HarnessSettings(timeout_s=60)
    reports = []
    try:
        run_isolated(_job(cid="0" * 64), s, pool=pool)
        _wait_ready(pool, 4)
        threads = [threading.Thread(target=lambda i=i: reports.append(
            run_isolated(_job(cid=str(i) * 64, check_s=0.6, time_s=0.3), s, pool=pool))) for i in range(1, 7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        pool.close()
    assert len(reports) == 6 and all(r.passed for r in reports)
    ev = _events(tmp_path)
    checks = [e for e in ev if e[0] == "check"]
    times = [e for e in ev if e[0] == "time-only"]
    assert len(times) == 7
    overlaps = sum(1 for i, a in enumerate(checks) for b in checks[i + 1:] if a[1] < b[2] and b[1] < a[2])
    assert overlaps >= 2, f"correctness never shared the GPU: {checks}"
    most = max(sum(1 for b in checks if b[1] <= a[1] < b[2]) for a in checks)
    assert most <= 3, "more correctness processes at once than check_concurrency"
    for t in times:   # nothing else held the GPU while a timing process ran (CUDA start-ups neither)
        others = [e for e in ev if e is not t and e[1] < t[2] and t[1] < e[2]]
        assert not others, f"{t} overlapped {others}"


def test_schedule_prefers_a_waiting_timing_over_new_correctness():
    sched = GpuSchedule(check_concurrency=4)
    order = []
    with sched.shared("check"):
        th = threading.Thread(target=lambda: sched.exclusive("time").__enter__() or order.append("time"))
        th.start()
        time.sleep(0.1)
        assert not sched.try_shared("check")   # a timing waits: no new shared work
        assert not sched.try_shared("warm")
    th.join(5)
    assert order == ["time"]
    with pytest.raises(ValueError):
        GpuSchedule(check_concurrency=0)
