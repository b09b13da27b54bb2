"""The judge on the CPU (issue 40): every verdict decided in the judge's process from memory it
owns and its own clock, against an in-process runner that computes honestly, lies about its
times, skips work, hangs, dies, forges result files or answers outside the protocol.

The runner here is tests/fakes/fake_runner.py (the protocol line for line, on host buffers it
maps from the judge's files); the real C++ runner's host backend is tested in
tests/test_runner.py, and the same judge with it in tests/test_attacks_judge.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluators import protocol
from evaluators.base import HarnessSettings
from evaluators.harness_job import HarnessError, HarnessJob
from evaluators.judge.judge import Judge
from evaluators.judge.timing import Calibration, CpuOps, corroborate
from evaluators.protocol import Done, Mode, ProtocolViolation, parse_reply, timing_after
from evo.core.records import Status
from tests.fakes.fake_runner import FakeClock, FakeRunner, relu_kernel

TASK_FILE = str(Path(__file__).parent / "fixtures" / "judge" / "tiny_tasks.py")
REF_MS = 2.0


class FakeOps(CpuOps):
    """The judge's device on the fake clock: every reference call costs REF_MS."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.clock_ = clock
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1

    def time_ms(self, fn):
        r = fn()
        self.clock_.advance(REF_MS / 1e3)
        return r, REF_MS


def _settings(**kw) -> HarnessSettings:
    base = dict(trials=5, warmup=1, reps=10, timeout_s=60.0, task_files=(TASK_FILE,))
    base.update(kw)
    return HarnessSettings(**base)


def _judge(tmp_path: Path, made: list, kernel=relu_kernel, **behaviour) -> tuple[Judge, FakeClock]:
    clock = FakeClock()

    def start(*, jobdir, timeout_s, seccomp):
        r = FakeRunner(kernel, clock, Path(jobdir), **behaviour)
        made.append(r)
        return r

    return Judge(backend="host", ops=FakeOps(clock), workdir=tmp_path, start_runner=start), clock


def _job(mode: str = "check+time") -> HarnessJob:
    return HarnessJob(task="judge_relu", candidate_id="c0ffee", so_bytes=b"\x7fELF not loaded by the judge",
                      mode=mode, task_files=(TASK_FILE,), seed=1234)


def _statuses(rep) -> list[tuple[str, str]]:
    return [(s.stage, s.status.value) for s in rep.stages]


def test_an_honest_kernel_passes_and_is_timed_by_the_judges_references(tmp_path):
    made: list = []
    judge, _ = _judge(tmp_path, made)
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "ok")]
    assert rep.fitness == pytest.approx(REF_MS / 1.0)
    timing = rep.stage("timing")
    assert timing.metrics["timed_by"] == "judge"
    corr = timing.metrics["corroboration"][0]
    assert corr["judge_implied_ms"] == pytest.approx(1.0, abs=1e-9)
    # correctness: 2 shapes x 5 trials x 2 calls; timing: 1 warm-up + 10 reps
    assert made[0].calls == 2 * 5 * 2 + 1 + 10
    judge.close()   # runners are closed on a thread; close() waits for them
    assert made[0].closed
    assert made[0].log[:2] == ["MAP", "MAP"] and "SECCOMP" in made[0].log
    assert made[0].log.index("SECCOMP") < made[0].log.index("LOAD") < made[0].log.index("CALL")
    # where the judge's own time went, per step, in the evaluation's env (the run's records
    # say which step limits the rate)
    phases = {k: float(v) for k, v in (kv.split("=") for kv in rep.env["judge_phases"].split())}
    assert {"env", "buffers", "runner_start", "runner_map", "runner_calibrate", "runner_seccomp", "load", "correctness",
            "timing_warmup", "timing_inputs", "timing_reference", "timing_call", "timing_check",
            "close"} <= set(phases)
    assert all(v >= 0 for v in phases.values())


def test_a_runner_that_reports_a_tenth_of_its_time_is_invalid(tmp_path):
    judge, _ = _judge(tmp_path, [], lie_factor=10.0)
    rep = judge.evaluate(_job(), _settings())
    timing = rep.stage("timing")
    assert timing.status is Status.INVALID
    assert "not what the call took" in timing.reason
    assert rep.fitness is None


def test_a_time_within_the_clocks_slack_is_believed(tmp_path):
    judge, _ = _judge(tmp_path, [], lie_factor=1.2)
    rep = judge.evaluate(_job(), _settings())
    assert rep.stage("timing").status is Status.OK
    assert rep.fitness == pytest.approx(REF_MS * 1.2 / 1.0)


def test_a_kernel_that_stops_working_when_timed_is_incorrect(tmp_path):
    judge, _ = _judge(tmp_path, [], skip_from=2 * 5 * 2 + 1)   # every check call, the warm-up, then nothing
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "incorrect")]
    assert "timed call 0" in rep.stage("timing").reason and "still hold the poison" in rep.stage("timing").reason


@pytest.mark.parametrize("mode", ["half", "zeros", "stale"])
def test_a_timed_call_that_writes_part_zeros_or_an_old_answer_is_incorrect(tmp_path, mode):
    """After correctness, the kernel writes half its output, zeros, or the answer it kept
    from an earlier call: the judge's per-call check (a full scan for poison, a sampled
    comparison with the reference on this call's inputs) refuses each."""
    calls = {"n": 0, "kept": None}

    def kernel(ins, outs, scalars):
        calls["n"] += 1
        honest = calls["n"] <= 2 * 5 * 2 + 1
        if honest or mode == "stale" and calls["kept"] is None:
            outs[0].copy_(torch.relu(ins[0]))
            if outs[0].numel() == 4096:
                calls["kept"] = outs[0].clone()
            return 0
        if mode == "half":
            n = outs[0].numel() // 2
            outs[0][:n].copy_(torch.relu(ins[0][:n]))
        elif mode == "zeros":
            outs[0].zero_()
        else:
            outs[0].copy_(calls["kept"])
        return 0

    judge, _ = _judge(tmp_path, [], kernel=kernel)
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "incorrect")], rep.stage("timing").reason
    assert ("still hold the poison" if mode == "half" else "relative L2 distance") in rep.stage("timing").reason


def test_a_kernel_that_writes_nothing_is_incorrect(tmp_path):
    judge, _ = _judge(tmp_path, [], skip_from=0)
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "incorrect"), ("timing", "skipped")]
    assert "non-finite" in rep.stage("correctness").reason


def test_the_judges_fused_tolerance_check_reaches_correctness_and_timing(tmp_path):
    """On a GPU the judge checks with the fused (torch.compile) tolerance check; here with a
    backend that needs no compiler: the honest kernel passes both stages, the lazy one fails."""
    from evo.tasks import tolerance as T

    judge, _ = _judge(tmp_path, [])
    judge._fused = "aot_eager"
    assert _statuses(judge.evaluate(_job(), _settings())) == [("correctness", "ok"), ("timing", "ok")]
    lazy, _ = _judge(tmp_path, [], skip_from=0)
    lazy._fused = "aot_eager"
    rep = lazy.evaluate(_job(), _settings())
    assert rep.stage("correctness").status is Status.INCORRECT and "non-finite" in rep.stage("correctness").reason
    assert ("out", "aot_eager") in T._FUSED and not T._FUSED_BROKEN


class _OomOps(FakeOps):
    """The judge's own device work runs out of memory the first ``times`` reference calls."""

    def __init__(self, clock, times: int) -> None:
        super().__init__(clock)
        self.left = times

    def time_ms(self, fn):
        if self.left > 0:
            self.left -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return super().time_ms(fn)


@pytest.mark.parametrize("times", [1, 2])
def test_the_judges_own_out_of_memory_is_retried_once_then_ours_never_the_candidates(tmp_path, times):
    made: list = []
    judge, clock = _judge(tmp_path, made)
    judge._ops = _OomOps(clock, times)
    if times == 1:   # caches dropped, evaluated again: the candidate's verdict stands
        rep = judge.evaluate(_job(), _settings())
        assert _statuses(rep) == [("correctness", "ok"), ("timing", "ok")]
        assert len([r for r in made if "LOAD" in r.log]) == 2   # one runner a try (and a spare, unused)
    else:            # twice: our failure, named, and no verdict at all
        with pytest.raises(HarnessError) as ei:
            judge.evaluate(_job(), _settings())
        assert ei.value.kind == "memory" and "twice" in str(ei.value)


def test_a_kernel_that_modifies_its_input_is_incorrect(tmp_path):
    def mutate(ins, outs, scalars):
        outs[0].copy_(torch.relu(ins[0]))
        ins[0].zero_()
        return 0

    judge, _ = _judge(tmp_path, [], kernel=mutate)
    rep = judge.evaluate(_job(), _settings())
    assert rep.stage("correctness").status is Status.INCORRECT
    assert "modified input 0" in rep.stage("correctness").reason


def test_an_error_code_is_a_crash_named_by_cuda(tmp_path):
    judge, _ = _judge(tmp_path, [], kernel=lambda ins, outs, sc: 700)
    rep = judge.evaluate(_job(), _settings())
    assert rep.stage("correctness").status is Status.CRASH
    assert "cudaErrorIllegalAddress (700)" in rep.stage("correctness").reason


def test_a_hang_is_a_timeout_and_a_death_a_crash(tmp_path):
    judge, _ = _judge(tmp_path, [], hang_at=3)
    rep = judge.evaluate(_job(), _settings(call_timeout_s=5.0))
    assert _statuses(rep) == [("correctness", "timeout"), ("timing", "skipped")]
    assert "5.0 s" in rep.stage("correctness").reason
    judge, _ = _judge(tmp_path, [], die_at=25)
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "crash")]
    assert "SIGSEGV" in rep.stage("timing").reason


def test_a_forged_result_file_is_never_read(tmp_path):
    """Exploit class: 'result written then exit 0' (and a forged harness-error report): the
    runner writes result.json claiming fitness 500 and error.json claiming our failure, then
    exits 0. The judge reads nothing a runner wrote: it is the candidate's crash."""
    made: list = []
    judge, _ = _judge(tmp_path, made, forge_at=0)
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "crash"), ("timing", "skipped")]
    assert rep.fitness is None and "died" in rep.stage("correctness").reason


def test_an_answer_outside_the_protocol_is_a_crash(tmp_path):
    judge, _ = _judge(tmp_path, [], garbage_at=0)
    rep = judge.evaluate(_job(), _settings())
    assert rep.stage("correctness").status is Status.CRASH
    assert "outside the protocol" in rep.stage("correctness").reason


def test_a_runner_that_cannot_map_memory_is_our_failure_not_a_verdict(tmp_path):
    judge, _ = _judge(tmp_path, [], refuse_map=True)
    with pytest.raises(HarnessError) as e:
        judge.evaluate(_job(), _settings())
    assert e.value.kind == "runner"


def test_time_only_skips_correctness_and_check_skips_timing(tmp_path):
    made: list = []
    judge, _ = _judge(tmp_path, made)
    rep = judge.evaluate(_job("time-only"), _settings())
    assert _statuses(rep) == [("correctness", "skipped"), ("timing", "ok")]
    assert made[0].calls == 1 + 10
    rep = judge.evaluate(_job("check"), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "skipped")]


def test_no_judge_module_reads_a_file_a_runner_could_write():
    """Nothing a runner writes is parsed as a result: no code of the judge names a result or
    error file or parses JSON (the runner's only channel is the strictly parsed reply line;
    its stderr is shown to people, never parsed)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "evaluators" / "judge"
    for f in sorted(root.glob("*.py")):
        tree = ast.parse(f.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
                assert "result.json" not in n.value and "error.json" not in n.value, f"{f.name}: {n.value!r}"
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "json":
                assert n.attr not in ("load", "loads"), f"{f.name} parses JSON (json.{n.attr})"
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in n.names] + [getattr(n, "module", None) or ""]
                assert "json" not in names, f"{f.name} imports json"


# --- the pieces, without a runner ------------------------------------------------------------

def test_corroborate_compares_the_runners_median_with_the_judges_clock():
    calib = Calibration(wall_ms=(0.10, 0.11, 0.10, 0.12, 0.10))
    shape = {"N": 1}
    ok, nums = corroborate(shape, [1.0] * 5, [1.10] * 5, calib)
    assert ok is None and nums["judge_implied_ms"] == pytest.approx(1.0)
    bad, _ = corroborate(shape, [0.5] * 5, [1.10] * 5, calib)
    assert bad and "0.5000 ms" in bad
    # slack: 25% of the implied time + 0.05 ms + 3 IQRs of the empty call
    edge = 1.0 - (0.25 * 1.0 + 0.05 + 3 * calib.noise_ms)
    assert corroborate(shape, [edge + 1e-6] * 5, [1.10] * 5, calib)[0] is None
    assert corroborate(shape, [edge - 1e-3] * 5, [1.10] * 5, calib)[0] is not None


def test_a_busy_host_delays_round_trips_without_making_an_honest_time_a_lie():
    """Delays only add to a round trip: with most round trips pushed up by a busy host, the
    low quantile still reads the call's own cost; a liar stays caught."""
    calib = Calibration(wall_ms=(0.10,) * 15)
    walls = [1.10] * 5 + [3.0] * 15
    assert corroborate({"N": 1}, [1.0] * 20, walls, calib)[0] is None
    assert corroborate({"N": 1}, [0.1] * 20, walls, calib)[0] is not None


def test_timing_follows_correctness_by_one_rule():
    assert timing_after(Mode.CHECK_TIME, "ok") is None
    assert timing_after(Mode.TIME_ONLY, None) is None
    assert timing_after(Mode.CHECK, "ok") == "check-only mode"
    assert timing_after(Mode.CHECK_TIME, "incorrect") == "not run: correctness incorrect"


@pytest.mark.parametrize("raw", [b"DONE 0 0", b"DONE 0 0 nan", b"DONE 0 0 -1", b"DONE x 0 1", b"OK",
                                 b"READY 2 gpu", b"LOADED 2", b"DONE 0 0 1\r", b"\xff\xfe", b"",
                                 b"DONE 0 0 " + b"1" * 50, b"X" * (protocol.MAX_LINE + 1)])
def test_a_reply_outside_the_grammar_is_a_violation(raw):
    with pytest.raises(ProtocolViolation):
        parse_reply(raw)


def test_replies_parse_to_typed_records():
    assert parse_reply(b"DONE 0 0 1.25\n") == Done(0, 0, 1.25)
    assert parse_reply(b"READY 2 cuda") == protocol.Ready("2", "cuda")
    assert parse_reply(b"ERR map no such buffer") == protocol.Failed("map", "no such buffer")
    line = protocol.call([protocol.TensorArg(1, 0, "float32", (2, 3), (3, 1))],
                         [protocol.TensorArg(2, 0, "bfloat16", (6,), (1,))], [0.5])
    assert line == "CALL 1 1 0 0 2 2 3 3 1 1 2 0 2 1 6 1 1 0.5"


def test_the_compiled_reference_is_compiled_once_per_shape_before_any_runner(tmp_path):
    """With both columns asked for, the judge compiles the reference (here a stand-in
    backend that counts) for the benchmark shape before the runner starts, once across
    candidates; fitness stays against eager and both speedups are stored."""
    import evaluators.judge.reference as R

    compiles: list = []

    def fake_compile(fn, mode, dynamic):
        compiles.append(mode)
        return fn

    made: list = []
    judge, _ = _judge(tmp_path, made)
    orig = R.references_for

    def refs(task, *, basis="eager", time_compiled=False, compile_fn=None):
        return orig(task, basis=basis, time_compiled=time_compiled, compile_fn=fake_compile)

    R_refs = pytest.MonkeyPatch()
    R_refs.setattr(R, "references_for", refs)
    try:
        for _ in range(2):
            rep = judge.evaluate(_job(), _settings(time_compiled_reference=True))
            assert rep.stage("timing").status is Status.OK
            assert rep.timings[0].compile_speedup is not None and rep.env["reference_compile_mode"]
    finally:
        R_refs.undo()
    assert compiles == [R.COMPILE_MODE], "one compiled reference per task, reused"


def test_a_reference_that_cannot_compile_is_our_failure_when_fitness_is_against_it(tmp_path):
    import evaluators.judge.reference as R

    def broken(fn, mode, dynamic):
        def call(*a):
            raise RuntimeError("inductor says no")
        return call

    judge, _ = _judge(tmp_path, [])
    orig = R.references_for
    mp = pytest.MonkeyPatch()
    mp.setattr(R, "references_for", lambda task, basis="eager", time_compiled=False, compile_fn=None:
               orig(task, basis=basis, time_compiled=time_compiled, compile_fn=broken))
    try:
        with pytest.raises(HarnessError) as e:
            judge.evaluate(_job(), _settings(reference="compile"))
        assert e.value.kind == "reference"
        rep = judge.evaluate(_job(), _settings(time_compiled_reference=True))
        assert rep.stage("timing").status is Status.OK and "inductor says no" in rep.env["reference_compile_error"]
    finally:
        mp.undo()


def test_the_judge_evicts_other_tasks_buffers_until_its_own_work_fits(tmp_path, monkeypatch):
    """Before a candidate's checks the judge frees other tasks' cached buffers (oldest first)
    until the device holds this shape's float64 work beside a runner, and keeps its own."""
    from collections import OrderedDict
    from types import SimpleNamespace

    import evaluators.judge.judge as J

    gib = 1 << 30
    state = {"free": 10 * gib}
    freed: list = []
    each = 20 * gib

    def fake_free(ex, sl):
        freed.append(sl.name)
        state["free"] += each

    monkeypatch.setattr(J, "free_slots", fake_free)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (state["free"], 80 * gib))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    judge = Judge(backend="host", workdir=tmp_path)
    judge._slots = OrderedDict((k, SimpleNamespace(name=k[0])) for k in
                               [("old", 0), ("mine", 0), ("older_use", 1), ("new", 0)])
    # this shape: 2 x 1 G elements -> 3 x 8 B x 2 G = 48 GiB of float64 work, plus a runner's 1 GiB
    big = SimpleNamespace(ins=(torch.empty(1).expand(1 << 30),), outs=(torch.empty(1).expand(1 << 30),))
    judge._free_for_work(SimpleNamespace(name="mine"), {0: big})
    assert freed == ["old", "older_use"] and ("mine", 0) in judge._slots and ("new", 0) in judge._slots
    # a paired job's baseline runner is one more reserve: 1 GiB short of it, one more eviction
    state["free"], freed[:] = 9 * gib, []
    judge._slots = OrderedDict((k, SimpleNamespace(name=k[0])) for k in [("old", 0), ("older_use", 1), ("new", 0)])
    judge._free_for_work(SimpleNamespace(name="mine"), {0: big})
    assert freed == ["old", "older_use"]
    state["free"], freed[:] = 9 * gib, []
    judge._slots = OrderedDict((k, SimpleNamespace(name=k[0])) for k in [("old", 0), ("older_use", 1), ("new", 0)])
    judge._free_for_work(SimpleNamespace(name="mine"), {0: big}, extra_runners=1)
    assert freed == ["old", "older_use", "new"]


def test_a_spare_runner_serves_the_next_candidate_and_sees_only_that_one(tmp_path):
    """From the second evaluation on, the judge starts the next candidate's runner while the
    current one's correctness runs; the next candidate gets it (no start-up of its own), each
    runner loads exactly one candidate, and closing the judge kills the unused spare."""
    made: list = []
    judge, _ = _judge(tmp_path, made)
    first = judge.evaluate(_job(), _settings())
    assert len(made) == 1 and first.env["runner"] == "started for it"   # one evaluation: no spare
    second = judge.evaluate(_job(), _settings())
    assert len(made) == 3   # the second's runner, and the spare started during its correctness
    third = judge.evaluate(_job(), _settings())
    assert third.env["runner"].startswith("spare") and len(made) == 4
    for rep in (first, second, third):
        assert _statuses(rep) == [("correctness", "ok"), ("timing", "ok")]
    assert [r.log.count("LOAD") for r in made] == [1, 1, 1, 0]
    judge._await_quiet()   # the used runners are closed on a thread; the spare waits
    assert all(r.closed for r in made[:3]) and not made[3].closed
    judge.close()
    assert made[3].closed
    assert not list(tmp_path.glob("spare-*"))   # the spare's job directory went with it


def test_a_spare_that_died_or_did_not_start_is_replaced_not_a_verdict(tmp_path):
    made: list = []
    starts = []
    clock = FakeClock()

    def start(*, jobdir, timeout_s, seccomp):
        starts.append(jobdir)
        if len(starts) == 3:   # the spare started during the second evaluation
            from evaluators.judge.runner_process import RunnerStartError
            raise RunnerStartError("no CUDA context (test)")
        r = FakeRunner(relu_kernel, clock, Path(jobdir))
        made.append(r)
        return r

    judge = Judge(backend="host", ops=FakeOps(clock), workdir=tmp_path, start_runner=start)
    judge.evaluate(_job(), _settings())
    judge.evaluate(_job(), _settings())
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "ok")]
    assert rep.env["runner"] == "started for it" and len(starts) == 5   # its own, then the next spare
    made[-1]._dead = True   # that spare dies while idle
    made[-1].returncode = -9
    rep = judge.evaluate(_job(), _settings())
    assert _statuses(rep) == [("correctness", "ok"), ("timing", "ok")] and rep.env["runner"] == "started for it"
    assert made[-3].closed   # the dead spare was reaped, not used
    judge.close()
