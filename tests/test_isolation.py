"""CPU tests of the isolation layer: spawn, timeout + group kill, crash mapping, env scrubbing.

The child entry point is a parameter of ``run_isolated``; these tests point it at tiny
Python children in tests/fixtures/isolation/ that hang, segfault, exit, leave grandchildren
behind or write a valid result. No GPU and no CUDA are involved.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from evaluators.base import HarnessSettings
from evaluators.isolation import (
    HarnessError,
    HarnessJob,
    child_env,
    run_isolated,
)
from evaluators.child.protocol import stage_from_json, stage_to_json
from evo.core.records import StageResult, Status


@pytest.fixture(autouse=True)
def _fixtures_may_write_to_tmp_path(tmp_path, monkeypatch):
    """The fake children record what they did in files beside the job dir (the parent
    deletes the job dir); the sandbox's Landlock write rules allow that only where told."""
    monkeypatch.setenv("EVO_SANDBOX_WRITABLE", str(tmp_path))

FIX = Path(__file__).parent / "fixtures" / "isolation"
SO = b"\x7fELF-not-really"


def _job(task: str = "kb19_relu", cid: str = "c" * 64, mode: str = "check+time") -> HarnessJob:
    return HarnessJob(task=task, candidate_id=cid, so_bytes=SO, mode=mode)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_dead(pid: int, limit: float = 5.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_ok_child_result_is_parsed_and_env_is_scrubbed(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "t")
    monkeypatch.setenv("MY_PASSWORD", "p")
    monkeypatch.setenv("RANDOM_UNLISTED_VAR", "x")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rep = run_isolated(_job(), HarnessSettings(device=1, timeout_s=60), entry=str(FIX / "ok.py"),
                       workdir=tmp_path)
    assert [s.stage for s in rep.stages] == ["correctness", "timing"]
    assert all(s.status is Status.OK for s in rep.stages)
    assert rep.fitness == 2.0 and rep.passed and rep.returncode == 0
    assert rep.timings[0].speedup == 2.0 and rep.timings[0].shape == {"N": 8}
    seen = json.loads(rep.env["seen_env"])
    for k in ("OPENAI_API_KEY", "HF_TOKEN", "MY_PASSWORD", "RANDOM_UNLISTED_VAR"):
        assert k not in seen
    assert seen["NCCL_NVLS_ENABLE"] == "0"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"
    assert seen["TMPDIR"].startswith(rep.env["cwd"])
    assert rep.env["so_len"] == str(len(SO))
    assert rep.env["mode"] == "check+time"
    # the private job dir is removed afterwards
    assert not Path(rep.env["cwd"]).exists()


def test_check_only_downgrades_mode_and_seed_is_recorded(tmp_path):
    job = HarnessJob(task="t", candidate_id="c", so_bytes=SO, seed=1234)
    rep = run_isolated(job, HarnessSettings(check_only=True), entry=str(FIX / "ok.py"), workdir=tmp_path)
    assert rep.env["mode"] == "check" and rep.env["seed"] == "1234"


def test_timeout_kills_the_group(tmp_path):
    t0 = time.monotonic()
    rep = run_isolated(_job(), HarnessSettings(timeout_s=1.5), entry=str(FIX / "hang.py"), workdir=tmp_path)
    assert time.monotonic() - t0 < 15
    c = rep.stage("correctness")
    assert c.status is Status.TIMEOUT
    assert "timed out after 1.5s" in c.reason and "trial 3" in c.reason
    assert rep.stage("timing").status is Status.SKIPPED
    assert rep.fitness is None and not rep.passed


def test_timeout_in_time_only_mode_is_charged_to_timing(tmp_path):
    rep = run_isolated(_job(mode="time-only"), HarnessSettings(timeout_s=1.0),
                       entry=str(FIX / "hang.py"), workdir=tmp_path)
    assert rep.stage("correctness").status is Status.SKIPPED
    assert rep.stage("timing").status is Status.TIMEOUT


def test_segfault_is_a_crash_with_stderr(tmp_path):
    rep = run_isolated(_job(), HarnessSettings(timeout_s=30), entry=str(FIX / "segv.py"), workdir=tmp_path)
    c = rep.stage("correctness")
    assert c.status is Status.CRASH
    assert "SIGSEGV" in c.reason
    assert "about to fault" in c.artifacts["stderr"]


def test_nonzero_exit_without_result_is_a_crash_with_trimmed_stderr(tmp_path):
    rep = run_isolated(_job(), HarnessSettings(timeout_s=30), entry=str(FIX / "exit3.py"), workdir=tmp_path)
    c = rep.stage("correctness")
    assert c.status is Status.CRASH and "code 3" in c.reason
    assert "last words" in c.reason
    assert len(c.artifacts["stderr"]) < 4100 and "[trimmed]" in c.artifacts["stderr"]


def test_harness_bug_raises(tmp_path):
    with pytest.raises(HarnessError, match="no such task"):
        run_isolated(_job(), HarnessSettings(timeout_s=30), entry=str(FIX / "harness_bug.py"),
                     workdir=tmp_path)


@pytest.mark.parametrize("task", ["hang", "exit"])
def test_no_process_left_behind(task, tmp_path):
    pidfile = tmp_path / "gc.pid"
    rep = run_isolated(_job(task=task, cid=str(pidfile)), HarnessSettings(timeout_s=3),
                       entry=str(FIX / "grandchild.py"), workdir=tmp_path)
    expected = Status.TIMEOUT if task == "hang" else Status.OK
    assert rep.stage("correctness").status is expected
    pid = int(pidfile.read_text())
    assert _wait_dead(pid), f"grandchild {pid} survived the group kill"


def test_child_env_maps_device_through_parent_visible_devices(tmp_path):
    env = child_env(1, tmp_path, {"CUDA_VISIBLE_DEVICES": "4,6", "PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "s"})
    assert env["CUDA_VISIBLE_DEVICES"] == "6"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[1])
    with pytest.raises(HarnessError, match="CUDA_VISIBLE_DEVICES"):
        child_env(2, tmp_path, {"CUDA_VISIBLE_DEVICES": "4,6"})


def test_job_validation():
    with pytest.raises(ValueError, match="valid modes"):
        HarnessJob(task="t", candidate_id="c", so_bytes=SO, mode="bench")
    with pytest.raises(ValueError, match="so_bytes"):
        HarnessJob(task="t", candidate_id="c", so_bytes=b"")


def test_stage_json_roundtrip():
    s = StageResult("timing", Status.INVALID, "too fast", {"a": [1.0, 2.0]}, {"x": "y"}, 1.5)
    assert stage_from_json(json.loads(json.dumps(stage_to_json(s)))) == s


def _modes_job(tmp_path, task: str = "kb19_relu") -> tuple[HarnessJob, Path]:
    log = tmp_path / "calls.txt"
    return HarnessJob(task=task, candidate_id=str(log), so_bytes=SO, mode="check+time", seed=99), log


def test_check_and_time_run_in_two_fresh_processes_with_one_seed(tmp_path):
    job, log = _modes_job(tmp_path)
    rep = run_isolated(job, HarnessSettings(timeout_s=30), entry=str(FIX / "modes.py"), workdir=tmp_path)
    assert log.read_text().splitlines() == ["check 99", "time-only 99"]
    c, t = rep.stage("correctness"), rep.stage("timing")
    assert c.status is Status.OK and c.metrics["process"] == "check"
    assert t.status is Status.OK and t.metrics["process"] == "time-only"
    assert [s.stage for s in rep.stages] == ["correctness", "timing"]
    assert rep.fitness == 3.0 and rep.timings[0].speedup == 3.0 and rep.passed
    assert rep.env["mode"] == "check+time" and rep.env["timing_process"] == "fresh"
    assert rep.seconds > 0
    # the timing process was started (gated) while the correctness process still ran
    gated_at = float(Path(str(log) + ".gated").read_text().split()[1])
    check_end = float(Path(str(log) + ".ends").read_text().splitlines()[0].split()[1])
    assert gated_at < check_end


def test_failed_correctness_starts_no_timing_process(tmp_path):
    job, log = _modes_job(tmp_path, task="bad")
    rep = run_isolated(job, HarnessSettings(timeout_s=30), entry=str(FIX / "modes.py"), workdir=tmp_path)
    assert log.read_text().splitlines() == ["check 99"]
    assert rep.stage("correctness").status is Status.INCORRECT
    t = rep.stage("timing")
    assert t.status is Status.SKIPPED and t.reason == "not run: correctness incorrect"
    assert rep.fitness is None and not rep.passed and rep.env["mode"] == "check+time"
    # the gated timing process (if it got as far as noting its pid) was killed unread
    gated = Path(str(log) + ".gated")
    if gated.exists():
        pid = int(gated.read_text().split()[0])
        assert _wait_dead(pid), f"gated timing process {pid} survived"


def test_same_process_timing_when_asked(tmp_path):
    job, log = _modes_job(tmp_path)
    rep = run_isolated(job, HarnessSettings(timeout_s=30, fresh_timing_process=False),
                       entry=str(FIX / "modes.py"), workdir=tmp_path)
    assert log.read_text().splitlines() == ["check+time 99"]
    assert rep.fitness == 3.0 and "timing_process" not in rep.env


def test_the_child_loads_only_its_own_side():
    """``python -m evaluators.child.harness`` (and the profiled program) import nothing of the
    parent's side: not the process handling, the compile stage, the policy, the store or
    sqlite-utils (evaluators/__init__.py imports nothing; the protocol is child/protocol.py)."""
    import subprocess
    import sys

    parent_side = ("evaluators.isolation", "evaluators.compile", "evaluators.policy", "evaluators.pipeline",
                   "evo.store", "sqlite_utils")
    code = ("import sys, evaluators.child.harness, evaluators.child.profile; "
            f"bad = [m for m in {parent_side!r} if m in sys.modules]; assert not bad, bad")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
