"""Parent side of the isolated GPU harness: spawn one fresh process per candidate, kill, collect.

Contract (shared/EVALUATION.md, Isolation):

- One new process per candidate (``subprocess``: fork+exec of a fresh interpreter, never a
  fork of a CUDA process), in its own process group (``start_new_session=True``), pinned to
  one GPU with ``CUDA_VISIBLE_DEVICES``, with an environment scrubbed of secrets and a
  private working and temp directory, confined by :mod:`evaluators.sandbox` (network
  namespace, rlimits, Landlock; docs/SECURITY.md).
- A wall-clock timeout kills the *whole group* (SIGKILL) and reports ``timeout``; a death
  without a result file reports ``crash`` with the trimmed tail of stderr and the last
  progress marker (which shape / trial was running) so a repair prompt can use it.
- This module never imports torch, CUDA or the candidate: it can run in the engine's GPU
  actor, a CPU test, or ``evo check``.

The child (``evaluators/child/harness.py``, or any ``entry`` for tests) gets one argument, the job
directory, containing ``job.json`` and ``kernel.so``; it writes ``result.json`` atomically
(``result.json.tmp`` + rename) and ``progress.json`` before each risky step. Exit code 0 =
the result file says what happened (a candidate failure is data); exit code
:data:`HARNESS_BUG_EXIT` with ``error.json`` = the harness itself failed, which raises
:class:`HarnessError` here.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from evaluators.base import HarnessSettings, InfrastructureError
from evaluators.child.protocol import HARNESS_BUG_EXIT, MODES, PROTOCOL_VERSION, stage_from_json
from evo.records import StageResult, Status

__all__ = [
    "HarnessJob",
    "HarnessReport",
    "ShapeTiming",
    "HarnessError",
    "run_isolated",
    "child_env",
]

log = logging.getLogger(__name__)

_STDERR_TAIL = 4000
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PASSWD")
_ENV_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH", "PYTHONPATH",
             "USER", "LOGNAME", "SHELL", "TERM"}
# Driver / library knobs the child must see (e.g. NCCL_NVLS_ENABLE=0 on shared hosts).
_ENV_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_", "CUBLAS_", "OMP_")


class HarnessError(InfrastructureError):
    """The harness itself failed (not the candidate): a bug, a task the child cannot load, or
    a broken GPU environment. ``kind`` is the child's classification (``task``: the task or
    its file could not be loaded there; ``cuda``: no usable GPU; ``sandbox``: confinement
    failed; ``bug``: anything else)."""

    def __init__(self, message: str, *, fix: str = "", detail: str = "", kind: str = "bug") -> None:
        super().__init__(message, fix=fix, detail=detail)
        self.kind = kind

    def __reduce__(self):
        return (_rebuild_harness_error, (str(self), self.fix, self.detail, self.kind))


def _rebuild_harness_error(message: str, fix: str, detail: str, kind: str) -> "HarnessError":
    return HarnessError(message, fix=fix, detail=detail, kind=kind)


#: What the user can do about each kind of harness failure (the CLI prints it with the cause).
_HARNESS_FIXES = {
    "task": "check the task file with `evo tasks --task-file FILE` and the seed with "
            "`evo check SEED.cu --task NAME --task-file FILE`; every file in [tasks] files is "
            "imported by the GPU process",
    "cuda": "run the GPU stages on a machine whose GPU the harness can see (nvidia-smi, and "
            "`python -c \"import torch; print(torch.cuda.is_available())\"` with the same Python)",
    "sandbox": "see docs/SECURITY.md for the sandbox's switches (EVO_SANDBOX_*)",
    "reference": "torch.compile cannot compile this task's reference: set [evaluator] reference = "
                 "\"eager\" (fitness against eager PyTorch), or make the reference compilable",
    "bug": "this is a bug in the harness: report it with the log file's traceback",
}


@dataclass(frozen=True)
class HarnessJob:
    """One candidate's GPU evaluation, as the parent hands it to the child.

    ``params``: the candidate's tunables (already compiled into ``so_bytes``; kept for the
    record). ``shapes``: indices into ``task.shapes`` to check (``None`` = all; the timing
    stage always uses the task's benchmark shapes unless ``bench_shapes`` is given).
    ``task_files``: Python files that define user tasks, imported by the child before the
    registry lookup. ``seed``: base seed of the trial inputs (``None`` = fresh random,
    recorded in the metrics so any failure can be replayed).
    """

    task: str
    candidate_id: str
    so_bytes: bytes
    params: tuple[tuple[str, str], ...] = ()
    mode: str = "check+time"
    shapes: tuple[int, ...] | None = None
    bench_shapes: tuple[int, ...] | None = None
    task_files: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"HarnessJob.mode={self.mode!r}; valid modes: {', '.join(MODES)}")
        if not isinstance(self.so_bytes, (bytes, bytearray)) or not self.so_bytes:
            raise ValueError("HarnessJob.so_bytes must be the non-empty bytes of the built .so")


@dataclass(frozen=True)
class ShapeTiming:
    """Timing of one benchmark shape: candidate and reference medians/IQRs in ms."""

    shape: dict[str, int]
    median_ms: float
    iqr_ms: float
    ref_median_ms: float
    ref_iqr_ms: float
    speedup: float
    sol_ms: float | None = None
    #: against the reference under torch.compile, when it was timed (evaluators.child.reference)
    compile_ref_median_ms: float | None = None
    compile_ref_iqr_ms: float | None = None
    compile_speedup: float | None = None


@dataclass(frozen=True)
class HarnessReport:
    """What one isolated run produced: stage results, fitness, per-shape timings, environment.

    ``stages`` holds ``correctness`` and ``timing`` (in that order; a stage not run is
    ``skipped``). ``fitness`` is the geometric-mean speedup, ``None`` unless both passed.
    ``env`` records GPU name, driver, CUDA, torch, clocks, protocol version and reps.
    """

    stages: tuple[StageResult, ...]
    fitness: float | None = None
    timings: tuple[ShapeTiming, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    returncode: int | None = None

    @property
    def passed(self) -> bool:
        return all(s.status in (Status.OK, Status.SKIPPED) for s in self.stages) and any(
            s.status is Status.OK for s in self.stages
        )

    def stage(self, name: str) -> StageResult | None:
        for s in self.stages:
            if s.stage == name:
                return s
        return None


def spec_json(task: str, mode: str, settings: HarnessSettings, *, task_files: tuple[str, ...] = (),
              bench_shapes: tuple[int, ...] | None = None, seed: int | None = None) -> dict[str, Any]:
    """What a warm child is prepared for before its candidate exists (``JOBDIR/spec.json``):
    every key of :func:`_job_json` but the candidate's own (``candidate_id``, ``params``,
    ``shapes``). ``seed`` only draws the inputs of the compiled reference's warm-up."""
    return {
        "protocol": PROTOCOL_VERSION,
        "task": task,
        "mode": mode,
        "bench_shapes": list(bench_shapes) if bench_shapes is not None else None,
        "task_files": [str(Path(f).resolve()) for f in (task_files or settings.task_files)],
        "seed": secrets.randbits(62) if seed is None else seed,
        "settings": asdict(settings),
        "so": "kernel.so",
    }


def _job_json(job: HarnessJob, settings: HarnessSettings, seed: int) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "task": job.task,
        "candidate_id": job.candidate_id,
        "params": [list(p) for p in job.params],
        "mode": job.mode,
        "shapes": list(job.shapes) if job.shapes is not None else None,
        "bench_shapes": list(job.bench_shapes) if job.bench_shapes is not None else None,
        "task_files": [str(Path(f).resolve()) for f in (job.task_files or settings.task_files)],
        "seed": seed,
        "settings": asdict(settings),
        "so": "kernel.so",
    }


# ----------------------------------------------------------------------------- env


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def child_env(device: int, jobdir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: a whitelist of the parent's, minus anything secret-looking.

    ``CUDA_VISIBLE_DEVICES`` pins the child to ``device``, an index into the parent's own
    visible devices when the parent is itself restricted (e.g. a Ray GPU actor).
    """
    base = dict(os.environ if base is None else base)
    env: dict[str, str] = {}
    for k, v in base.items():
        if any(m in k.upper() for m in _SECRET_MARKERS):
            continue
        if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES):
            env[k] = v
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        if not 0 <= device < len(ids):
            raise HarnessError(
                f"device {device} is not among the parent's CUDA_VISIBLE_DEVICES={visible!r}; "
                f"use an index in 0..{len(ids) - 1}"
            )
        env["CUDA_VISIBLE_DEVICES"] = ids[device]
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    root = str(_project_root())
    pp = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    tmp = jobdir / "tmp"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("PATH", os.defpath)
    return env


# ----------------------------------------------------------------------------- run


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, n: int = _STDERR_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    # faulthandler's one-line list of loaded extension modules drowns the useful frames.
    data = b"\n".join(l for l in data.split(b"\n") if not l.startswith(b"Extension modules:"))
    text = data[-n:].decode("utf-8", "replace")
    if len(data) > n:
        text = "...[trimmed]\n" + text.split("\n", 1)[-1]
    return text.strip()


def _progress(jobdir: Path) -> str:
    try:
        p = json.loads((jobdir / "progress.json").read_text())
    except (OSError, ValueError):
        return ""
    parts = [str(p.get("stage", ""))]
    if p.get("shape") is not None:
        parts.append(f"shape {p['shape']}")
    if p.get("trial") is not None:
        parts.append(f"trial {p['trial']}")
    if p.get("dist"):
        parts.append(f"({p['dist']})")
    if p.get("step"):
        parts.append(f"at {p['step']}")
    return " ".join(x for x in parts if x)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _failure_report(
    status: Status, reason: str, mode: str, artifacts: dict[str, str], seconds: float, rc: int | None
) -> HarnessReport:
    first = "timing" if mode == "time-only" else "correctness"
    stages = [StageResult(first, status, reason, {}, artifacts, seconds)]
    if first == "correctness":
        stages.append(
            StageResult("timing", Status.SKIPPED, f"not run: correctness {status.value}")
        )
    else:
        stages.insert(0, StageResult("correctness", Status.SKIPPED, "time-only re-confirmation"))
    return HarnessReport(stages=tuple(stages), seconds=seconds, returncode=rc)


def _parse_result(data: Mapping[str, Any], seconds: float, rc: int) -> HarnessReport:
    stages = tuple(stage_from_json(s) for s in data.get("stages", []))
    timings = tuple(
        ShapeTiming(
            shape={str(k): int(v) for k, v in t["shape"].items()},
            median_ms=float(t["median_ms"]),
            iqr_ms=float(t["iqr_ms"]),
            ref_median_ms=float(t["ref_median_ms"]),
            ref_iqr_ms=float(t["ref_iqr_ms"]),
            speedup=float(t["speedup"]),
            sol_ms=None if t.get("sol_ms") is None else float(t["sol_ms"]),
            **{k: float(t[k]) for k in ("compile_ref_median_ms", "compile_ref_iqr_ms", "compile_speedup")
               if t.get(k) is not None},
        )
        for t in data.get("timings", [])
    )
    fit = data.get("fitness")
    env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
    return HarnessReport(
        stages=stages,
        fitness=None if fit is None else float(fit),
        timings=timings,
        env=env,
        seconds=seconds,
        returncode=rc,
    )


def run_isolated(
    job: HarnessJob,
    settings: HarnessSettings,
    *,
    entry: str = "evaluators.child.harness",
    python: str | None = None,
    keep_dir: bool = False,
    workdir: str | Path | None = None,
    sandbox: Any = None,
    pool: Any = None,
) -> HarnessReport:
    """Run one candidate's GPU stages in a fresh, killable process; never raises for candidates.

    ``entry``: the child's module (run as ``python -m entry JOBDIR``) or a ``.py`` path (run
    as ``python path JOBDIR``); tests point it at small fake children. ``settings.check_only``
    downgrades ``check+time`` to ``check``. Raises :class:`HarnessError` only when the child
    reports a harness bug (exit :data:`HARNESS_BUG_EXIT` with ``error.json``).
    ``sandbox``: :class:`evaluators.sandbox.SandboxSettings` (``None``: from the environment,
    see docs/SECURITY.md); the layers applied are recorded in ``report.env["sandbox"]``.

    ``check+time`` with ``settings.fresh_timing_process`` (the default) runs two children
    with the same seed: ``check``, then, only if correctness passed, ``time-only``; the report
    joins the first's correctness stage with the second's timing stage, fitness and
    environment (``env["timing_process"] = "fresh"``), and ``seconds`` is their sum.

    ``pool``: an :class:`evaluators.warm.WarmPool` (the GPU actor's): the children come
    from it (warm ones, prepared before this candidate existed, given their job now; its
    ``entry``, ``python``, ``workdir`` and ``sandbox`` apply, not these), and each runs
    inside the pool's :class:`~evaluators.gpu_schedule.GpuSchedule` slot: correctness
    shares the GPU, anything that times has it alone. Without a pool the timing process is
    started gated next to the correctness process (its start-up overlaps the trials; killed
    unread when correctness fails; its timeout counts from the gate).
    """
    mode = job.mode
    if settings.check_only and mode == "check+time":
        mode = "check"
    seed = job.seed if job.seed is not None else secrets.randbits(62)
    src = pool if pool is not None else _Cold(dict(entry=entry, python=python, keep_dir=keep_dir,
                                                    workdir=workdir, sandbox=sandbox))
    if mode != "check+time" or not settings.fresh_timing_process:
        rep = src.run(job, settings, mode, seed)
        # one process doing both stages counts as the correctness process (its timeout too)
        wall = "wall_time_s" if mode == "time-only" else "wall_check_s"
        return replace(rep, env={**rep.env, wall: f"{rep.seconds:.3f}"})
    # Correctness and timing in two fresh processes (same seed). Timed in the process that
    # had just run the correctness trials, memory-bound kernels measured up to 11% slower
    # (gelu_bf16 1.686 ms against 1.511 ms in a fresh process; torch's own silu 7% slower)
    # and the slowdown lasted exactly as long as the first buffers allocated after the
    # trials lived: benchmarks/lab/timing_state.py, docs/evaluator.md. The timing process
    # does no GPU work until the correctness process has exited with correctness ok.
    timer = src.reserve(job, settings, "time-only", seed)
    try:
        first = src.run(job, settings, "check", seed)
    except BaseException:
        timer.abort()
        raise
    c = first.stage("correctness")
    if c is None or c.status is not Status.OK:
        timer.abort()
        why = c.status.value if c is not None else "missing from the child's result"
        skipped = StageResult("timing", Status.SKIPPED, f"not run: correctness {why}")
        return replace(first, stages=tuple(x for x in (c, skipped) if x is not None),
                       env={**first.env, "mode": "check+time", "wall_check_s": f"{first.seconds:.3f}"})
    second = timer.run()
    t = second.stage("timing") or StageResult("timing", Status.CRASH, "the timing process reported no timing stage")
    return HarnessReport(
        stages=(c, t),
        fitness=second.fitness,
        timings=second.timings,
        env={**second.env, "mode": "check+time", "timing_process": "fresh",
             "wall_check_s": f"{first.seconds:.3f}", "wall_time_s": f"{second.seconds:.3f}"},
        seconds=first.seconds + second.seconds,
        returncode=second.returncode,
    )


class _Cold:
    """Children started for their job, no GPU schedule (``evo check``, ``evo bench``, tests):
    the source :func:`run_isolated` uses without a pool."""

    def __init__(self, kw: dict[str, Any]) -> None:
        self.kw = kw

    def run(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> HarnessReport:
        return _Child(job, settings, mode, seed, **self.kw).finish()

    def reserve(self, job: HarnessJob, settings: HarnessSettings, mode: str, seed: int) -> "_Gated":
        return _Gated(_Child(job, settings, mode, seed, gate=True, **self.kw))


class _Gated:
    """A gated child started now; :meth:`run` opens its gate and waits for its report."""

    def __init__(self, child: "_Child") -> None:
        self.child = child

    def run(self) -> HarnessReport:
        self.child.open_gate()
        return self.child.finish()

    def abort(self) -> None:
        self.child.abort()


def _timeout_for(settings: HarnessSettings, mode: str) -> float:
    """A child's wall-clock limit: its task's adaptive value, never above ``timeout_s``."""
    per_child = settings.timeout_time_s if mode == "time-only" else settings.timeout_check_s
    return float(min(per_child, settings.timeout_s) if per_child else settings.timeout_s)


class _Child:
    """One harness child process doing ``mode`` for ``job``, started on construction.

    :meth:`finish` waits for it (``settings.timeout_s`` from the call, then the whole process
    group is killed) and turns what it left into a :class:`HarnessReport`; :meth:`abort`
    kills it unread. Either removes the private job directory (unless ``keep_dir``).
    ``gate=True``: the child prepares (imports, CUDA context) and then waits for
    :meth:`open_gate` before any GPU work (``job.json`` key ``gate``; evaluators.child.harness).

    ``job=None`` with ``spec`` (:func:`spec_json`): a *warm* child, started before its
    candidate exists (evaluators.warm): it writes ``imported`` once it has imported torch
    and the task, waits for :meth:`allow_cuda` to create its CUDA context, writes ``ready``
    and waits for :meth:`deliver` to write its ``kernel.so`` and ``job.json`` and open the
    gate. Same sandbox, environment and private directory as any child; its timeout starts
    at delivery.
    """

    def __init__(
        self,
        job: HarnessJob | None,
        settings: HarnessSettings,
        mode: str,
        seed: int,
        *,
        entry: str,
        python: str | None,
        keep_dir: bool,
        workdir: str | Path | None,
        sandbox: Any,
        gate: bool = False,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        from evaluators.sandbox import SandboxSettings, sandbox_launch

        if (job is None) == (spec is None):
            raise ValueError("_Child needs a job or (for a warm child) a spec, not both")
        self.job, self.settings, self.mode, self.keep_dir = job, settings, mode, keep_dir
        self.seed = seed
        #: this child's wall-clock limit (a warm child's is set again by deliver)
        self.timeout_s = _timeout_for(settings, mode)
        self.jobdir = Path(tempfile.mkdtemp(prefix="evo-harness-", dir=workdir))
        self.t0 = time.monotonic()
        self._files: list[Any] = []
        try:
            if job is not None:
                payload = self._write_job(job, settings, seed)
                payload["gate"] = gate
                (self.jobdir / "job.json").write_text(json.dumps(payload, indent=1))
            else:
                payload = dict(spec)
                (self.jobdir / "spec.json").write_text(json.dumps(payload, indent=1))
            env = child_env(settings.device, self.jobdir)
            exe = python or sys.executable
            argv = ([exe, entry, str(self.jobdir)] if entry.endswith(".py")
                    else [exe, "-m", entry, str(self.jobdir)])
            # user task files import siblings: their directories stay readable under Landlock
            task_dirs = sorted({str(Path(f).parent) for f in payload["task_files"]})
            self.launch = sandbox_launch(argv, env, self.jobdir, self.timeout_s,
                                         sandbox if sandbox is not None else SandboxSettings.from_env(),
                                         readable=task_dirs)
            self._files = [open(self.jobdir / "stdout.log", "wb"), open(self.jobdir / "stderr.log", "wb")]
            self.proc = subprocess.Popen(
                self.launch.argv,
                cwd=str(self.jobdir),
                env=self.launch.env,
                stdin=subprocess.DEVNULL,
                stdout=self._files[0],
                stderr=self._files[1],
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            self._cleanup()
            raise
        self.pgid = self.proc.pid  # start_new_session: the child leads its own group

    def _write_job(self, job: HarnessJob, settings: HarnessSettings, seed: int) -> dict[str, Any]:
        so = self.jobdir / "kernel.so"
        so.write_bytes(bytes(job.so_bytes))
        os.chmod(so, 0o700)
        payload = _job_json(job, settings, seed)
        payload["mode"] = self.mode
        return payload

    def open_gate(self) -> None:
        """Let a gated child start its GPU work; its clock and timeout start now."""
        (self.jobdir / "go").touch()
        self.t0 = time.monotonic()

    # --------------------------------------------------------------- a warm child
    def alive(self) -> bool:
        return self.proc.poll() is None

    def imported(self) -> bool:
        """A warm child has imported torch and its task (no GPU work yet)."""
        return (self.jobdir / "imported").exists()

    def allow_cuda(self) -> None:
        """Let a warm child create its CUDA context and prepare its references."""
        (self.jobdir / "cuda").touch()

    def ready(self) -> bool:
        """A warm child is prepared and waits for its job (doing no GPU work)."""
        return (self.jobdir / "ready").exists()

    def deliver(self, job: HarnessJob, settings: HarnessSettings, seed: int) -> None:
        """Give a warm child its candidate: ``kernel.so`` and ``job.json`` (written whole,
        then renamed), then the gate; its clock and ``timeout_s`` start now."""
        self.job, self.settings, self.seed = job, settings, seed
        self.timeout_s = _timeout_for(settings, self.mode)
        payload = self._write_job(job, settings, seed)
        tmp = self.jobdir / "job.json.tmp"
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.jobdir / "job.json")
        self.open_gate()

    def abort(self) -> None:
        """Kill the child's group unread and clean up."""
        try:
            _kill_group(self.pgid)
            self.proc.wait()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for f in self._files:
            f.close()
        if not self.keep_dir:
            shutil.rmtree(self.jobdir, ignore_errors=True)
        else:
            log.info("kept harness job dir %s", self.jobdir)

    def finish(self) -> HarnessReport:
        """Wait for the child, then its report; raises HarnessError for a harness bug."""
        try:
            return self._report()
        finally:
            self._cleanup()

    def _report(self) -> HarnessReport:
        job, settings, mode, jobdir, proc = self.job, self.settings, self.mode, self.jobdir, self.proc
        timed_out = False
        try:
            rc = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self.pgid)
            rc = proc.wait()
        finally:
            # Anything the child left behind in its group (grandchildren) goes too.
            _kill_group(self.pgid)
        seconds = time.monotonic() - self.t0
        stderr = _tail(jobdir / "stderr.log")
        arts = {"stderr": stderr} if stderr else {}
        where = _progress(jobdir)
        log.debug("harness %s rc=%s in %.1fs", job.candidate_id[:12], rc, seconds)
        if timed_out:
            reason = f"timed out after {self.timeout_s:.3g}s (process group killed)"
            if self.timeout_s < settings.timeout_s and settings.timeout_note:
                reason += f" [{settings.timeout_note}]"
            if where:
                reason += f"; last step: {where}"
            return _failure_report(Status.TIMEOUT, reason, mode, arts, seconds, None)
        result = jobdir / "result.json"
        if rc == HARNESS_BUG_EXIT and (jobdir / "error.json").exists():
            try:
                err_data = json.loads((jobdir / "error.json").read_text())
            except ValueError:
                err_data = {"error": "error.json unreadable"}
            kind = str(err_data.get("kind") or "bug")
            kind = kind if kind in _HARNESS_FIXES else "bug"
            raise HarnessError(
                f"the GPU harness failed on task {job.task!r} (not the candidate's fault): "
                f"{str(err_data.get('error', '?')).strip()}",
                fix=_HARNESS_FIXES[kind], detail=str(err_data.get("traceback", "")), kind=kind,
            )
        if result.exists() and rc != 0:
            # A result is accepted only from a clean exit: a child that died (a kernel that
            # wrote its own result file and then aborted) is a crash, whatever files exist.
            why = (f"process killed by {_signal_name(rc)}" if rc < 0 else f"process exited with code {rc}")
            why += " after a result file appeared (a result counts only from a clean exit)"
            if stderr:
                why += f"; stderr tail: {stderr[-600:]}"
            return _failure_report(Status.CRASH, why, mode, arts, seconds, rc)
        if result.exists():
            try:
                data = json.loads(result.read_text())
            except ValueError as e:
                return _failure_report(
                    Status.CRASH, f"harness result unreadable: {e}", mode, arts, seconds, rc
                )
            report = _parse_result(data, seconds, rc)
            return replace(report, env={**report.env, "sandbox": self.launch.summary})
        if rc < 0:
            why = f"process killed by {_signal_name(rc)}"
        else:
            why = f"process exited with code {rc} without a result"
        if where:
            why += f" during {where}"
        if stderr:
            why += f"; stderr tail: {stderr[-600:]}"
        return _failure_report(Status.CRASH, why, mode, arts, seconds, rc)
