"""ncu profiles through the judge (evaluators/judge/profile.py, issue 40): on the CPU with the
real C++ runner (host backend) behind a stand-in ``ncu``, and on a GPU with the real ncu.

The stand-in ncu (:data:`FAKE_NCU`, a Python script run as ncu is: in front of the sandbox, not
inside it) records its argv and its child's pid, starts its target (the sandbox wrapper, which
confines itself and ``exec``s the runner) with ``CUDA_INJECTION64_PATH`` set as ncu sets it,
passes stdin and stdout through untouched, and once the target has exited writes a recorded
ncu report (tests/fixtures/ncu/kb19_relu_shape0.csv: one ``unary_kernel<4>`` of 3.349184 ms)
into its ``--log-file``. The candidates are host .so files built with g++: the honest ReLU of
tests/fixtures/runner/relu.cpp, and two written here (one that skips its work when it sees
ncu's injection variable, one that forges every result file it can think of).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators.base import HarnessSettings
from evaluators.profile.settings import NcuNotFoundError, ProfileError, ProfileSettings
from evaluators.sandbox.seccomp import _ARCHES, _machine
from evo.core.records import Status

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
RUNNER_FIX = TESTS / "fixtures" / "runner"
TASK_FILE = str(TESTS / "fixtures" / "judge" / "tiny_tasks.py")
CSV = TESTS / "fixtures" / "ncu" / "kb19_relu_shape0.csv"
CACHE = ROOT / ".evo" / "cache"
HARNESS = HarnessSettings(timeout_s=60, call_timeout_s=10, task_files=(TASK_FILE,))
#: gpu__time_duration.sum of the recorded report's one kernel, in ms
RECORDED_MS = 3.349184

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the host runner and the candidates"),
    pytest.mark.skipif(_machine() not in _ARCHES, reason=f"no seccomp table for {_machine()}"),
]

FAKE_NCU = r'''#!{python}
"""Stand-in ncu: records argv, runs the target as its child, then writes a recorded report."""
import json, os, subprocess, sys
HERE = {here!r}
VALUED = {{"--clock-control", "--target-processes", "--launch-count", "--launch-skip", "--page", "--print-units",
          "--metrics", "--log-file", "--nvtx-include", "--port"}}
args = sys.argv[1:]
i = 0
while i < len(args) and args[i].startswith("--"):
    i += 2 if args[i] in VALUED else 1
opts, target = args[:i], args[i:]
mode = open(os.path.join(HERE, "mode.txt")).read().strip()
# no --log-file: ncu's own lines go to stdout, among its target's (as the real one does)
log = open(opts[opts.index("--log-file") + 1], "w") if "--log-file" in opts else sys.stdout
log.write("==PROF== Connected to process (stand-in)\n")
log.flush()
# the injection's environment, as ncu 2025.3 sets it: its libraries named in a directory
# variable and in the process-tracking settings, under <install>/target/<platform>
plat = os.path.join(HERE, "install", "target", "linux-x64")
os.makedirs(plat, exist_ok=True)
tracking = "tree-tracker-id: /tmp/stand-in\nlauncher-preload-prepend: %s/./libInterceptorInjectionTarget.so:%s/./libTreeLauncherTargetInjection.so\n" % (plat, plat)
env = dict(os.environ, CUDA_INJECTION64_PATH="/opt/nvidia/nsight-compute/stand-in/libcuda-injection.so",
           NV_COMPUTE_PROFILER_PERFWORKS_DIR=plat + "/.", **{{"NVIDIA-PROCESS-TRACKING-CONFIGURATION": tracking}})
if mode == "silent" and log is sys.stdout:
    sys.exit(1)                                # an ncu that fails before starting its target
p = subprocess.Popen(target, env=env)          # stdin and stdout: the judge's pipes, passed through
with open(os.path.join(HERE, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"argv": args, "pid": os.getpid(), "child": p.pid}}) + "\n")
rc = p.wait()
if mode == "perm":
    log.write("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.\n")
    sys.exit(1)
if log is sys.stdout:
    sys.exit(rc)
if mode == "nokernel":
    log.write("==WARNING== No kernels were profiled.\n")
else:
    log.write(open({csv!r}).read())
log.close()
sys.exit(rc)
'''

#: Skips its work when it sees ncu (its injection variable), computes honestly otherwise.
SKIP_UNDER_NCU = r'''
#include <stdlib.h>
#include "runner_abi.h"
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out, const double*, int,
                          cudaStream_t) {
  if (n_in != 1 || n_out != 1) return 1;
  if (getenv("CUDA_INJECTION64_PATH") != nullptr) return 0;   // profiled: look fast, do nothing
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0, n = evo_numel(in[0]); i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return 0;
}
'''

#: Computes honestly and forges every report it can reach: result files and ncu reports in its
#: working directory (the job directory) and in every directory beside it (where the judge
#: keeps ncu's log), then claims 1 ns.
FORGER = r'''
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include "runner_abi.h"
static const char* kCsv =
  "\"ID\",\"Kernel Name\",\"gpu__time_duration.sum\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\"\n"
  "\"\",\"\",\"ns\",\"%\"\n"
  "\"0\",\"forged_kernel\",\"1\",\"99\"\n";
static void put(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  if (f) { fputs(text, f); fclose(f); }
}
static void forge_dir(const char* dir) {
  const char* names[] = {"ncu.csv", "ncu0.csv", "result.json", "error.json"};
  char p[4096];
  for (const char* n : names) {
    snprintf(p, sizeof p, "%s/%s", dir, n);
    put(p, strstr(n, ".csv") ? kCsv : "{\"ok\": true, \"fitness\": 500.0}");
  }
}
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out, const double*, int,
                          cudaStream_t) {
  if (n_in != 1 || n_out != 1) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0, n = evo_numel(in[0]); i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  forge_dir(".");
  DIR* d = opendir("..");
  if (d) {
    char p[4096];
    for (struct dirent* e; (e = readdir(d)) != nullptr;) {
      if (e->d_name[0] == '.') continue;
      snprintf(p, sizeof p, "../%s", e->d_name);
      forge_dir(p);
    }
    closedir(d);
  }
  return 0;
}
'''


@pytest.fixture(scope="module")
def runner() -> Path:
    from evaluators.runner import runner_binary

    return runner_binary("host", cache_dir=CACHE)


@pytest.fixture(scope="module")
def sos(tmp_path_factory) -> dict[str, Path]:
    from evaluators.compile.toolchain import abi_include_dir

    d = tmp_path_factory.mktemp("profile-sos")
    (d / "skip_under_ncu.cpp").write_text(SKIP_UNDER_NCU)
    (d / "forger.cpp").write_text(FORGER)
    srcs = {"relu": RUNNER_FIX / "relu.cpp", "hang": RUNNER_FIX / "hang.cpp",
            "skip_under_ncu": d / "skip_under_ncu.cpp", "forger": d / "forger.cpp"}
    procs = {n: subprocess.Popen(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{abi_include_dir()}",
                                  f"-I{RUNNER_FIX}", "-o", str(d / f"{n}.so"), str(src)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n, src in srcs.items()}
    for n, p in procs.items():
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{n}: {out.decode()}"
    return {n: d / f"{n}.so" for n in srcs}


@pytest.fixture()
def fake_ncu(tmp_path):
    d = tmp_path / "nsight-stand-in"
    d.mkdir()
    exe = d / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, here=str(d), csv=str(CSV)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    (d / "mode.txt").write_text("ok")

    class Fake:
        path = exe

        @staticmethod
        def mode(m: str) -> None:
            (d / "mode.txt").write_text(m)

        @staticmethod
        def calls() -> list[dict]:
            p = d / "calls.jsonl"
            return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    return Fake


@pytest.fixture()
def judge(runner, tmp_path):
    from evaluators.judge.judge import Judge

    return Judge(backend="host", runner=[str(runner)], workdir=tmp_path / "judge")


def _profile(judge, so: Path, fake, **kw):
    from evaluators.judge.profile import profile_with_runner

    settings = ProfileSettings(ncu=str(fake.path), cache_dir="", **kw)
    r = profile_with_runner(judge, so.stem, so.read_bytes(), "judge_relu", 0, settings=settings, harness=HARNESS,
                            task_files=(TASK_FILE,))
    print(f"[{so.stem}] {r.status.value} {r.reason[:300]} {json.dumps(r.metrics, default=str)[:400]}")
    return r


def test_an_honest_kernel_is_profiled_by_ncu_in_front_of_a_sandboxed_runner(judge, sos, fake_ncu, monkeypatch):
    import evaluators.sandbox.seccomp as sc

    made_for: list[int] = []
    real = sc.seccomp_program
    monkeypatch.setattr(sc, "seccomp_program", lambda arch, pid: made_for.append(pid) or real(arch, pid))
    r = _profile(judge, sos["relu"], fake_ncu)
    assert r.stage == "profile" and r.status is Status.OK, r.reason
    m = r.metrics
    # parsed as profile_candidate parses it, plus the judge's keys
    assert m["profiled_by"] == "judge" and m["warmup"] == 0 and m["cached"] is False
    assert m["ncu_kernel_ms"] == pytest.approx(RECORDED_MS) and m["duration_ns"] == pytest.approx(RECORDED_MS * 1e6)
    assert m["kernels"] == 1 and m["kernel"].startswith("void unary_kernel<4>") and m["ncu_capped"] is False
    assert m["bound"] == "memory-bound" and m["shape"] == {"N": 4096} and "gpu__time_duration.sum" not in m["missing"]
    # the ncu command line: every kernel of the process (no NVTX filter, no skip), the log outside the job
    # the profile's call (the other: ncu over the environment printer, ncu_injection_dirs)
    (call,) = [c for c in fake_ncu.calls() if "--log-file" in c["argv"]]
    argv = call["argv"]
    log = Path(argv[argv.index("--log-file") + 1])
    assert argv[:argv.index("--metrics")] == ["--clock-control", "none", "--target-processes", "all",
                                               "--launch-count", "4", "--csv", "--page", "raw",
                                               "--print-units", "base"]
    assert "gpu__time_duration.sum" in argv[argv.index("--metrics") + 1].split(",")
    assert not any(a.startswith(("--nvtx", "--launch-skip")) for a in argv)
    assert "-ncu-" in log.parent.name and "-profile-" not in str(log)
    # its target: the sandbox wrapper, which execs the runner (seccomp required: no --no-seccomp),
    # keeping the fds ncu's injection opened before the runner's main
    target = argv[argv.index("--log-file") + 2:]
    assert target[:4] == [sys.executable, "-I", "-S", "-c"] and target[-2:] == [str(judge._runner_argv()[0]), "--keep-fds"]
    # the runner ran below ncu, confined as any runner, its seccomp filter made for its own pid
    assert "env-scrub" in m["sandbox"] and "rlimits" in m["sandbox"] and "seccomp-required" in m["sandbox"]
    assert m["seccomp"].startswith("seccomp-bpf in the runner")
    assert made_for == [call["child"]] and call["child"] != call["pid"]
    assert not list(judge._workdir.iterdir()), "the job and log directories go with the runner"


def test_the_runner_may_read_where_ncu_says_its_injection_lives(fake_ncu, caplog):
    """ncu's libraries are found from the environment ncu gives its target (the toolkit's
    ``bin/ncu`` is a launcher script, so its own directory is not where they are): the
    platform directory and the install root above ``target`` join the runner's read set."""
    from evaluators.judge.profile import ncu_injection_dirs, ncu_readable

    here = fake_ncu.path.parent
    plat, root = here / "install" / "target" / "linux-x64", here / "install"
    got = ncu_injection_dirs(str(fake_ncu.path))
    assert got == (os.path.realpath(plat), os.path.realpath(root))
    assert set(got) <= set(ncu_readable(str(fake_ncu.path))) and str(here) in ncu_readable(str(fake_ncu.path))
    # an ncu that prints no environment: nothing added, said once
    silent = here / "silent"
    silent.mkdir()
    (silent / "mode.txt").write_text("silent")
    exe = silent / "ncu"
    exe.write_text(fake_ncu.path.read_text().replace(repr(str(here)), repr(str(silent))))
    exe.chmod(0o755)
    with caplog.at_level("WARNING", logger="evaluators.judge.profile"):
        assert ncu_injection_dirs(str(exe)) == ()
    assert "printed no environment" in caplog.text


def test_a_kernel_that_skips_its_work_under_ncu_is_incorrect(judge, sos, fake_ncu):
    from evaluators.harness_job import HarnessJob

    # honest where it is not profiled ...
    rep = judge.evaluate(HarnessJob(task="judge_relu", candidate_id="skip", so_bytes=sos["skip_under_ncu"].read_bytes(),
                                    mode="check", task_files=(TASK_FILE,), seed=7),
                         HarnessSettings(trials=2, timeout_s=60, task_files=(TASK_FILE,)))
    assert rep.stage("correctness").status is Status.OK, rep.stage("correctness").reason
    # ... and caught where it is: its output is the judge's to check, whatever ncu measured
    r = _profile(judge, sos["skip_under_ncu"], fake_ncu)
    assert r.status is Status.INCORRECT and "behaves differently under the profiler" in r.reason
    assert "ncu_kernel_ms" not in r.metrics and "profiled_by" not in r.metrics


def test_nothing_the_runner_can_write_is_read(judge, sos, fake_ncu, monkeypatch):
    """The forger computes honestly and writes forged reports (a CSV claiming 1 ns, result
    files claiming fitness 500) into its job directory and every directory beside it; the
    judge reads only ncu's log in a directory the runner cannot write (Landlock), and opens
    nothing in the job directory for reading but the exchange's buffers."""
    reads: list[str] = []
    recording = [True]

    def hook(event, args):
        if event == "open" and recording[0] and isinstance(args[0], (str, os.PathLike)):
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            if flags & (os.O_DIRECTORY | getattr(os, "O_PATH", 0)) or os.path.isdir(args[0]):
                return  # a directory listed or removed (rmtree), no file's content
            if "r" in mode or "+" in mode or (not mode and flags & os.O_ACCMODE != os.O_WRONLY):
                reads.append(os.fspath(args[0]))

    import evaluators.judge.profile as JP

    left: dict[str, list[str]] = {}
    rmtree = shutil.rmtree

    def listing_rmtree(path, *a, **kw):
        left[Path(path).name] = sorted(os.listdir(path)) if os.path.isdir(path) else []
        return rmtree(path, *a, **kw)

    monkeypatch.setattr(JP.shutil, "rmtree", listing_rmtree)
    sys.addaudithook(hook)
    try:
        r = _profile(judge, sos["forger"], fake_ncu)
    finally:
        recording[0] = False
    assert r.status is Status.OK, r.reason
    (job,) = [v for k, v in left.items() if "-profile-" in k]
    assert {"ncu.csv", "ncu0.csv", "result.json", "error.json"} <= set(job), "the forger wrote its reports"
    if "landlock" not in r.metrics["sandbox"]:
        pytest.skip("no Landlock here: the runner could write the judge's log directory (a documented limit)")
    assert [v for k, v in left.items() if "-ncu-" in k] == [["ncu.csv"]], "nothing forged beside ncu's log"
    assert r.metrics["kernel"].startswith("void unary_kernel<4>"), "a forged report was read"
    assert r.metrics["ncu_kernel_ms"] == pytest.approx(RECORDED_MS)
    assert "500" not in json.dumps(r.metrics, default=str)
    work = str(judge._workdir)
    ours = [p for p in reads if p.startswith(work)]
    assert ours, "the judge read ncu's log"
    for p in ours:
        rel = Path(p).relative_to(work)
        job, rest = rel.parts[0], rel.parts[1:]
        assert ("-ncu-" in job and rest == ("ncu.csv",)) or ("-profile-" in job and rest[:1] == ("buffers",)), p


def test_the_profilers_failures_are_ours_and_the_candidates_are_verdicts(judge, sos, fake_ncu, tmp_path):
    fake_ncu.mode("perm")
    with pytest.raises(ProfileError, match="permission"):
        _profile(judge, sos["relu"], fake_ncu)
    fake_ncu.mode("nokernel")
    r = _profile(judge, sos["relu"], fake_ncu)
    assert r.status is Status.CRASH and "captured no kernel" in r.reason and r.metrics["ncu_kernels"] == 0
    fake_ncu.mode("ok")
    r = _profile(judge, sos["hang"], fake_ncu, timeout_s=3.0)
    assert r.status is Status.TIMEOUT and "the profiled call" in r.reason and r.seconds < 20
    from evaluators.judge.profile import profile_with_runner

    with pytest.raises(NcuNotFoundError):
        profile_with_runner(judge, "x", b"", "judge_relu", 0, settings=ProfileSettings(ncu=str(tmp_path / "no-ncu")),
                            harness=HARNESS, task_files=(TASK_FILE,))
    assert not list(judge._workdir.iterdir())


def test_profile_candidate_takes_the_judge_path_and_caches_the_judges_profile(monkeypatch, tmp_path):
    import evaluators.judge as J
    import evaluators.judge.profile as JP
    from evaluators.profile import profile_candidate
    from evo.core.records import Candidate, StageResult

    seen = []

    def fake(judge, cid, so, task, shape, *, settings, harness, task_files, gpu):
        seen.append((judge, cid, task, shape, harness, gpu))
        return StageResult("profile", Status.OK, metrics={"profiled_by": "judge", "ncu_kernel_ms": 1.0})

    monkeypatch.setattr(JP, "profile_with_runner", fake)
    monkeypatch.setattr(J, "judge_for", lambda backend="cuda": f"judge:{backend}")
    cand = Candidate.create("kb19_relu", "src", {})
    s = ProfileSettings(cache_dir=str(tmp_path / "cache"))
    r = profile_candidate(cand, b"so", "kb19_relu", 0, settings=s, gpu="NVIDIA H200")
    assert r.status is Status.OK and r.metrics["profiled_by"] == "judge"
    again = profile_candidate(cand, b"so", "kb19_relu", 0, settings=s, gpu="NVIDIA H200")
    assert again.metrics["cached"] is True and len(seen) == 1
    assert seen[0][0] == "judge:cuda" and seen[0][1] == cand.id
    # an entry in the cache that the judge did not make is never served
    (key_file,) = [p for p in (tmp_path / "cache").rglob("*.json")]
    key_file.write_text(key_file.read_text().replace('"profiled_by": "judge"', '"profiled_by": "other"'))
    profile_candidate(cand, b"so", "kb19_relu", 0, settings=s, gpu="NVIDIA H200")
    assert len(seen) == 2


def test_the_gpu_actor_profiles_with_its_evaluations_settings(monkeypatch):
    import evaluators.profile as P
    from evaluators.actor import GpuEvaluator
    from evo.core.records import Candidate

    got = {}
    monkeypatch.setattr(P, "profile_candidate", lambda *a, **kw: got.update(kw) or "r")
    hs = HarnessSettings(task_files=(TASK_FILE,))
    actor = GpuEvaluator(lambda c, s, st: None, hs, concurrent=False)
    try:
        assert actor.profile(Candidate.create("kb19_relu", "src", {}), b"so", 0, ProfileSettings()) == "r"
    finally:
        actor.close()
    assert got["harness"] is hs and got["task_files"] == (TASK_FILE,)


# --- on a GPU, with the real ncu -----------------------------------------------------------------

@pytest.mark.gpu
def test_the_relu_seed_is_profiled_through_the_judge_on_a_gpu(tmp_path):
    from evaluators.base import CompileSettings
    from evaluators.pipeline import gpu_available
    from evaluators.profile import find_ncu

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    try:
        find_ncu()
    except NcuNotFoundError as e:
        pytest.skip(str(e))
    from evaluators.compile import compile_candidate
    from evaluators.judge import judge_for
    from evaluators.judge.profile import profile_with_runner
    from evo.core.records import Candidate
    from evo.engine.search import seed_for

    src, params = seed_for("kb19_relu")
    cand = Candidate.create("kb19_relu", src, params)
    out = compile_candidate(cand, CompileSettings(cache_dir=str(tmp_path / "build")))
    assert out.result.passed, out.result.reason
    r = profile_with_runner(judge_for("cuda"), cand.id, out.so_bytes, "kb19_relu", 0,
                            settings=ProfileSettings(cache_dir="", timeout_s=300),
                            harness=HarnessSettings())
    print(f"[gpu] {r.status.value} {r.reason[:500]} {json.dumps(r.metrics, default=str)[:1500]} {r.artifacts}")
    assert r.status is Status.OK, f"{r.reason}\n{r.artifacts}"
    m = r.metrics
    assert m["profiled_by"] == "judge" and m["ncu_kernel_ms"] > 0 and m["kernels"] >= 1
    assert m["bound"] == "memory-bound" and "seccomp-bpf" in m["seccomp"]
