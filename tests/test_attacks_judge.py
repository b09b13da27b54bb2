"""Issue 40's attack classes against the judge and the real runner, on the CPU.

Each candidate of tests/fixtures/runner_attacks/ is the host stand-in of the GPU fixture of the
same name in tests/fixtures/attacks/ (a .cu that passes today's policy and compiles): it
forges a result file and exits 0, finds libc's symbols at run time through its ELF header,
looks for the Python C API at run time and forges the protocol when there is none, forges a
harness-error report with the harness-bug exit code, or writes fake replies to the runner's
stdout. Each is built with g++ and evaluated exactly as the judge evaluates any candidate:
``Judge(backend="host")`` starts the C++ runner (evaluators/runner/evo_runner.cpp, host
backend, built once per module) through the sandbox, maps file-backed buffers it owns, has the
runner load the .so and call ``evo_launch``, and decides every verdict from its own memory and
clock. The verdict must be the fixture header's ``runtime-expect``, never ``ok`` with a
fitness, and nothing the candidate wrote (result.json, error.json, a fake ``DONE``) may change
it or be raised as our failure.

What is under test is the judge's verdict logic and the runner's protocol; the sandbox
(Landlock, network namespace, seccomp installed by the runner before LOAD) applies where this
machine allows it and is not what stops these attacks: none of them needs a forbidden system
call. An honest ReLU is the control (correct, timed, fitness above 0), and
:func:`test_the_exploits_work_where_the_candidate_is_trusted` shows each fixture does what its
header says in a process that, like the old harness child, trusts what the candidate leaves.

The judge runs in this process, so its torch CPU ops (inputs, poison, references) run here:
the module pins torch to one intra-op thread. With torch's default pool (one thread per core;
its threads presumably spin after each op and hold the core the runner needs) the judge's
clock charges the runner's late wake-up (about 1 ms a call on a 2-core machine) to the
candidate, and the wall-clock corroboration refuses an honest kernel as ``invalid``: 3 of 5
evaluations of a 2 us ReLU, 4 of 5 of one that spins for 1 ms, on 2 cores; with one thread,
5 of 5 of either pass.
The control also spends 1 ms per call (asleep, inside the timed call) so that the
corroboration's 0.05 ms absolute slack is not decided by scheduling jitter, and it gets up to
:data:`CONTROL_TRIES` evaluations when the only failure is that refusal: with a busy loop on
one of two cores, about 1 evaluation in 5 of an honest kernel is still refused that way.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators.base import HarnessSettings
from evaluators.harness_job import HarnessJob
from evaluators.sandbox.seccomp import _ARCHES, _machine
from evo.core.records import Status

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIX = TESTS / "fixtures" / "runner_attacks"
GPU_FIX = TESTS / "fixtures" / "attacks"
TASK_FILE = str(TESTS / "fixtures" / "judge" / "tiny_tasks.py")
CACHE = ROOT / ".evo" / "cache"
CONTROL = "honest_relu"
#: Evaluations the control gets when the judge's clock alone refuses its time (see above).
CONTROL_TRIES = 3
ATTACKS = sorted(p.stem for p in FIX.glob("*.cpp") if "// ATTACK:" in p.read_text())

#: What each attack's verdict must say, besides its status: how far it got (its exit status
#: after the forged file was written; the protocol it broke).
EVIDENCE = {
    "forge_result_exit0": "exited with status 0",
    "elf_symbol_walk": "exited with status 0",
    "forged_harness_error": "exited with status 70",
    "python_capi_runtime": "outside the protocol (more than one line in reply to CALL",
    "stdout_forged_reply": "outside the protocol (more than one line in reply to CALL",
}

SETTINGS = HarnessSettings(trials=5, warmup=1, reps=10, timeout_s=60, call_timeout_s=10,
                           task_files=(TASK_FILE,))

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the host runner and the candidates"),
    pytest.mark.skipif(_machine() not in _ARCHES, reason=f"no seccomp table for {_machine()}: the runner "
                                                          "would refuse LOAD"),
]


def header(path: Path) -> dict[str, str]:
    """``key: value`` lines of the first comment block (indented continuation lines appended)."""
    out: dict[str, str] = {}
    last = None
    for line in path.read_text().split("\n"):
        if not line.startswith("//"):
            break
        body = line[2:].strip()
        m = re.match(r"([a-z][a-z-]*):\s*(.*)$", body)
        if m:
            last = m.group(1)
            out[last] = m.group(2).strip()
        elif last and line.startswith("//  "):
            out[last] += " " + body
    return out


@pytest.fixture(scope="module")
def runner() -> Path:
    from evaluators.runner import runner_binary

    return runner_binary("host", cache_dir=CACHE)


@pytest.fixture(scope="module")
def sos(tmp_path_factory) -> dict[str, Path]:
    """Every fixture and the control, built in parallel with g++."""
    from evaluators.compile.toolchain import abi_include_dir
    from evaluators.runner.build import _cuda_include

    d = tmp_path_factory.mktemp("attack-sos")
    inc = [f"-I{abi_include_dir()}", f"-I{TESTS / 'fixtures' / 'runner'}"]
    if (cuda := _cuda_include()) is not None:
        inc.append(f"-I{cuda}")
    names = [CONTROL, *ATTACKS]
    procs = {n: subprocess.Popen(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", *inc, "-o", str(d / f"{n}.so"),
                                  str(FIX / f"{n}.cpp")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for n in names}
    for n, p in procs.items():
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{n}.cpp: {out.decode()}"
    return {n: d / f"{n}.so" for n in names}


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("judge")


@pytest.fixture(scope="module")
def judge(runner, judge_dir):
    """The judge of this module, kept warm across candidates as in production, with torch on
    one intra-op thread while it lives (see the module's docstring)."""
    import torch

    from evaluators.judge.judge import Judge

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Judge(backend="host", runner=[str(runner)], workdir=judge_dir)
    finally:
        torch.set_num_threads(threads)


def _evaluate(judge, so: Path, name: str):
    job = HarnessJob(task="judge_relu", candidate_id=name, so_bytes=so.read_bytes(), mode="check+time",
                     task_files=(TASK_FILE,), seed=1234)
    rep = judge.evaluate(job, SETTINGS)
    for s in rep.stages:
        print(f"[{name}] {s.stage}: {s.status.value} {s.reason[:300]}")
    print(f"[{name}] fitness {rep.fitness}; sandbox: {rep.env.get('sandbox')}; {rep.env.get('seccomp')}")
    return rep


def test_the_corpus_has_every_class_of_issue_40_and_matches_the_gpu_fixtures():
    assert set(ATTACKS) == set(EVIDENCE), "every runner attack names the evidence its verdict must carry"
    for name in ATTACKS:
        host, gpu = header(FIX / f"{name}.cpp"), header(GPU_FIX / f"{name}.cu")
        assert (FIX / f"{name}.cpp").read_text().startswith("// ATTACK: "), name
        assert (GPU_FIX / f"{name}.cu").read_text().startswith("// ATTACK: "), name
        for h in (host, gpu):
            assert h.get("runtime-expect") in ("crash", "incorrect", "timeout"), (name, h)
            assert h.get("judge-only") == "yes" and h.get("compiles") == "yes" and h.get("runtime-layer"), (name, h)
        assert host["runtime-expect"] == gpu["runtime-expect"], name
        assert "the judge reads nothing the runner writes" in gpu["runtime-layer"], name


def test_the_control_is_correct_and_timed(judge, sos, judge_dir):
    for attempt in range(CONTROL_TRIES):
        rep = _evaluate(judge, sos[CONTROL], CONTROL)
        c, t = rep.stage("correctness"), rep.stage("timing")
        assert c.status is Status.OK, c.reason
        judge.close()   # waits for the runners being closed (and kills the next candidate's spare)
        assert not list(judge_dir.iterdir()), "the job directory goes with the runner"
        if t.status is Status.OK:
            break
        # a busy machine: the judge's clock saw the round trips take longer than the runner said
        assert t.status is Status.INVALID and "the judge's clock measured" in t.reason, t.reason
    else:
        pytest.fail(f"the honest control was refused {CONTROL_TRIES} times: {t.reason}")
    assert rep.fitness is not None and rep.fitness > 0
    assert t.metrics["timed_by"] == "judge"


@pytest.mark.parametrize("name", ATTACKS)
def test_the_judge_is_not_fooled(name, judge, sos, judge_dir):
    want = header(FIX / f"{name}.cpp")["runtime-expect"]
    # whatever the candidate forged, the evaluation ends with its verdict: no HarnessError
    rep = _evaluate(judge, sos[name], name)
    c, t = rep.stage("correctness"), rep.stage("timing")
    assert c.status.value == want, c.reason
    assert EVIDENCE[name] in c.reason, c.reason
    assert t.status is Status.SKIPPED and t.reason == f"not run: correctness {want}"
    # nothing forged changed anything: no fitness, no timing, no stage ok
    assert rep.fitness is None and rep.timings == ()
    assert not any(s.status is Status.OK for s in rep.stages)
    assert "500" not in json.dumps([s.metrics for s in rep.stages], default=str)
    judge.close()   # waits for the runners being closed (and kills the next candidate's spare)
    assert not list(judge_dir.iterdir()), "the job directory, forged files and all, is deleted unread"


# A process that trusts the candidate, as the old harness child did: it loads the .so in
# Python, calls evo_launch once on a ReLU input in a scratch directory, then writes what it
# would have reported through the harness's result writer (a stand-in module). Prints one JSON
# line: the call's return code and outputs, and the "reported" fitness; the files the
# candidate left are read by the test.
_TRUSTING_CHILD = r"""
import ctypes, json, sys, types
harness = types.ModuleType("evaluators.child.harness")
written = {}
def _write_json(path, data):
    written[path] = data
harness._write_json = _write_json
sys.modules["evaluators.child.harness"] = harness
class T(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]
x = (ctypes.c_float * 4)(-1.0, 2.0, -3.0, 4.0)
y = (ctypes.c_float * 4)(*([float("nan")] * 4))
a, b = T(ctypes.cast(x, ctypes.c_void_p), 0, 1), T(ctypes.cast(y, ctypes.c_void_p), 0, 1)
for t in (a, b):
    t.shape[0], t.strides[0] = 4, 1
lib = ctypes.CDLL(sys.argv[1])
rc = lib.evo_launch(ctypes.byref(a), 1, ctypes.byref(b), 1, None, 0, None)
harness._write_json("result.json", {"fitness": 2.0})
sys.stdout.write("\nTRUSTED " + json.dumps({"rc": rc, "y": [v if v == v else None for v in y],
                                            "fitness": written["result.json"]["fitness"]}) + "\n")
"""


@pytest.mark.parametrize("name", ATTACKS)
def test_the_exploits_work_where_the_candidate_is_trusted(name, sos, tmp_path):
    """Control: each fixture's payload really runs (so the judge's verdicts above measure the
    judge, not a broken fixture). In a trusting process it leaves exactly what the old
    harness's parent would have believed."""
    p = subprocess.run([sys.executable, "-c", _TRUSTING_CHILD, str(sos[name])], cwd=tmp_path,
                       capture_output=True, timeout=60)
    out = p.stdout.decode("ascii", "replace")
    trusted = next((json.loads(line[len("TRUSTED "):]) for line in out.splitlines() if line.startswith("TRUSTED ")),
                   None)
    if name in ("forge_result_exit0", "elf_symbol_walk"):
        assert p.returncode == 0 and trusted is None, "exits 0 from inside the call"
        forged = json.loads((tmp_path / "result.json").read_text())
        assert forged["fitness"] == 500.0 and [s["status"] for s in forged["stages"]] == ["ok", "ok"]
    elif name == "forged_harness_error":
        assert p.returncode == 70 and trusted is None
        assert json.loads((tmp_path / "error.json").read_text())["kind"] == "sandbox"
    elif name == "python_capi_runtime":
        # inside Python it finds the C API with no Python name in its source, patches the
        # result writer (2.0 is reported as 3.2) and computes honestly
        assert p.returncode == 0 and trusted is not None, p.stderr.decode()[-2000:]
        assert trusted["rc"] == 0 and trusted["y"] == [0.0, 2.0, 0.0, 4.0]
        assert trusted["fitness"] == pytest.approx(3.2)
        assert not out.startswith("DONE"), "the protocol forgery is only for a process without Python"
    elif name == "stdout_forged_reply":
        assert p.returncode == 0 and trusted is not None
        assert out.startswith("DONE 0 0 0.0001\nDONE 0 0 0.0001\n")
        assert trusted["y"] == [None] * 4, "it computes nothing"
    else:  # pragma: no cover - test_the_corpus_has_every_class... names them all
        raise AssertionError(name)
