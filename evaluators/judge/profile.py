"""An Nsight Compute profile taken by the judge (issue 40: "ncu profiles a runner, under the
same sandbox as any runner"): :func:`profile_with_runner`.

The candidate runs only in a runner (:mod:`evaluators.runner`), started by the judge's own
machinery (:meth:`Judge._start_runner <evaluators.judge.judge.Judge._start_runner>`) with ncu in front:

1. the shape's buffers are the judge's (:meth:`Judge._slots_for`); the runner maps them, its
   empty call is timed, it installs its seccomp filter, and only then loads the ``.so``;
2. the judge writes fresh inputs (:func:`~evaluators.judge.trials.fill_inputs`), poisons the
   outputs, and has the runner call the candidate ONCE: the profiled call;
3. the judge checks that call as it checks a timed call: return codes, inputs unchanged, every
   output written and equal to the eager reference's on the same inputs
   (:func:`evaluators.judge.timing._sanity`) and to the fp64 ground truth within the task's
   tolerance. A candidate that skips its work (or does something else) when it sees ncu is
   ``incorrect``, whatever ncu measured;
4. ``QUIT``; ncu writes its report after its target exited; the judge parses it exactly as
   :func:`~evaluators.profile.profile_candidate` does (:func:`~evaluators.profile.report.parse_ncu_csv`,
   :func:`~evaluators.profile.report.summarize`, :func:`~evaluators.profile.report.classify_roofline`,
   the same metric keys) and adds ``ncu_kernel_ms`` (the sum of ``gpu__time_duration.sum``
   over the call's kernels: what a champion's time is corroborated with) and
   ``profiled_by = "judge"``.

Which kernels are captured: all of them, with no warm-up call. The runner launches no kernel
of its own (``NULLCALL`` records two events around nothing; mapping and the workspace fill
are no kernel launches), so with ``--launch-skip 0`` and no NVTX filter (the runner has no
NVTX range to push, and a candidate can push ranges of its own) every kernel ncu sees belongs
to the candidate, and with a single ``CALL`` all of them belong to the profiled call. Warm-up
calls would add kernels in a number the judge cannot know (a candidate may launch a different
number per call), so ``--launch-skip`` could not be set soundly; the warm-up buys nothing for
ncu's numbers anyway (ncu replays the kernel from saved memory, flushes caches before every
pass by default, and ``gpu__time_duration`` excludes module loading), so ``metrics["warmup"]``
is 0. Kernels a candidate launches on its
first call only (lazy set-up) are captured with the rest, as they are part of that call.
``--launch-count`` (``settings.launch_count``) caps the captured kernels: when the cap is
reached, ``metrics["ncu_capped"]`` is true and ``ncu_kernel_ms`` is a lower bound.

Where ncu runs: in front of the sandbox, not inside it. The process tree is
``ncu [options] python -I -S -c <sandbox wrapper> <config> evo_runner``: the wrapper confines
itself (rlimits, Landlock, signal scoping) and ``exec``s the runner, so the runner is confined
exactly as any runner (the same :func:`~evaluators.sandbox.sandbox_launch`, with ncu's install
directories added to what Landlock lets it read, :func:`ncu_readable`: ncu injects its libraries
into its target; and with ``--keep-fds``, so the connection ncu's injection opened before the
runner's ``main`` survives the runner's start-up, which closes inherited descriptors), and
its seccomp filter is made for the runner's own pid (found below ncu once it answered
``READY``, :meth:`RunnerProcess.start <evaluators.judge.runner_process.RunnerProcess.start>`).
ncu itself is NVIDIA's trusted program and never loads candidate code. Inside the sandbox it
would break the sandbox's own rules: Landlock's ``/proc/self`` rule (which the CUDA driver
needs) is made for the process the wrapper becomes, which would be ncu and not the runner,
and ncu would have to write its report where the runner may write.

The report is ncu's ``--log-file``, in a directory of its own that the judge makes beside the
job directory, mode 0700, outside every path the runner may write under Landlock: the runner
cannot write it, replace it, or leave a file the judge would take for it. Nothing is read from
the job directory: the ``result.json`` of the old profile child does not exist here, and a file
of that name (or ``ncu.csv``, ``error.json``) that a candidate leaves there is deleted unread
with the directory. Known limits, which no file placement removes:

- Where Landlock is not available (an old kernel) or the sandbox is disabled, the runner may
  write wherever the user may, the log directory included; its random name is not a secret
  from a process that can list the judge's work directory. Such a machine has no sandbox for
  any evaluation (``evo`` says so at start-up); the profile is no weaker than the rest.
- ncu measures in the candidate's process: its injection library runs there and sends what
  it measured to ncu over a socket the candidate can reach, and a candidate that knows ncu's
  internals can forge what ncu reports (seccomp forbids it ptrace, other processes' memory,
  new sockets and processes; nothing forbids it to write its own memory). ncu's numbers are
  therefore evidence, never a verdict: the verdict of the profiled call is the judge's check
  of its output, ``ncu_kernel_ms`` corroborates a time (a disagreement makes it ``invalid``)
  and never grants fitness.
- The network: ncu's frontend and its injection talk over TCP on the loopback (the ``Host
  Name`` of every recorded report is 127.0.0.1), which a runner in a network namespace of its
  own cannot reach. The runner under ncu therefore gets no network namespace and no Landlock
  TCP rule (:data:`NETWORK_ISOLATION`), and its network is closed by seccomp alone, installed
  before LOAD: no socket, connect, bind, listen or accept for the candidate. What stays open to
  it are the sockets made before LOAD: the CUDA driver's and ncu's connection to its frontend.

ncu missing: :class:`~evaluators.profile.settings.NcuNotFoundError`. Counters not readable
(``ERR_NVGPUCTRPERM``), ncu failing while the candidate's call was fine, the runner failing to
start under ncu: :class:`~evaluators.profile.settings.ProfileError` (ours, never the
candidate's verdict). The judge's lock is held for the whole profile, as ncu measures with the
GPU to itself; the whole profile is bounded by ``settings.timeout_s`` (start, the call, ncu's
report), after which the process group is killed and the stage is ``timeout``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from evaluators import protocol
from evaluators.base import HarnessSettings
from evaluators.harness_job import HarnessError
from evaluators.profile.report import classify_roofline, parse_ncu_csv, summarize
from evaluators.profile.settings import CORE_METRICS, STAGE, ProfileError, ProfileSettings
from evaluators.protocol import Done, Loaded
from evo.core.records import StageResult, Status

__all__ = ["profile_with_runner", "ncu_wrap", "ncu_readable", "ncu_injection_dirs", "NETWORK_ISOLATION", "DURATION_METRIC"]

log = logging.getLogger(__name__)

#: The ncu metric ``ncu_kernel_ms`` is summed from (added to the list when missing).
DURATION_METRIC = CORE_METRICS["duration_ns"]
#: Whether the runner under ncu keeps its network namespace and Landlock TCP rule (see the
#: module's docstring: ncu's frontend and its injection in the runner talk over loopback TCP).
NETWORK_ISOLATION = False
#: What of ncu's report is read at most (the CSV of a few kernels is ~20 KB).
_MAX_LOG_BYTES = 8 << 20
_PERM_MARKERS = ("ERR_NVGPUCTRPERM", "permission to access NVIDIA GPU Performance Counters")


def ncu_wrap(ncu: str, settings: ProfileSettings, log_file: Path, metrics: Sequence[str]) -> list[str]:
    """The ncu command line the runner is started behind (its target, the sandboxed runner,
    follows): every kernel of the process (no NVTX filter, no launch skip, see the module's
    docstring), at most ``settings.launch_count``, the raw page as CSV in base units, into
    ``log_file``."""
    return [
        ncu, "--clock-control", "none", "--target-processes", "all",
        "--launch-count", str(settings.launch_count),
        "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics),
        "--log-file", str(log_file),
    ]


def ncu_readable(ncu: str) -> list[str]:
    """What the runner must be able to read for ncu to profile it: ncu's install directory
    (ncu injects its libraries from there into its target). ``ncu`` resolved through links;
    a ``bin`` directory (a toolkit's ``bin/ncu``) stands for its parent, the toolkit; and the
    directories ncu itself names in its target's environment (:func:`ncu_injection_dirs`),
    which is where its libraries really are when ``ncu`` is a launcher script (the CUDA
    toolkit's ``bin/ncu`` starts ``/opt/nvidia/nsight-compute/<version>/ncu``)."""
    real = Path(os.path.realpath(ncu))
    d = real.parent
    out = [str(d)]
    if d.name == "bin":
        out.append(str(d.parent))
    out += [x for x in ncu_injection_dirs(ncu) if x not in out]
    return out


#: Environment variables of ncu's target that name its injection's files: a directory, or
#: text with ``.so`` paths in it (a preload list, a YAML of tracking settings).
_INJECTION_ENV = ("NV_COMPUTE_PROFILER_PERFWORKS_DIR", "CUDA_INJECTION64_PATH", "LD_PRELOAD",
                  "NVIDIA-PROCESS-TRACKING-CONFIGURATION")
_SO_PATH = re.compile(r"(/[^\s:'\"]+?\.so(?:\.[0-9.]+)?)(?=[\s:'\"]|$)")
#: The one-liner ncu is started over: prints each of :data:`_INJECTION_ENV` on a line of its
#: own (``EVO-ENV <name> <value, newlines as spaces>``).
_ENV_PRINTER = ("import os\nfor k in %r:\n    print('EVO-ENV', k, os.environ.get(k, '').replace(chr(10), ' '))"
                % (_INJECTION_ENV,))


@functools.lru_cache(maxsize=8)
def ncu_injection_dirs(ncu: str) -> tuple[str, ...]:
    """The directories of the libraries ``ncu`` injects into its target, as ncu says itself:
    ncu is started over a Python one-liner (no CUDA, no kernel: about a second, once per
    process and ncu) that prints the environment ncu gave it, and every directory named by
    :data:`_INJECTION_ENV` (a directory, or the directory of a ``.so`` path) is returned,
    with the install root above a ``target`` directory (ncu's layout:
    ``<root>/target/<platform>/lib*.so``). Empty, with a warning, when ncu does not run or
    prints no environment: the profile then goes on with :func:`ncu_readable`'s other paths
    (and the engine's profiler-blind rule stops profiling that sees nothing)."""
    try:
        p = subprocess.run([ncu, "--target-processes", "all", sys.executable, "-I", "-S", "-c", _ENV_PRINTER],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("ncu's injection directories: %s did not run (%s)", ncu, e)
        return ()
    env: dict[str, str] = {}
    for line in p.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "EVO-ENV" and rest.split(" ", 1)[0] in _INJECTION_ENV:
            k, _, v = rest.partition(" ")
            env[k] = v
    if not env:
        log.warning("ncu's injection directories: %s printed no environment of its target (exit %s): %s",
                    ncu, p.returncode, (p.stderr or p.stdout).strip()[-300:])
        return ()
    out: list[str] = []

    def add(d: str) -> None:
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in out:
            out.append(d)

    for k in _INJECTION_ENV:
        v = env.get(k, "").strip()
        if not v:
            continue
        if k == "NV_COMPUTE_PROFILER_PERFWORKS_DIR":
            add(v)
        for so in _SO_PATH.findall(v):
            add(os.path.dirname(so))
    for d in list(out):
        parts = Path(d).parts
        if "target" in parts[1:]:
            add(str(Path(*parts[:len(parts) - 1 - parts[::-1].index("target")])))
    return tuple(out)


def _shape_index(task: Any, shape: int | Mapping[str, int]) -> int:
    if isinstance(shape, int):
        if not 0 <= shape < len(task.shapes):
            raise ValueError(f"shape index {shape} out of range: task {task.name} has {len(task.shapes)} shapes")
        return shape
    want = {str(k): int(v) for k, v in shape.items()}
    for i, s in enumerate(task.shapes):
        if {str(k): int(v) for k, v in s.items()} == want:
            return i
    raise ValueError(f"shape {want} is not one of task {task.name}'s shapes: the judge profiles a task's own "
                     "shapes only (their buffers are the ones it keeps)")


def _read_log(path: Path) -> str:
    """ncu's report (the judge's own directory, never the runner's)."""
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_LOG_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _first_error(text: str) -> str:
    for ln in text.splitlines():
        if "==ERROR==" in ln or "Error" in ln:
            return ln.strip()[:500]
    return text.strip().splitlines()[-1][:500] if text.strip() else "no output"


def _gpu_name(judge: Any) -> str:
    if judge.backend != "cuda":
        return "cpu (host stand-in)"
    import torch

    return torch.cuda.get_device_name(0)


def _gpu_spec(name: str) -> Any:
    try:
        from evo.tasks.gpus import match_gpu

        return match_gpu(name) if name else None
    except ImportError:  # pragma: no cover - evo.tasks imports torch
        return None


def profile_with_runner(judge: Any, candidate_id: str, so_bytes: bytes, task_name: str,
                        shape: int | Mapping[str, int], *, settings: ProfileSettings, harness: HarnessSettings,
                        task_files: Sequence[str] = (), gpu: str | None = None) -> StageResult:
    """Profile one built candidate on one of its task's shapes: ncu in front of a sandboxed
    runner that the judge drives (see the module's docstring). A StageResult named
    :data:`~evaluators.profile.settings.STAGE`: ``ok`` with the metrics of
    :func:`~evaluators.profile.profile_candidate` plus ``ncu_kernel_ms``, ``profiled_by``,
    ``warmup``, ``ncu_capped``, ``sandbox`` and ``seccomp``; else the candidate's ``crash``,
    ``timeout`` or ``incorrect``. ``harness``: the evaluation settings (task files, the
    per-call bound); ``gpu``: the GPU's name for the metrics (default: the judge's device).
    Raises :class:`~evaluators.profile.settings.NcuNotFoundError` or
    :class:`~evaluators.profile.settings.ProfileError` for failures of ours."""
    from evaluators.judge.tasks import TaskLoadError, load_task
    from evaluators.profile.run import find_ncu

    t0 = time.monotonic()
    try:
        task = load_task(task_name, list(task_files or harness.task_files))
    except TaskLoadError as e:
        raise ProfileError(f"cannot profile {candidate_id}: {e}") from e
    si = _shape_index(task, shape)
    shp = {str(k): int(v) for k, v in task.shapes[si].items()}
    ncu = find_ncu(settings.ncu)          # NcuNotFoundError: ours, as on the old path
    metrics = list(dict.fromkeys([*settings.metrics, DURATION_METRIC]))
    with judge._lock:
        try:
            return _profile(judge, candidate_id, bytes(so_bytes), task, si, shp, ncu, metrics, settings, harness,
                            gpu, t0)
        except HarnessError as e:   # the judge's own failure (its memory, its buffers): never the candidate's
            raise ProfileError(f"the judge could not profile {candidate_id}: {e}") from e


def _profile(judge: Any, candidate_id: str, so_bytes: bytes, task: Any, si: int, shp: dict[str, int], ncu: str,
             metrics: list[str], settings: ProfileSettings, harness: HarnessSettings, gpu: str | None,
             t0: float) -> StageResult:
    from evaluators.judge.exchange import HostExchange
    from evaluators.judge.slots import free_slots
    from evaluators.sandbox import SandboxSettings

    cuda = judge.backend == "cuda"
    sha = hashlib.sha256(so_bytes).hexdigest()
    gpu = gpu if gpu is not None else _gpu_name(judge)
    base = {"shape": shp, "gpu": gpu}
    deadline = t0 + float(settings.timeout_s)
    judge._workdir.mkdir(parents=True, exist_ok=True)
    jobdir = Path(tempfile.mkdtemp(prefix=f"{candidate_id[:12]}-profile-", dir=judge._workdir))
    # ncu's report: beside the job directory, never inside it (module docstring)
    logdir = Path(tempfile.mkdtemp(prefix=f"{candidate_id[:12]}-ncu-", dir=judge._workdir))
    os.chmod(logdir, stat.S_IRWXU)
    log_file = logdir / "ncu.csv"
    ex = judge._cuda_exchange() if cuda else HostExchange(jobdir / "buffers")
    so = jobdir / "kernel.so"
    so.write_bytes(so_bytes)
    so.chmod(0o500)
    sb = judge._sandbox if judge._sandbox is not None else SandboxSettings.from_env()
    sb = dataclasses.replace(sb, extra_readable=(*sb.extra_readable, *ncu_readable(ncu)),
                             network=sb.network and NETWORK_ISOLATION)
    # the runner's life (its CPU-time rlimit) is the profile's, not one evaluation's
    hs = dataclasses.replace(harness, timeout_s=max(float(harness.timeout_s), float(settings.timeout_s)))
    env: dict[str, str] = {}
    runner = None
    slots = None
    try:
        slots = judge._slots_for(task, si, ex, cached=cuda)
        try:
            runner, _calib = judge._start_runner(jobdir, {si: slots}, hs, env, sb,
                                                 wrap=ncu_wrap(ncu, settings, log_file, metrics))
        except HarnessError as e:
            text = _read_log(log_file)
            if any(m in text or m in str(e) for m in _PERM_MARKERS):
                raise _perm_error() from e
            raise ProfileError(f"the runner did not start under ncu: {e}"
                               + (f"; ncu: {_first_error(text)}" if text.strip() else "")) from e
        verdict = _profiled_call(task, runner, so, slots, shp, settings, harness, deadline, cuda)
        # ncu writes its report once its target has exited: QUIT, then wait for ncu (what is
        # left of the profile's time; then the group is killed)
        ncu_exit = runner.close(grace_s=max(1.0, deadline - time.monotonic()))
        wall = time.monotonic() - t0
        text = _read_log(log_file)
        if any(m in text for m in _PERM_MARKERS):
            raise _perm_error()
        artifacts = {"ncu": text[-2000:]} if text else {}
        if "==ERROR==" in text:
            artifacts["ncu_error"] = _first_error(text)
        if verdict is not None:
            return StageResult(STAGE, verdict.status, verdict.reason, dict(base), {**artifacts, **verdict.artifacts},
                               time.monotonic() - t0)
        if ncu_exit == -signal.SIGKILL:
            return StageResult(STAGE, Status.TIMEOUT,
                               f"ncu did not finish its report within the profile's {settings.timeout_s:g} s "
                               "(killed with its runner)", dict(base), artifacts, time.monotonic() - t0)
        try:
            rows = [] if "No kernels were profiled" in text else parse_ncu_csv(text)
        except ValueError as e:
            # the candidate's call was correct and the runner quit: ncu failed, not the candidate
            raise ProfileError(f"ncu wrote no report (exit {ncu_exit}): {_first_error(text)}") from e
        if not rows:
            # ``ncu_kernels = 0``: the engine tells a profiler that sees nothing from one candidate
            # that launched nothing (evo.engine.survivors, "profiler blind")
            return StageResult(STAGE, Status.CRASH,
                               "ncu captured no kernel from the candidate's call, whose output was right: "
                               "either it computed without launching a kernel on this shape, or ncu cannot "
                               "see the sandboxed runner's kernels on this machine "
                               "(benchmarks/judge_gpu/ncu_matrix.py tells which)",
                               {**base, "ncu_kernels": 0}, artifacts, time.monotonic() - t0)
        summary = summarize(rows, metrics)
        dur = summary.get("duration_ns")
        summary.update({
            "shape": shp, "gpu": gpu, "so_sha256": sha, "ncu_wall_s": round(wall, 3), "child_wall_s": None,
            "ncu_kernel_ms": None if dur is None else float(dur) / 1e6,
            "ncu_capped": len(rows) >= int(settings.launch_count),
            "profiled_by": "judge", "warmup": 0,
            "sandbox": env.get("sandbox", ""), "seccomp": env.get("seccomp", ""),
        })
        try:
            summary["bound"] = classify_roofline(summary, task, shp, _gpu_spec(gpu))
        except ValueError:
            summary["bound"] = "unknown"
        return StageResult(STAGE, Status.OK, metrics={**summary, "cached": False}, seconds=time.monotonic() - t0)
    finally:
        if runner is not None:
            runner.kill()
        if slots is not None and not cuda:
            free_slots(ex, slots)
        shutil.rmtree(jobdir, ignore_errors=True)
        shutil.rmtree(logdir, ignore_errors=True)


def _perm_error() -> ProfileError:
    return ProfileError(
        "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM); "
        "run as root or set the driver option NVreg_RestrictProfilingToAdminUsers=0, or "
        "disable profiling with profile.enabled = false")


@dataclasses.dataclass
class _Verdict:
    status: Status
    reason: str
    artifacts: dict[str, str]


def _profiled_call(task: Any, runner: Any, so: Path, slots: Any, shp: dict[str, int], settings: ProfileSettings,
                   harness: HarnessSettings, deadline: float, cuda: bool) -> _Verdict | None:
    """LOAD, then the one profiled call, checked like a timed call; None when it was right,
    else the candidate's verdict."""
    import torch

    from evaluators.judge.checks import first_wrong_output, ground_truth, poison_, same_bits
    from evaluators.judge.timing import _sanity
    from evaluators.judge.trials import CallFailed, ask, check_done, fill_inputs

    def request(line: str, what: str, bound: float) -> Any:
        return ask(runner, line, what, deadline=deadline, bound=bound,
                   spent=f"the profile's {settings.timeout_s:g} s", under=" under ncu")[0]

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    where = f"shape {shp}, the profiled call"
    try:
        reply = request(protocol.load(str(so)), "loading the kernel", float(getattr(harness, "call_timeout_s", 10.0)))
        if not isinstance(reply, Loaded):
            raise CallFailed(Status.CRASH, f"loading the kernel: the runner answered {reply}")
        dist = task.distributions[0] if task.distributions else "normal"
        saved = fill_inputs(task, slots, shp, int(settings.seed), dist)
        with torch.no_grad():
            eager = task.reference(*slots.ins)
            eager = tuple(eager) if isinstance(eager, (tuple, list)) else (eager,)
            for o in slots.outs:
                poison_(o)
        sync()
        # ncu replays the kernels (one pass per group of metrics): the call may take the
        # profile's whole time, not one evaluation's call bound
        done = request(protocol.call(slots.in_args, slots.out_args, tuple(float(s) for s in task.scalars)),
                       "the profiled call", float(settings.timeout_s))
        if not isinstance(done, Done):
            raise CallFailed(Status.CRASH, f"the runner answered {done} to a call")
        check_done(done, where)
        sync()
        with torch.no_grad():
            for k, (x, s) in enumerate(zip(slots.ins, saved)):
                if not same_bits(x, s):
                    return _Verdict(Status.INCORRECT, f"{where}: the kernel modified input {k}", {})
            wrong = _sanity(task, slots.outs, eager) or first_wrong_output(task, slots.outs, ground_truth(task, saved))
        if wrong:
            return _Verdict(Status.INCORRECT,
                            f"{where}, {wrong}: the output of the call profiled under ncu is wrong although the "
                            "correctness stage passed: the kernel behaves differently under the profiler", {})
        return None
    except CallFailed as f:
        return _Verdict(f.status, f.reason, dict(f.artifacts))
