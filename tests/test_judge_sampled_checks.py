"""The judge checks a random share of timed calls and pools the reference's timings (issue 40:
the GPU time per candidate). Every timed call is prepared alike and timed; whether it is
checked is drawn after it returned; the first and the last are always checked; while the
judge's reference pool is short of ``reps`` samples every call is checked."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

from evaluators.judge.judge import Judge
from evaluators.judge.timing import CHECK_SHARE, ReferencePool, check_share
from tests.fakes.fake_runner import FakeClock, FakeRunner, relu_kernel
from tests.test_judge import REF_MS, FakeOps, _job, _settings

REPS = 40
BEFORE_TIMING = 2 * 5 * 2 + 1   # correctness (2 shapes x 5 trials x 2 calls) and one warm-up call


class CountingOps(FakeOps):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.references = 0

    def time_ms(self, fn):
        self.references += 1
        return super().time_ms(fn)


def _judge(tmp_path: Path, kernels: list, draw=None) -> tuple[Judge, CountingOps, list]:
    """A judge whose n-th runner runs ``kernels[n]`` (the last one for every later runner)."""
    clock = FakeClock()
    ops = CountingOps(clock)
    made: list = []

    def start(*, jobdir, timeout_s, seccomp):
        r = FakeRunner(kernels[min(len(made), len(kernels) - 1)], clock, Path(jobdir))
        made.append(r)
        return r

    return Judge(backend="host", ops=ops, workdir=tmp_path, start_runner=start,
                 draw=draw or random.Random(7).random), ops, made


def _timing(rep) -> dict:
    return rep.stage("timing").metrics["corroboration"][0]


def test_the_share_rises_until_the_pool_holds_a_loop_of_samples():
    assert check_share(50, 0, 0.25) == 1.0
    assert check_share(50, 25, 0.25) == pytest.approx(0.5)
    assert check_share(50, 50, 0.25) == pytest.approx(0.25)
    assert check_share(50, 400, 0.25) == pytest.approx(0.25)
    assert check_share(2, 100, 0.25) == 1.0   # a loop of two is its ends
    pool = ReferencePool()
    key = ReferencePool.key("t", {"n": 4, "m": 2}, "eager")
    assert key == ReferencePool.key("t", {"m": 2, "n": 4}, "eager")
    pool.add(key, [1.0, 2.0, 3.0])
    pool.add(key, [4.0])
    assert pool.prior(key, 2) == [3.0, 4.0] and pool.prior(key, 0) == []
    pool.add(key, [0.5] * (ReferencePool.KEEP + 3))
    assert len(pool.prior(key, 10 ** 6)) == ReferencePool.KEEP


def test_the_first_candidate_checks_every_call_the_next_a_share_with_the_reference_pooled(tmp_path):
    judge, ops, made = _judge(tmp_path, [relu_kernel])
    first = judge.evaluate(_job(), _settings(reps=REPS))
    refs_first = ops.references
    assert _timing(first)["checked_calls"] == REPS and _timing(first)["reference_pooled"] == 0
    second = judge.evaluate(_job(), _settings(reps=REPS))
    t = _timing(second)
    checked = t["checked_calls"]
    assert t["check_share"] == pytest.approx(CHECK_SHARE)
    assert 2 <= checked < REPS // 2   # the ends, and about a quarter of the 38 between
    assert refs_first == REPS and ops.references - refs_first == checked   # timed only after checked calls
    assert t["reference_own"] == checked and t["reference_pooled"] == REPS - checked
    # every call was timed all the same, and the fitness reads a full loop of reference samples
    assert made[1].calls == BEFORE_TIMING + REPS   # made[2] is the spare
    assert second.fitness == pytest.approx(REF_MS / 1.0)
    judge.close()


def test_whether_a_call_is_checked_is_drawn_only_after_it_returned(tmp_path):
    """Nothing before a call may differ between checked and unchecked calls: the draw for
    timed call r happens once call r has run, and never for the first or the last."""
    seen: list[int] = []
    rng = random.Random(3)
    holder: dict = {}

    def draw() -> float:
        seen.append(holder["judge"]._made[-1].calls)
        return rng.random()

    judge, _ops, made = _judge(tmp_path, [relu_kernel], draw=draw)
    judge._made = made
    holder["judge"] = judge
    rep = judge.evaluate(_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "ok"
    assert seen == [BEFORE_TIMING + 1 + r for r in range(1, REPS - 1)]
    judge.close()


@pytest.mark.parametrize("cheat", ["zeros", "stale"])
def test_a_kernel_that_cheats_between_the_first_and_last_call_is_caught_by_the_sampled_checks(tmp_path, cheat):
    """With the pool full (an honest candidate timed first), a kernel that behaves on every
    call it can know is checked (correctness, warm-up, the first and the last timed call)
    and cheats on all the others is refused: about a quarter of them are checked."""
    state = {"n": 0, "kept": None}

    def cheater(ins, outs, scalars):
        state["n"] += 1
        n = state["n"]
        if BEFORE_TIMING + 1 < n < BEFORE_TIMING + REPS:   # timed calls 1 .. reps - 2
            if cheat == "zeros":
                outs[0].zero_()
            else:
                outs[0].copy_(state["kept"])
            return 0
        outs[0].copy_(torch.relu(ins[0]))
        if outs[0].numel() == 4096:
            state["kept"] = outs[0].clone()
        return 0

    judge, _ops, _made = _judge(tmp_path, [relu_kernel, cheater])
    assert judge.evaluate(_job(), _settings(reps=REPS)).stage("timing").status.value == "ok"
    rep = judge.evaluate(_job(), _settings(reps=REPS))
    timing = rep.stage("timing")
    assert timing.status.value == "incorrect", timing.reason
    assert "relative L2 distance" in timing.reason and "timed call 0" not in timing.reason
    judge.close()


def test_prepare_rehearses_each_task_with_its_reference_then_starts_the_first_runner(tmp_path):
    """Before any candidate, the judge runs each of the run's tasks through correctness and
    timing with the task's own reference playing the kernel (no runner: trusted code only),
    skips a task it has already evaluated, and leaves a started runner for the first
    candidate, which then needs no start of its own."""
    judge, ops, made = _judge(tmp_path, [relu_kernel])
    assert judge.prepare(["judge_relu"], _settings(reps=REPS)) == ["judge_relu"]
    assert ops.references == 2   # the rehearsal's two timed calls, each checked
    assert len(made) == 1 and made[0].calls == 0   # the spare: started, nothing loaded
    assert not list(tmp_path.glob("prepare-*"))   # the rehearsal's buffers are gone
    rep = judge.evaluate(_job(), _settings(reps=REPS))
    assert rep.stage("timing").status.value == "ok" and rep.env["runner"].startswith("spare")
    assert len(made) == 1 and made[0].log.count("LOAD") == 1
    assert judge.prepare(["judge_relu"], _settings(reps=REPS)) == []   # evaluated already: skipped
    judge.close()


def test_the_first_runner_can_start_before_the_judge_warms_and_prepare_then_starts_none(tmp_path):
    judge, _ops, made = _judge(tmp_path / "not-made-yet", [relu_kernel])   # the judge's first act
    assert judge.start_runner(_settings(reps=REPS)) and not judge.start_runner(_settings(reps=REPS))
    assert judge.prepare(["judge_relu"], _settings(reps=REPS)) == ["judge_relu"]
    assert len(made) == 1 and made[0].calls == 0   # one spare, nothing loaded into it
    rep = judge.evaluate(_job(), _settings(reps=REPS))
    assert rep.env["runner"].startswith("spare")
    assert not judge.start_runner(_settings(reps=REPS))   # a candidate was evaluated
    judge.close()


def test_a_task_that_cannot_be_prepared_is_logged_not_raised(tmp_path, caplog):
    judge, _ops, made = _judge(tmp_path, [relu_kernel])
    assert judge.prepare(["no_such_task", "judge_relu"], _settings()) == ["judge_relu"]
    assert "preparing the judge for task no_such_task failed" in caplog.text
    judge.close()


def test_an_evaluation_that_waited_behind_set_up_says_how_long_behind_what(tmp_path):
    """The run's start-up in its records: the first evaluation that had to wait for the judge's
    lock while the judge prepared a task names the step, how long it waited, and the set-up
    steps done by then; one that found the lock free records neither."""
    import threading
    import time

    judge, _ops, _made = _judge(tmp_path, [relu_kernel])
    assert judge.prepare(["judge_relu"], _settings(reps=REPS)) == ["judge_relu"]
    out: dict = {}
    with judge._lock, judge._step("prepare other_task"):
        t = threading.Thread(target=lambda: out.update(rep=judge.evaluate(_job(), _settings(reps=REPS))))
        t.start()
        deadline = time.monotonic() + 30
        while judge._waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert judge._waiting == 1
        time.sleep(0.05)
    t.join(30)
    env = out["rep"].env
    waited, _, behind = env["judge_wait"].partition(" s behind ")
    assert float(waited) >= 0.05 and behind == "prepare other_task"
    steps = [w.split("=")[0] for w in env["judge_setup"].split()]
    assert steps == ["prepare:judge_relu", "prepare:other_task"]
    rep = judge.evaluate(_job(), _settings(reps=REPS))
    assert "judge_wait" not in rep.env and "judge_setup" not in rep.env
    judge.close()


def test_a_part_of_a_set_up_step_is_kept_with_its_span_for_the_evaluation_that_waited(tmp_path):
    """The warm-up's parts (torch's import, the exchange, the check and draw compiles) are kept
    beside the steps, so an evaluation that waited behind the warm-up says which part it was."""
    judge = Judge(backend="host", workdir=tmp_path)
    with judge._span("warm:checks"):
        time.sleep(0.02)
    (what, start, end), = judge._setup
    assert what == "warm:checks" and end - start >= 0.02
    env = judge._waited_env((0.5, "warm"))
    assert env["judge_wait"] == "0.500 s behind warm"
    name, _, span = env["judge_setup"].partition("=")
    assert name == "warm:checks" and [round(float(x), 3) for x in span.split("-")] == [round(start, 3), round(end, 3)]
    judge.close()
