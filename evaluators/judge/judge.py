"""The judge: the trusted process that decides every verdict and never loads candidate code.

One :class:`Judge` per GPU lives in the process that asks for evaluations (the GPU actor,
``evo check``, ``evo bench``), stays warm across candidates (torch imported, CUDA context up,
the exchange's buffers and compiled references kept per task and shape), and runs one
candidate at a time:

1. start a runner (:mod:`evaluators.runner`, sandboxed, one per candidate) and time its empty
   call (:class:`~evaluators.judge.timing.Calibration`) before anything of the candidate exists
   in it;
2. give it the shape buffers to map, install its seccomp filter, then let it load the ``.so``;
3. correctness (:mod:`evaluators.judge.trials`), then, by :func:`evaluators.protocol.timing_after`,
   timing (:mod:`evaluators.judge.timing`);
4. kill the runner whatever happened (on a thread: the next candidate need not wait for a
   process to exit; nothing is timed until it has).

A judge that has evaluated before keeps one **spare runner**: started (``HELLO``, its CUDA
context made) while the current candidate's correctness runs, so the next candidate skips the
runner's start-up. A spare has never seen candidate code (it is handed exactly one candidate,
then discarded like any runner), and the timing loop waits for it to be up: no runner starts
while anything is timed.

What the runner says is only ever the return codes and event time of one call, parsed
strictly; whether the call was right, and how long it took, is decided here. A failure of ours
(the runner or its CUDA context would not start, a buffer could not be mapped, the judge's own
memory ran out) raises :class:`~evaluators.harness_job.HarnessError` and is never recorded as
the candidate's verdict; such reports are believed only from this side, which runs no
candidate code. Everything after the ``LOAD`` is the candidate's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from evaluators import protocol
from evaluators.base import HarnessSettings
from evaluators.harness_job import HARNESS_FIXES, HarnessError, HarnessJob, HarnessReport, ShapeTiming
from evaluators.judge.exchange import Exchange, ExchangeError, HostExchange, IpcExchange
from evaluators.judge.phases import Phases
from evaluators.judge.slots import ShapeSlots, free_slots, make_slots, probe_specs
from evaluators.judge.timing import Baseline, Calibration, CpuOps, CudaOps, DeviceOps, ReferencePool, time_shapes
from evaluators.judge.trials import CallFailed, run_correctness
from evaluators.protocol import Done, Loaded, Mapped, Mode
from evo.core.records import StageResult, Status

__all__ = ["Judge", "NULL_CALLS", "RUNNER_RESERVE_BYTES"]

log = logging.getLogger(__name__)

#: Empty calls timed before the candidate is loaded (the judge's round-trip overhead).
NULL_CALLS = 15
#: Device memory a runner needs beside the judge's buffers (its CUDA context, a workspace).
RUNNER_RESERVE_BYTES = 1 << 30
#: Of the device memory, what the judge's cached buffers may hold at most.
CACHE_FRACTION = 0.25
#: Cached buffers at most (a runner maps buffer ids below 256; a shape needs a few).
MAX_CACHED_BUFFERS = 192
#: The judge's working memory for a shape, in float64 copies of its inputs and outputs (the
#: upcast inputs, the ground truth and the reference's own temporaries, the kept copies).
WORK_FACTOR = 3


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


class Judge:
    """Evaluates built candidates through runners; thread-safe (one evaluation at a time).

    ``backend``: ``cuda`` (device buffers shared by IPC, the judge's CUDA events and L2 flush)
    or ``host`` (the CPU stand-in: file-backed buffers, the wall clock). ``runner``: the argv
    that starts a runner (default: the built C++ runner of the backend). ``ops``: the device
    operations (tests pass a :class:`~evaluators.judge.timing.CpuOps` with a fake clock).
    ``start_runner(jobdir=, timeout_s=, seccomp=)``: what starts a runner (default
    :meth:`RunnerProcess.start <evaluators.judge.runner_process.RunnerProcess.start>` on
    ``runner``); tests pass in-process fakes with the same members. ``draw``: what draws
    whether a timed call is checked (:func:`~evaluators.judge.timing.time_shape`; default the
    operating system's randomness; tests pass a seeded one).
    """

    def __init__(self, *, backend: str = "cuda", runner: Sequence[str] | None = None,
                 workdir: str | os.PathLike[str] | None = None, ops: DeviceOps | None = None,
                 sandbox: Any = None, cuda_device: str | None = None,
                 start_runner: Callable[..., Any] | None = None, draw: Callable[[], float] | None = None) -> None:
        if backend not in ("cuda", "host"):
            raise ValueError(f"judge backend {backend!r}: expected 'cuda' or 'host'")
        self.backend = backend
        self._runner = list(runner) if runner else None
        self._workdir = Path(workdir) if workdir else Path(tempfile.gettempdir()) / f"evo-judge-{os.getpid()}"
        self._ops = ops
        self._sandbox = sandbox
        self._cuda_device = cuda_device
        self._start = start_runner
        self._lock = threading.Lock()
        self._exchange: Exchange | None = None
        self._slots: OrderedDict[tuple[str, int], ShapeSlots] = OrderedDict()
        self._refs: dict[tuple[str, str, bool], list[Any]] = {}
        self._warm: dict[tuple[str, str, bool], set[int]] = {}
        self._compile_errors: dict[tuple[str, str, bool], str] = {}
        #: the references' latest timings (:class:`~evaluators.judge.timing.ReferencePool`)
        self._ref_pool = ReferencePool()
        #: what draws whether a timed call is checked (None: the OS's randomness; tests pass one)
        self._draw = draw
        self._flush_mb = 0
        #: The tolerance check's fused backend (evo.tasks.tolerance.check): on a GPU with Triton
        #: (it comes with torch's CUDA builds), the Triton kernels, which read each tensor once
        #: per pass where the eager passes move many float64 temporaries; a compile or
        #: self-check failure falls back to the eager check for the process. Not inductor:
        #: its fused passes were slower than the eager ones (benchmarks/judge_gpu/steps.py).
        self._fused: str | None = "triton" if backend == "cuda" and _has_triton() else None
        #: the next candidate's runner, starting or started (:class:`_Spare`); evaluations so far
        self._spare: _Spare | None = None
        self._evaluations = 0
        #: evaluations waiting for the lock (:meth:`prepare` lets them go first)
        self._waiting = 0
        self._count_lock = threading.Lock()
        #: finished candidates' runners being closed (:meth:`_close_later`)
        self._closing: list[threading.Thread] = []
        #: what holds the lock now ("warm", "prepare TASK", "evaluate ID"), read by an
        #: evaluation that has to wait for it; the set-up steps done, ``(step, start, end)`` in
        #: epoch seconds: both go into the env of the evaluations that waited (the run's
        #: start-up, in its records)
        self._doing = ""
        self._setup: list[tuple[str, float, float]] = []

    # ----------------------------------------------------------------- set-up (ours)

    def _runner_argv(self) -> list[str]:
        if self._runner is None:
            from evaluators.runner import runner_binary

            self._runner = [str(runner_binary(self.backend))]
        return list(self._runner)

    def _device_ops(self, settings: HarnessSettings) -> DeviceOps:
        if self._ops is not None and (self.backend == "host" or self._flush_mb == settings.flush_mb):
            return self._ops
        if self.backend == "host":
            self._ops = CpuOps()
        else:
            self._ops = CudaOps(settings.flush_mb)
            self._flush_mb = settings.flush_mb
        return self._ops

    def _cuda_exchange(self) -> Exchange:
        if self._exchange is None:
            import torch

            from evaluators.judge.reference import _ensure_user_name

            _ensure_user_name()   # inductor (the fused tolerance check, compiled references) keys caches by it
            torch.cuda.set_device(0)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            self._exchange = IpcExchange()
        return self._exchange

    def _slots_for(self, task: Any, si: int, ex: Exchange, cached: bool) -> ShapeSlots:
        key = (task.name, si)
        if cached and key in self._slots:
            self._slots.move_to_end(key)
            return self._slots[key]
        ins, outs = probe_specs(task, dict(task.shapes[si]), ex.device)
        need = sum(max(s.extent, 1) * 8 for s in (*ins, *outs))
        if cached:
            self._make_room(need)
        try:
            slots = make_slots(ex, ins, outs)
        except ExchangeError as e:
            raise HarnessError(f"the judge could not allocate the buffers of {task.name} shape {si}: {e}",
                               fix="free GPU memory (other processes on this GPU)",
                               kind="memory") from e
        if cached:
            self._slots[key] = slots
        return slots

    def _make_room(self, need: int) -> None:
        """Evict cached shape buffers (least recently used first) until ``need`` more bytes fit
        in the cache's share of the device and the device has room for a runner beside them."""
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        while self._slots:
            cached = sum(s.nbytes for s in self._slots.values())
            count = sum(len(s.buffers) for s in self._slots.values())
            free = torch.cuda.mem_get_info()[0]
            if (cached + need <= CACHE_FRACTION * total and free >= need + RUNNER_RESERVE_BYTES
                    and count <= MAX_CACHED_BUFFERS):
                return
            self._evict(next(iter(self._slots)))

    def _evict(self, key: tuple[str, int]) -> None:
        """Free one task shape's cached buffers and hand the memory back to the driver."""
        import torch

        free_slots(self._exchange, self._slots.pop(key))
        torch.cuda.empty_cache()

    def _free_for_work(self, task: Any, slots: dict[int, ShapeSlots], extra_runners: int = 0) -> None:
        """Evict other tasks' cached buffers (least recently used first) until the device has
        room for this evaluation's own temporaries beside its runners (``extra_runners``: a
        ``paired`` job's baseline): the float64 ground truth
        of the largest shape and what computing it takes, estimated at :data:`WORK_FACTOR`
        times its inputs and outputs in float64 (an fp32 swish over 6.4 GB needs ~45 GB)."""
        import torch

        work = max((WORK_FACTOR * 8 * sum(t.numel() for t in (*sl.ins, *sl.outs)) for sl in slots.values()),
                   default=0)
        # this candidate's, the spare started beside it, and a paired job's baseline
        runners = (2 if self._evaluations else 1) + extra_runners
        for key in [k for k in self._slots if k[0] != task.name]:
            if torch.cuda.mem_get_info()[0] >= work + runners * RUNNER_RESERVE_BYTES:
                return
            self._evict(key)

    def _references(self, task: Any, settings: HarnessSettings, slots: dict[int, ShapeSlots],
                    bench: list[int], env: dict[str, str]) -> list[Any]:
        """The references timing measures against, the compiled one compiled (here, in the
        judge, once per task and shape, outside every clock) before any runner starts. A
        compile failure is our failure when fitness is against the compiled reference
        (``HarnessError`` kind ``reference``); otherwise only eager is timed and
        ``env["reference_compile_error"]`` says why."""
        from evaluators.judge.reference import COMPILE_MODE, ReferenceCompileError, references_for, warm_up
        from evaluators.harness_job import HARNESS_FIXES
        from evaluators.judge.trials import fill_inputs

        key = (task.name, settings.reference, bool(settings.time_compiled_reference))
        if key not in self._refs:
            self._refs[key] = references_for(task, basis=settings.reference,
                                             time_compiled=settings.time_compiled_reference)
        refs = self._refs[key]
        compiled = [r for r in refs if r.kind == "compile"]
        if compiled:
            warmed = self._warm.setdefault(key, set())
            dist = task.distributions[0] if task.distributions else "normal"
            try:
                for si in bench:
                    if si not in warmed:
                        fill_inputs(task, slots[si], dict(task.shapes[si]), 0, dist)
                        warm_up(task.name, compiled, [tuple(slots[si].ins)], 1, self._ops.sync)
                        warmed.add(si)
            except ReferenceCompileError as e:
                if settings.reference == "compile":
                    raise HarnessError(str(e), kind="reference", fix=HARNESS_FIXES["reference"]) from e
                self._refs[key] = refs = [r for r in refs if r.kind != "compile"]
                self._compile_errors[key] = str(e)
            env["reference_compile_mode"] = COMPILE_MODE
            env["reference_compile_s"] = f"{sum(r.compile_s for r in compiled):.3f}"
        if key in self._compile_errors:
            env["reference_compile_error"] = self._compile_errors[key]
        return refs

    def warm(self) -> None:
        """Make the judge's CUDA state before the first candidate: the CUDA context and the
        exchange, and the fused tolerance check's kernels for the common output dtypes (their
        compile is seconds). The GPU actor calls it on a thread of its own as it starts, while
        the first kernels compile; an evaluation that comes first waits for it (one lock).
        Triton loads from its on-disk cache what :mod:`evaluators.judge.prewarm`, begun with the
        command, built already. Our failure raises, as the first evaluation's would."""
        if self.backend != "cuda":
            return
        with self._lock, self._step("warm"):
            with self._span("warm:torch"):
                import torch
            with self._span("warm:exchange"):
                self._cuda_exchange()
            if self._fused is not None:   # the fused check's and the input draw's Triton compiles
                from evaluators.judge.prewarm import kernel_steps, warm_kernels

                warm_kernels(kernel_steps(torch), span=self._span)
            torch.cuda.synchronize()

    def start_runner(self, settings: HarnessSettings, *, sandbox: Any = None) -> bool:
        """Start the first candidate's runner now, in the background (a spare, as between
        candidates), unless one is started or a candidate was evaluated: the GPU actor calls
        it before :meth:`warm`, so that the runner's process and CUDA context come up while
        the judge warms instead of after. True when it started one."""
        with self._lock:
            if self._spare is not None or self._evaluations:
                return False
            self._start_spare(settings, sandbox if sandbox is not None else self._sandbox)
            return True

    def prepare(self, tasks: Sequence[str], settings: HarnessSettings, *, sandbox: Any = None) -> list[str]:
        """Before the first candidates (the GPU actor calls it on its warm-up thread with the
        run's tasks): per task, its shape buffers, its references, and one rehearsal of the
        correctness protocol (one trial per shape) and of the timing loop (two calls) in
        which the task's own eager reference, run here, plays the kernel. Whatever the
        judge's work loads lazily (its CUDA kernels, the fused check's compiles for the
        task's dtypes, the references' first runs) is then loaded before a candidate waits
        on it, and a reference that fails its own task's checks is seen now, as ours. Then
        the first candidate's runner is started (a spare, as between candidates).

        Tasks are taken one at a time under the judge's lock; an evaluation waiting for the
        lock goes first, and a task already evaluated is skipped. Trusted code only: no
        runner, no candidate. Returns the tasks prepared; our failures are logged, not
        raised (the first evaluation meets them again and reports them)."""
        done: list[str] = []
        for name in tasks:
            while self._waiting:   # a candidate is waiting: it goes first
                time.sleep(0.005)
            with self._lock:
                if any(k[0] == name for k in self._refs):
                    continue
                try:
                    with self._step(f"prepare {name}"):
                        self._rehearse(name, settings)
                    done.append(name)
                except Exception as e:  # noqa: BLE001 - our failure; the evaluation reports it
                    log.warning("preparing the judge for task %s failed (its first evaluation will try again): %s",
                                name, str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
                    self._drop_caches()
        with self._lock:
            if self._spare is None and not self._evaluations:
                self._start_spare(settings, sandbox if sandbox is not None else self._sandbox)
        return done

    def _rehearse(self, name: str, settings: HarnessSettings) -> None:
        """One task's :meth:`prepare` (the caller holds the lock)."""
        from evaluators.judge.tasks import load_task

        task = load_task(name, list(settings.task_files))
        cuda = self.backend == "cuda"
        self._workdir.mkdir(parents=True, exist_ok=True)
        tmp = None if cuda else Path(tempfile.mkdtemp(prefix="prepare-", dir=self._workdir))
        ex = self._cuda_exchange() if cuda else HostExchange(tmp / "buffers")
        ops = self._device_ops(settings)
        slots: dict[int, ShapeSlots] = {}
        try:
            for si in range(len(task.shapes)):
                slots[si] = self._slots_for(task, si, ex, cached=cuda)
            if cuda:
                self._free_for_work(task, slots)
            bench = list(range(min(task.bench_shapes, len(task.shapes))))
            refs = self._references(task, settings, slots, bench, {})

            def call(s: ShapeSlots) -> tuple[Done, float]:
                import torch

                t0 = time.perf_counter()
                with torch.no_grad():
                    out = refs[0].fn(*s.ins)
                    for o, r in zip(s.outs, out if isinstance(out, (tuple, list)) else (out,)):
                        o.copy_(r)
                ops.sync()
                ms = (time.perf_counter() - t0) * 1e3
                return Done(0, 0, ms), ms

            seed = secrets.randbits(62)
            res = run_correctness(task, call, slots.__getitem__, trials=1, seed=seed, sync=ops.sync,
                                  fused=self._fused)
            if res.status is Status.OK:
                res = time_shapes(task, call, slots.__getitem__, shape_indices=bench[:1], references=refs,
                                  reps=2, warmup=1, seed=seed, ops=ops, calib=Calibration((0.0, 0.0, 0.0)),
                                  sol_ms=lambda shape: None, basis=settings.reference, fused=self._fused,
                                  pool=ReferencePool())
            if res.status is not Status.OK:
                log.warning("task %s: its own reference, run as the kernel, is %s in %s: %s", name,
                            res.status.value, res.stage, res.reason)
        finally:
            if not cuda:
                for sl in slots.values():
                    free_slots(ex, sl)
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                import torch

                torch.cuda.empty_cache()

    # ----------------------------------------------------------------- one candidate

    def evaluate(self, job: HarnessJob, settings: HarnessSettings, *, sandbox: Any = None,
                 progress: Callable[[dict[str, Any]], None] = lambda p: None) -> HarnessReport:
        """The GPU stages of one built candidate. Raises :class:`HarnessError` for our own
        failures only; everything the candidate does is in the report. ``sandbox``: this
        runner's :class:`~evaluators.sandbox.SandboxSettings` (default: the judge's, else
        from the environment)."""
        t0, behind = time.perf_counter(), self._doing
        with self._waiting_for_lock(), self._step(f"evaluate {job.candidate_id[:12]}", record=False):
            waited = (time.perf_counter() - t0, behind)
            for attempt in (1, 2):
                try:
                    return self._evaluate(job, settings, progress, sandbox if sandbox is not None else self._sandbox,
                                          waited)
                except HarnessError:
                    raise
                except Exception as e:   # our own: the candidate never runs in this process
                    if not _is_oom(e):
                        raise
                    # the judge's memory is ours: everything it keeps goes, then once more
                    self._drop_caches(everything=True)
                    if attempt == 1:
                        log.warning("the judge ran out of device memory evaluating %s; its caches dropped, "
                                    "evaluating again: %s", job.candidate_id[:12], str(e).splitlines()[0][:200])
                        continue
                    raise HarnessError(f"the judge ran out of device memory evaluating {job.candidate_id}, "
                                       f"twice (its caches dropped between): {e}",
                                       fix="free GPU memory (other processes on this GPU) and resume the run",
                                       kind="memory") from e
            raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _step(self, what: str, *, record: bool = True):
        """Mark the lock's holder as doing ``what`` (the caller holds the lock); a set-up step
        (``record``) is kept with its start and end."""
        self._doing, t0 = what, time.time()
        try:
            yield
        finally:
            self._doing = ""
            if record:
                self._setup.append((what, t0, time.time()))

    @contextlib.contextmanager
    def _span(self, what: str):
        """A part of a set-up step, kept with its start and end as the steps are (the warm-up's
        torch import, CUDA exchange, check and draw compiles): which part a first evaluation
        waited behind. The lock's holder stays marked as doing the step."""
        t0 = time.time()
        try:
            yield
        finally:
            self._setup.append((what, t0, time.time()))

    def _waited_env(self, waited: tuple[float, str]) -> dict[str, str]:
        """The env keys of an evaluation that waited for the lock (none when it did not): how
        long and behind what, and, when it waited behind set-up rather than another
        evaluation, the judge's set-up steps until then (epoch seconds)."""
        secs, behind = waited
        if secs < 0.001:
            return {}
        out = {"judge_wait": f"{secs:.3f} s behind {behind or 'the lock'}"}
        if self._setup and not behind.startswith("evaluate"):
            out["judge_setup"] = " ".join(f"{w.replace(' ', ':')}={a:.3f}-{b:.3f}" for w, a, b in self._setup)
        return out

    @contextlib.contextmanager
    def _waiting_for_lock(self):
        """The judge's lock, taken by an evaluation (counted while it waits)."""
        with self._count_lock:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._count_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            self._lock.release()

    def _drop_caches(self, everything: bool = False) -> None:
        """Free the cached shape buffers; ``everything``: the references (compiled ones
        included) and torch's compiled-code caches too, as after an out-of-memory."""
        while self._slots:
            _k, s = self._slots.popitem(last=False)
            free_slots(self._exchange, s)
        if everything:
            self._refs.clear()
            self._warm.clear()
        if self.backend == "cuda":
            import gc

            import torch

            if everything:
                torch._dynamo.reset()
                gc.collect()
            torch.cuda.empty_cache()

    def _evaluate(self, job: HarnessJob, settings: HarnessSettings,
                  progress: Callable[[dict[str, Any]], None], sandbox: Any,
                  waited: tuple[float, str] = (0.0, "")) -> HarnessReport:
        from evaluators.judge.tasks import TaskLoadError, load_task

        t0 = time.monotonic()
        mode = Mode(job.mode)
        seed = secrets.randbits(62) if job.seed is None else int(job.seed)
        try:
            task = load_task(job.task, list(job.task_files or settings.task_files))
        except TaskLoadError as e:
            raise HarnessError(str(e), kind="task", fix=HARNESS_FIXES["task"]) from e
        cuda = self.backend == "cuda"
        ops = self._device_ops(settings)
        self._workdir.mkdir(parents=True, exist_ok=True)
        spare = self._take_spare(sandbox)
        jobdir = spare.jobdir if spare is not None else Path(
            tempfile.mkdtemp(prefix=f"{job.candidate_id[:12]}-", dir=self._workdir))
        ex = self._cuda_exchange() if cuda else HostExchange(jobdir / "buffers")
        so = jobdir / "kernel.so"
        so.write_bytes(job.so_bytes)
        so.chmod(0o500)
        check_shapes = list(job.shapes) if job.shapes is not None else list(range(len(task.shapes)))
        bench = (list(job.bench_shapes) if job.bench_shapes is not None
                 else list(range(min(task.bench_shapes, len(task.shapes)))))
        needed = sorted(set((check_shapes if mode.checks else []) + (bench if mode.times else [])))
        own: list[ShapeSlots] = []
        slots: dict[int, ShapeSlots] = {}
        phases = Phases()
        with phases("env"):   # the driver's clocks, power and temperature for the stored time
            env = _env(task, settings, cuda)
        env.update(self._waited_env(waited))
        if cuda:   # what the judge holds as a candidate starts (a leak shows here, run after run)
            import torch

            held = sum(sl.nbytes for sl in self._slots.values())
            env["judge_memory_gib"] = (f"torch allocated {torch.cuda.memory_allocated() / 2**30:.2f}, "
                                       f"reserved {torch.cuda.memory_reserved() / 2**30:.2f}, "
                                       f"cached buffers {held / 2**30:.2f}")
        runner = base = None
        try:
            with phases("buffers"):
                for si in needed:
                    slots[si] = self._slots_for(task, si, ex, cached=cuda)
                    if not cuda:
                        own.append(slots[si])
                if cuda:
                    self._free_for_work(task, slots, 1 if mode is Mode.PAIRED else 0)
            with phases("references"):
                references = self._references(task, settings, slots, bench, env) if mode.times else []
            runner, calib = self._start_runner(jobdir, slots, settings, env, sandbox, phases=phases,
                                               started=spare)
            spare = None   # the runner now; closed below whatever happens
            if self._evaluations:   # a judge that has evaluated before will likely evaluate again
                self._start_spare(settings, sandbox)
            self._evaluations += 1
            if mode is Mode.PAIRED:
                base = self._start_baseline(job, slots, settings, sandbox, phases, env)
            stages = self._run(task, job, mode, seed, settings, runner, so, slots, calib, ops, references,
                               check_shapes, bench, env, progress, phases, base)
        finally:
            if spare is not None:   # taken, but this evaluation failed before it became the runner
                spare.kill()
            with phases("close"):
                if runner is not None:
                    self._close_later(runner, jobdir)
                if base is not None:
                    self._close_later(base.runner, base.jobdir)
            env["judge_phases"] = phases.dumps()
            for s in own:
                free_slots(ex, s)
            if runner is None:
                shutil.rmtree(jobdir, ignore_errors=True)
            if cuda:   # the evaluation's temporaries back to the driver: the card is shared
                import torch

                torch.cuda.empty_cache()
        return _report(stages, env, time.monotonic() - t0)

    def _launch(self, jobdir: Path, timeout_s: float, sandbox: Any, seccomp: bool, wrap: Sequence[str] = ()) -> Any:
        """Start one runner up to ``READY`` (raises ``RunnerStartError``)."""
        from evaluators.judge.runner_process import RunnerProcess

        if self._start is not None:
            return self._start(jobdir=jobdir, timeout_s=timeout_s, seccomp=seccomp,
                               **({"wrap": tuple(wrap)} if wrap else {}))
        argv = self._runner_argv()
        return RunnerProcess.start(argv if len(argv) > 1 else Path(argv[0]), jobdir=jobdir, sandbox=sandbox,
                                   timeout_s=timeout_s, seccomp=seccomp, cuda_device=self._cuda_device, wrap=wrap)

    def _start_spare(self, settings: HarnessSettings, sandbox: Any) -> None:
        """Start the next candidate's runner in the background (see the module docstring)."""
        from evaluators.sandbox import seccomp_wanted

        if self._spare is not None:
            return
        self._workdir.mkdir(parents=True, exist_ok=True)   # the first thing the judge does may be this
        jobdir = Path(tempfile.mkdtemp(prefix="spare-", dir=self._workdir))
        seccomp = seccomp_wanted()
        self._spare = _Spare(lambda: self._launch(jobdir, settings.timeout_s, sandbox, seccomp),
                             jobdir=jobdir, key=(sandbox, seccomp))

    def _take_spare(self, sandbox: Any) -> "_Spare | None":
        """The spare, if it started and was started for this sandbox; else None (it is killed)."""
        from evaluators.sandbox import seccomp_wanted

        spare, self._spare = self._spare, None
        if spare is None:
            return None
        runner = spare.wait() if spare.key == (sandbox, seccomp_wanted()) else None
        if runner is None or getattr(runner, "returncode", None) is not None:   # not for this sandbox, or gone
            spare.kill()
            return None
        return spare

    def _close_later(self, runner: Any, jobdir: Path) -> None:
        """Close a finished candidate's runner, then delete its job directory unread, on a
        thread: the next candidate's evaluation need not wait for a process to exit."""
        def close() -> None:
            try:
                runner.close()
            finally:
                shutil.rmtree(jobdir, ignore_errors=True)

        t = threading.Thread(target=close, name="evo-runner-close", daemon=True)
        t.start()
        self._closing.append(t)

    def _await_quiet(self) -> None:
        """Return once no runner is starting or exiting (called before anything is timed)."""
        if self._spare is not None:
            self._spare.wait()
        while self._closing:
            self._closing.pop().join()

    def close(self) -> None:
        """Kill the spare runner and wait for the runners being closed (the judge stays
        usable: the next evaluation starts its own runner)."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.kill()
        self._await_quiet()

    def _start_runner(self, jobdir: Path, slots: dict[int, ShapeSlots], settings: HarnessSettings,
                      env: dict[str, str], sandbox: Any, wrap: Sequence[str] = (),
                      phases: Phases | None = None, started: "_Spare | None" = None) -> tuple[Any, Calibration]:
        """A runner with every buffer mapped and its empty call timed; our failure if not.
        ``wrap``: a trusted program started in front of the sandboxed runner (ncu,
        :mod:`evaluators.judge.profile`; :meth:`RunnerProcess.start`). ``started``: a spare
        runner, already up, to use instead of starting one."""
        from evaluators.judge.runner_process import RunnerStartError
        from evaluators.sandbox import seccomp_wanted

        phases = phases if phases is not None else Phases()
        want_seccomp = seccomp_wanted()
        try:
            with phases("runner_start"):
                runner = (started.runner if started is not None
                          else self._launch(jobdir, settings.timeout_s, sandbox, want_seccomp, wrap))
        except RunnerStartError as e:
            raise HarnessError(f"the runner did not start: {e}", kind="runner",
                               fix="run `evo check` on a seed kernel to see the runner's own error") from e
        env["runner"] = "spare (started during the previous candidate's correctness)" if started else "started for it"
        try:
            env["sandbox"] = ", ".join(runner.layers)
            env["runner_backend"] = runner.backend
            with phases("runner_map"):
                for s in slots.values():
                    for b in s.buffers:
                        reply, _ = runner.request(b.map_line(), 30.0)
                        if not isinstance(reply, Mapped) or reply.buf != b.buf:
                            raise HarnessError(f"the runner could not map buffer {b.buf} ({b.nbytes} bytes): "
                                               f"{reply}", kind="runner", fix="see docs/SECURITY.md (the exchange)")
            walls, events = [], []
            ops = self._ops
            t_cal = time.perf_counter()
            for _ in range(NULL_CALLS):
                # as in the timed loop: the judge's own GPU work (a flush) comes first, so each
                # empty call pays the same switch between the two processes' CUDA contexts
                if ops is not None:
                    ops.flush()
                    ops.sync()
                reply, wall = runner.request(protocol.nullcall(), 30.0)
                if not isinstance(reply, Done):
                    raise HarnessError(f"the runner's empty call failed: {reply}", kind="runner")
                walls.append(wall * 1e3)
                events.append(reply.ms)
            phases.add("runner_calibrate", time.perf_counter() - t_cal)
            if want_seccomp:
                with phases("runner_seccomp"):
                    threads = runner.install_seccomp()
                env["seccomp"] = f"seccomp-bpf in the runner ({threads} threads)"
            else:
                env["seccomp"] = "off (EVO_SANDBOX_SECCOMP=0)"
            # the first and last round trips of a fresh process are its slowest: drop both
            return runner, Calibration(tuple(walls[1:-1]), tuple(events[1:-1]))
        except HarnessError:
            runner.kill()
            raise
        except Exception as e:  # noqa: BLE001 - nothing of the candidate is in the runner yet
            tail = runner.stderr_tail()
            runner.kill()
            raise HarnessError(f"the runner failed before the candidate was loaded: {type(e).__name__}: {e}",
                               detail=tail, kind="runner", fix="see the runner's stderr in the detail") from e

    def _start_baseline(self, job: HarnessJob, slots: dict[int, ShapeSlots], settings: HarnessSettings,
                        sandbox: Any, phases: Phases, env: dict[str, str]) -> "_BaselineRunner":
        """The baseline's runner of a ``paired`` job (:class:`Mode`), started and calibrated
        like the candidate's, its binary written beside it (loaded only once the candidate
        passed correctness). Our failure raises, as for the candidate's runner."""
        jobdir = Path(tempfile.mkdtemp(prefix=f"{job.baseline_id[:12]}-baseline-", dir=self._workdir))
        so = jobdir / "kernel.so"
        so.write_bytes(job.baseline_so)
        so.chmod(0o500)
        try:
            runner, calib = self._start_runner(jobdir, slots, settings, {}, sandbox, phases=phases)
        except BaseException:
            shutil.rmtree(jobdir, ignore_errors=True)
            raise
        env["paired_with"] = job.baseline_id
        return _BaselineRunner(runner, calib, so, jobdir)

    @staticmethod
    def _load_baseline(base: "_BaselineRunner", caller: Callable) -> tuple[Baseline | None, str]:
        """The baseline's binary loaded into its runner: ``(Baseline, "")``, or ``(None, why)``
        when it did not load (the candidate is then timed alone; the pairing's error is
        recorded, never held against the candidate)."""
        request, call = caller(base.runner, "the baseline's")
        try:
            reply, _ = request(protocol.load(str(base.so)), "loading the baseline")
        except CallFailed as e:
            return None, f"the baseline did not load: {e.reason}"
        if not isinstance(reply, Loaded):
            return None, f"the baseline did not load: the runner answered {reply}"
        return Baseline(call, base.calib), ""

    def _run(self, task: Any, job: HarnessJob, mode: Mode, seed: int, settings: HarnessSettings, runner: Any,
             so: Path, slots: dict[int, ShapeSlots], calib: Calibration, ops: DeviceOps, references: list[Any],
             check_shapes: list[int], bench: list[int], env: dict[str, str],
             progress: Callable[[dict[str, Any]], None], phases: Phases,
             base: "_BaselineRunner | None" = None) -> list[StageResult]:
        from evaluators.judge.trials import ask

        deadline = time.monotonic() + float(settings.timeout_s)
        scalars = tuple(float(s) for s in task.scalars)
        call_timeout = float(getattr(settings, "call_timeout_s", 10.0))

        def caller(r: Any, whose: str) -> tuple[Callable[[str, str], tuple[Any, float]], Callable]:
            def request(line: str, what: str) -> tuple[Any, float]:
                return ask(r, line, what, deadline=deadline, bound=call_timeout,
                           spent=f"the evaluation's {settings.timeout_s:.0f} s")

            def call(s: ShapeSlots) -> tuple[Done, float]:
                reply, wall = request(protocol.call(s.in_args, s.out_args, scalars), f"{whose} call")
                if not isinstance(reply, Done):
                    raise CallFailed(Status.CRASH, f"the runner answered {reply} to a call")
                return reply, wall * 1e3

            return request, call

        request, call = caller(runner, "the candidate's")

        stages: list[StageResult] = []
        current = "correctness" if mode.checks else "timing"
        try:
            with phases("load"):
                reply, _ = request(protocol.load(str(so)), "loading the kernel")
            if not isinstance(reply, Loaded):
                raise CallFailed(Status.CRASH, f"loading the kernel: the runner answered {reply}")
            if mode.checks:
                with phases("correctness"):
                    stages.append(run_correctness(task, call, slots.__getitem__, trials=settings.trials, seed=seed,
                                                  shape_indices=check_shapes, sync=ops.sync, progress=progress,
                                                  fused=self._fused))
            else:
                stages.append(StageResult("correctness", Status.SKIPPED, "time-only re-confirmation"))
            skip = protocol.timing_after(mode, None if not mode.checks else stages[-1].status.value)
            if skip is not None:
                stages.append(StageResult("timing", Status.SKIPPED, skip))
                return stages
            current = "timing"
            baseline, unpaired = self._load_baseline(base, caller) if base is not None else (None, "")
            self._await_quiet()
            timing = time_shapes(task, call, slots.__getitem__, shape_indices=bench, references=references,
                                 reps=settings.reps, warmup=settings.warmup, seed=seed, ops=ops, calib=calib,
                                 sol_ms=_sol_fn(task, self.backend), basis=settings.reference,
                                 progress=progress, phases=phases, fused=self._fused, pool=self._ref_pool,
                                 draw=self._draw, baseline=baseline)
            if unpaired and timing.status is Status.OK:
                timing = dataclasses.replace(timing, metrics={**timing.metrics, "paired": {"error": unpaired}})
            stages.append(timing)
        except CallFailed as f:
            stages.append(StageResult(current, f.status, f.reason, {}, f.artifacts))
            if current == "correctness":
                stages.append(StageResult("timing", Status.SKIPPED, f"not run: correctness {f.status.value}"))
        return stages


@dataclasses.dataclass(frozen=True)
class _BaselineRunner:
    """A ``paired`` job's second runner: the baseline's, with its calibration, its binary and
    its job directory."""

    runner: Any
    calib: Calibration
    so: Path
    jobdir: Path


class _Spare:
    """A runner being started on a thread of its own, for the judge's next candidate.

    ``wait()`` gives the started runner, or None when its start failed (the failure is the
    judge's to retry: the next evaluation starts a runner itself); ``kill()`` stops it and
    removes its job directory. Made and used by the judge's evaluating thread only."""

    def __init__(self, start: Callable[[], Any], *, jobdir: Path, key: tuple) -> None:
        self.jobdir = jobdir
        self.key = key
        self.runner: Any = None
        self._thread = threading.Thread(target=self._run, args=(start,), name="evo-spare-runner", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], Any]) -> None:
        try:
            self.runner = start()
        except BaseException as e:  # noqa: BLE001 - ours, and retried: the next candidate starts its own
            log.info("the spare runner did not start (the next candidate starts its own): %s", e)

    def wait(self) -> Any:
        self._thread.join()
        return self.runner

    def kill(self) -> None:
        runner = self.wait()
        if runner is not None:
            runner.kill()
        shutil.rmtree(self.jobdir, ignore_errors=True)


def _is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def _sol_fn(task: Any, backend: str) -> Callable[[dict[str, int]], float | None]:
    if backend != "cuda":
        return lambda shape: None
    from evaluators.judge.environment import sol_fn

    return sol_fn(task)


def _env(task: Any, settings: HarnessSettings, cuda: bool) -> dict[str, str]:
    import sys

    if cuda:
        import torch

        from evaluators.judge.environment import env_info

        env = env_info(torch, {"reps": settings.reps, "warmup": settings.warmup, "flush_mb": settings.flush_mb,
                               "trials": settings.trials})
    else:
        import torch

        env = {"gpu": "cpu (host stand-in)", "torch": torch.__version__, "python": sys.version.split()[0],
               "reps": str(settings.reps), "warmup": str(settings.warmup), "trials": str(settings.trials)}
    env.update({"protocol": protocol.PROTOCOL_VERSION, "judge": "separate process from the runner",
                "reference": settings.reference})
    return env


def _report(stages: list[StageResult], env: dict[str, str], seconds: float) -> HarnessReport:
    fitness, timings = None, ()
    timing = next((s for s in stages if s.stage == "timing"), None)
    if timing is not None and timing.status is Status.OK:
        fitness = timing.metrics.get("fitness")
        timings = tuple(ShapeTiming.from_row(r) for r in timing.metrics.get("shapes", []))
    return HarnessReport(stages=tuple(stages), fitness=None if fitness is None else float(fitness),
                         timings=timings, env={str(k): str(v) for k, v in env.items()}, seconds=seconds)
