"""The isolated GPU harness: ``python -m evaluators.child.harness JOBDIR`` (spawned by isolation.py).

Runs in a fresh process that owns nothing but one candidate. Steps:

1. read ``JOBDIR/job.json`` (written by :func:`evaluators.isolation.run_isolated`);
2. import the task (user task files first), initialise CUDA on the one visible GPU, turn
   TF32 off, create the harness stream, (a gated job: wait for ``JOBDIR/go``, see
   :func:`_wait_for_gate`; a warm child, started before its candidate existed: see
   :func:`_wait_for_job`), poison the allocator (allocate + fill NaN + free a
   large block back to the driver, so memory a kernel allocates holds NaN, not old results);
   install the seccomp filter (:func:`_confine`: no exec, fork, socket, ptrace... from here
   on, in every thread; failing that, a harness error of kind ``sandbox``);
3. ``ctypes``-load ``JOBDIR/kernel.so`` (``evaluators.child.abi``);
4. correctness (``evaluators.child.correctness``) unless ``time-only``; timing
   (``evaluators.child.timing``) for ``check+time`` / ``time-only`` once correctness passed;
5. write ``result.json`` atomically and exit 0 — a failing candidate is data.

Failure mapping: an exception before the candidate's first call is the harness's own bug:
``error.json`` + exit :data:`~evaluators.child.protocol.HARNESS_BUG_EXIT`. After the first call,
any exception is charged to the candidate as ``crash`` (a sticky CUDA error surfaces at
whatever CUDA call comes next, often in harness code), with the traceback kept as an
artifact. Before each candidate call ``progress.json`` records where we are, so the parent
can say where a hang or a segfault happened.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from evaluators.child.protocol import HARNESS_BUG_EXIT, PROTOCOL_VERSION, stage_to_json
from evo.core.records import StageResult, Status

log = logging.getLogger("evaluators.child.harness")

_POISON_MAX_BYTES = 8 << 30


class _State:
    """Where the child is (for crash attribution) and whether the candidate ever ran."""

    def __init__(self, jobdir: Path) -> None:
        self.jobdir = jobdir
        self.stage = "setup"
        self.candidate_ran = False

    def progress(self, p: dict[str, Any]) -> None:
        self.stage = str(p.get("stage", self.stage))
        if p.get("step", "").endswith("call") or p.get("step") in ("warm-up",):
            self.candidate_ran = True
        _write_json(self.jobdir / "progress.json", p)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class TaskLoadError(RuntimeError):
    """The job's task (or one of its task files) cannot be loaded in this process: our
    failure, reported with ``kind = "task"`` so the parent names the task file as the fix."""


def _load_task(name: str, files: list[str]) -> Any:
    """The task from the built-in tasks plus the user task files ``files`` (a registry of this
    call's own: nothing global changes)."""
    from evo.tasks.registry import BUILTIN_TASKS, UnknownTaskError
    from evo.tasks.user import TaskFileError

    tasks = BUILTIN_TASKS
    for f in files:
        try:
            tasks = tasks.with_files([f])
        except TaskFileError as e:
            raise TaskLoadError(f"task file {f} could not be loaded in the GPU process: {e}") from e
    try:
        return tasks.get(name)
    except UnknownTaskError as e:
        given = ", ".join(files) if files else "none"
        raise TaskLoadError(
            f"unknown task {name!r} in the GPU process (task files given to it: {given}); a user "
            f"task must come from a file in [tasks] files (or evo check --task-file)"
        ) from e


def _nvidia_smi(uuid: str | None, index: str) -> dict[str, str]:
    q = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
    target = uuid or index
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={target}", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    keys = ["driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "power_w", "temp_c"]
    return {k: v for k, v in zip(keys, vals) if v and "N/A" not in v and "Not Supported" not in v}


def _env_info(torch: Any, settings: dict[str, Any]) -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    uuid_s = None
    if uuid is not None:
        uuid_s = str(uuid)
        if not uuid_s.startswith("GPU-"):
            uuid_s = "GPU-" + uuid_s
    env = {
        "gpu": torch.cuda.get_device_name(0),
        "uuid": uuid_s or "",
        "capability": "%d.%d" % torch.cuda.get_device_capability(0),
        "sms": str(props.multi_processor_count),
        "l2_bytes": str(getattr(props, "L2_cache_size", "")),
        "memory_bytes": str(props.total_memory),
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "protocol": PROTOCOL_VERSION,
        "reps": str(settings.get("reps")),
        "warmup": str(settings.get("warmup")),
        "flush_mb": str(settings.get("flush_mb")),
        "trials": str(settings.get("trials")),
    }
    env.update(_nvidia_smi(uuid_s, os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    return env


def _confine() -> str:
    """Install the seccomp filter (:func:`evaluators.sandbox.install_seccomp`) unless the
    user switched it off; returns what was done, for ``env["seccomp"]``.

    Runs after torch, CUDA, the stream and the allocator are set up and right before the
    candidate's ``.so`` is loaded (its static constructors are its first code): nothing
    CUDA needs at initialisation is blocked, and nothing of the candidate runs unfiltered.
    Raises :class:`~evaluators.sandbox.SandboxError` (a harness error of kind ``sandbox``)
    when the filter cannot be installed.
    """
    from evaluators.sandbox import SECCOMP_ENV, install_seccomp, seccomp_wanted

    if not seccomp_wanted():
        log.warning("seccomp is off (%s=0): the candidate may exec, fork and open sockets", SECCOMP_ENV)
        return f"off ({SECCOMP_ENV}=0)"
    return install_seccomp()


def _gpu_state_nvml(uuid: str | None) -> dict[str, str]:
    """Clocks, power and temperature from NVML (``libnvidia-ml.so.1`` through ctypes), with
    the keys of :func:`_nvidia_smi`: the query after timing, when seccomp forbids running
    nvidia-smi. ``{}`` when NVML or the device cannot be reached."""
    import ctypes

    if not uuid:
        return {}
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        if nv.nvmlInit_v2() != 0:
            return {}
    except (OSError, AttributeError):
        return {}
    out: dict[str, str] = {}
    try:
        dev = ctypes.c_void_p()
        if nv.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(dev)) != 0:
            return {}
        v = ctypes.c_uint()
        for key, fn, arg in (("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, 1),      # NVML_CLOCK_SM
                             ("mem_clock_mhz", nv.nvmlDeviceGetClockInfo, 2),     # NVML_CLOCK_MEM
                             ("max_sm_clock_mhz", nv.nvmlDeviceGetMaxClockInfo, 1),
                             ("temp_c", nv.nvmlDeviceGetTemperature, 0)):         # NVML_TEMPERATURE_GPU
            if fn(dev, ctypes.c_int(arg), ctypes.byref(v)) == 0:
                out[key] = str(v.value)
        if nv.nvmlDeviceGetPowerUsage(dev, ctypes.byref(v)) == 0:   # milliwatts
            out["power_w"] = f"{v.value / 1000:.2f}"
    finally:
        nv.nvmlShutdown()
    return out


def _poison_allocator(torch: Any) -> int:
    """Fill a large block with NaN and return it to the driver; returns its size in bytes."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info()
    n = min(int(free * 0.25), _POISON_MAX_BYTES) // 4 * 4
    if n <= 0:
        return 0
    block = torch.empty(n // 4, dtype=torch.float32, device="cuda")
    block.fill_(float("nan"))
    torch.cuda.synchronize()
    del block
    torch.cuda.empty_cache()
    return n


def _wait_for_gate(jobdir: Path, state: _State) -> None:
    """Block until the parent creates ``JOBDIR/go`` (job key ``gate``).

    A timing process is started next to the correctness process so that its start-up
    overlaps the trials; the GPU must see none of its work (allocator poisoning, the
    candidate, the timing) until the correctness process has exited. The parent kills this
    process if correctness fails, and its timeout starts when it opens the gate.
    """
    state.progress({"stage": "setup", "step": "waiting for the correctness process"})
    go = jobdir / "go"
    while not go.exists():
        time.sleep(0.005)


def _wait_for_file(jobdir: Path, name: str, state: _State, step: str, announce: str) -> None:
    """Write ``JOBDIR/announce`` (what this process has done), then block until the parent
    creates ``JOBDIR/name``. A parent that dies meanwhile (the GPU actor's process: the
    sandbox wrapper ``exec``s this one) leaves nobody to give the job or kill this process,
    which then exits at once instead of waiting forever with a CUDA context."""
    state.progress({"stage": "setup", "step": step})
    _write_json(jobdir / announce, {"pid": os.getpid(), "time": time.time()})
    parent = os.getppid()
    go = jobdir / name
    while not go.exists():
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.005)


#: what a warm child prepared from its spec and its job must agree on (evaluators.warm)
_SPEC_KEYS = ("protocol", "task", "task_files", "mode", "bench_shapes")
_SPEC_SETTINGS = ("reference", "time_compiled_reference")


def _wait_for_job(jobdir: Path, spec: dict[str, Any], state: _State) -> dict[str, Any]:
    """A warm child's job (``JOBDIR/spec.json`` at start, no ``job.json``): say ``ready``,
    wait for ``JOBDIR/go``, then read the ``job.json`` and ``kernel.so`` the parent wrote
    before it (evaluators.warm). The child was prepared (imports, CUDA context, task,
    references) for ``spec``; a job for anything else is our bug, never run."""
    _wait_for_file(jobdir, "go", state, "waiting for its job", "ready")
    job = json.loads((jobdir / "job.json").read_text())
    wrong = [k for k in _SPEC_KEYS if job.get(k) != spec.get(k)]
    wrong += [f"settings.{k}" for k in _SPEC_SETTINGS
              if job["settings"].get(k) != spec["settings"].get(k)]
    if wrong:
        raise RuntimeError(f"a warm child prepared for {spec.get('task')!r} ({spec.get('mode')}) got a job "
                           f"that differs in {', '.join(wrong)}")
    return job


def _sol_fn(task: Any) -> Any:
    """shape -> speed-of-light ms for this GPU, or a function returning None (with a warning)."""
    try:
        from evo.tasks.gpus import detect_gpu, speed_of_light_ms
    except ImportError as e:
        log.warning("speed-of-light bound unavailable (%s); SOL check skipped", e)
        return lambda shape: None
    gpu = detect_gpu()
    if gpu is None:
        log.warning("no datasheet spec for this GPU; speed-of-light check skipped")
        return lambda shape: None
    # Rejection needs a bound no legitimate kernel can beat: the vendor's peak bandwidth, not
    # the measured copy roof (good streaming kernels reach or pass a copy's bandwidth; on the
    # H200, nine seeds at 3.00-3.01 ms were wrongly rejected against the 4274 GB/s copy roof).
    return lambda shape: speed_of_light_ms(task, shape, gpu, bandwidth_gbs=gpu.datasheet_bandwidth_gbs)


def _bench_shapes(task: Any, job: dict[str, Any]) -> list[int]:
    """The shape indices the timing stage times: the job's, else the task's first
    ``bench_shapes``."""
    bench = job.get("bench_shapes")
    return list(bench) if bench is not None else list(range(min(task.bench_shapes, len(task.shapes))))


def _prepare_references(task: Any, job: dict[str, Any], settings: dict[str, Any],
                        env: dict[str, str]) -> list[Any] | None:
    """The references the timing stage times (:mod:`evaluators.child.reference`), the
    compiled one already compiled for every benchmark shape; None: eager only.

    Compiling here, before the candidate is loaded and before seccomp, keeps inductor's
    compilers (they exec) outside the confined part and compile time outside every clock.
    A compile failure raises :class:`~evaluators.child.reference.ReferenceCompileError` when
    fitness is against the compiled reference (our failure: the run cannot measure what it
    was asked to); otherwise it is recorded in ``env["reference_compile_error"]`` and only
    the eager reference is timed.
    """
    import torch

    from evaluators.child.reference import COMPILE_MODE, ReferenceCompileError, references_for, warm_up

    basis = str(settings.get("reference") or "eager")
    env["reference"] = basis
    if basis != "compile" and not settings.get("time_compiled_reference"):
        return None
    env["reference_compile_mode"] = COMPILE_MODE
    # Caches in the private temp dir (Landlock lets the child write nowhere else; a cache
    # shared between candidates' processes could be poisoned by one of them), and no compile
    # worker pool: a worker forked now would outlive the seccomp filter installed later.
    tmp = tempfile.gettempdir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tmp, "triton"))
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    bench = _bench_shapes(task, job)
    dev = torch.device("cuda")
    try:
        refs = references_for(task, basis=basis, time_compiled=True)
        with torch.no_grad():
            for si in bench:
                gen = torch.Generator(device=dev)
                gen.manual_seed(int(job["seed"]) + si)
                dist = task.distributions[0] if task.distributions else "normal"
                ins = tuple(task.make_inputs(dict(task.shapes[si]), gen, dist, dev))
                warm_up(task.name, refs[1:], [ins], 1, torch.cuda.synchronize)
                del ins
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except ReferenceCompileError as e:
        if basis == "compile":
            raise
        env["reference_compile_error"] = str(e)
        log.warning("%s; timing against the eager reference only", e)
        return None
    env["reference_compile_s"] = f"{refs[1].compile_s:.3f}"
    return refs


def _crash(stage: str, reason: str, tb: str = "") -> StageResult:
    arts = {"traceback": tb[-4000:]} if tb else {}
    return StageResult(stage, Status.CRASH, reason, {}, arts)


def run_job(jobdir: Path, job: dict[str, Any], state: _State, *, warm: bool = False) -> dict[str, Any]:
    """Do the job; return the result dict. Raises only for harness bugs (before the candidate ran).

    ``warm``: ``job`` is the spec of a child started before its candidate existed: it
    prepares everything that needs no GPU, waits for ``JOBDIR/cuda`` (the GPU actor lets
    it create its CUDA context only when no timing runs: evaluators.gpu_schedule), prepares
    the rest, then waits for its job (:func:`_wait_for_job`)."""
    import torch

    from evaluators.child import abi
    from evaluators.child.correctness import CandidateFault, check_correctness
    from evaluators.child.timing import time_shapes

    settings = job["settings"]
    mode = job["mode"]
    if not torch.cuda.is_available():
        layers = os.environ.get("EVO_SANDBOX_LAYERS", "")
        hint = (f"; inside the sandbox ({layers}): if the GPU works outside it, retry with "
                "EVO_SANDBOX_READS=0 and EVO_SANDBOX_LANDLOCK_FS=0 to find the layer (docs/SECURITY.md)"
                if "landlock" in layers else "")
        raise RuntimeError(
            "the harness child sees no CUDA device (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); run GPU stages on a GPU machine" + hint
        )
    task = _load_task(job["task"], job.get("task_files") or [])
    if warm:
        _wait_for_file(jobdir, "cuda", state, "waiting to start CUDA", "imported")
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    stream = torch.cuda.Stream()
    env = _env_info(torch, settings)
    # Before the gate (off the critical path) and before seccomp (inductor runs compilers):
    references = _prepare_references(task, job, settings, env) if mode in ("check+time", "time-only") else None
    if warm:
        job = _wait_for_job(jobdir, job, state)
        settings = job["settings"]
        env.update({k: str(settings.get(k)) for k in ("reps", "warmup", "flush_mb", "trials")})
    elif job.get("gate"):
        _wait_for_gate(jobdir, state)
    poisoned = _poison_allocator(torch)
    from evaluators.child.device_state import DeviceGuard

    # limits as they are before the candidate ran: timing restores them (evaluators.child.device_state)
    guard = DeviceGuard(int(stream.cuda_stream))
    env["seccomp"] = _confine()
    stages: list[StageResult] = []
    fitness = None
    timings: list[dict[str, Any]] = []

    def release() -> None:
        torch.cuda.synchronize()
        _poison_allocator(torch)

    try:
        kernel = abi.load_kernel(jobdir / job["so"])
    except abi.KernelLoadError as e:
        stages.append(_crash("correctness", str(e)))
        stages.append(StageResult("timing", Status.SKIPPED, "not run: kernel did not load"))
        return {"stages": [stage_to_json(s) for s in stages], "env": env}

    scalars = tuple(float(s) for s in task.scalars)
    handle = int(stream.cuda_stream)

    def launch(ins: Any, outs: Any) -> None:
        state.candidate_ran = True
        rc = kernel.launch(ins, outs, scalars, handle)
        if rc != 0:
            raise CandidateFault(Status.CRASH, f"evo_launch returned {kernel.error_name(rc)} ({rc})")
        err = kernel.last_error()
        if err:
            raise CandidateFault(Status.CRASH, f"cudaGetLastError after evo_launch: "
                                 f"{kernel.error_name(err)} ({err})")

    seed = int(job["seed"])
    current = "correctness"
    try:
        with torch.cuda.stream(stream):
            if mode == "time-only":
                stages.append(StageResult("correctness", Status.SKIPPED, "time-only re-confirmation"))
            else:
                res = check_correctness(
                    task, launch, device="cuda", trials=int(settings["trials"]), seed=seed,
                    shape_indices=job.get("shapes"), sync=torch.cuda.synchronize,
                    release=release, progress=state.progress,
                )
                res = StageResult(res.stage, res.status, res.reason,
                                  {**res.metrics, "allocator_poison_bytes": poisoned},
                                  res.artifacts, res.seconds)
                stages.append(res)
            if mode in ("check+time", "time-only") and stages[-1].status in (Status.OK, Status.SKIPPED):
                current = "timing"
                bench = _bench_shapes(task, job)
                release()
                tres = time_shapes(
                    task, kernel, shape_indices=bench, scalars=scalars,
                    warmup=int(settings["warmup"]), reps=int(settings["reps"]),
                    flush_mb=int(settings["flush_mb"]), seed=seed, stream=stream,
                    sol_ms=_sol_fn(task), progress=state.progress, device_guard=guard,
                    references=references, basis=str(settings.get("reference") or "eager"),
                )
                state.candidate_ran = True
                stages.append(tres)
                if tres.status is Status.OK:
                    fitness = tres.metrics.get("fitness")
                    timings = [
                        {k: r[k] for k in ("shape", "median_ms", "iqr_ms", "ref_median_ms",
                                           "ref_iqr_ms", "speedup", "sol_ms", "compile_ref_median_ms",
                                           "compile_ref_iqr_ms", "compile_speedup") if k in r}
                        for r in tres.metrics.get("shapes", [])
                    ]
            elif mode != "check":
                stages.append(StageResult("timing", Status.SKIPPED,
                                          f"not run: correctness {stages[-1].status.value}"))
            else:
                stages.append(StageResult("timing", Status.SKIPPED, "check-only mode"))
    except CandidateFault as f:
        stages.append(StageResult(current, f.status, f.reason))
    except Exception as e:  # noqa: BLE001 - attribution rule in the module docstring
        if not state.candidate_ran:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        stages.append(_crash(current, f"{type(e).__name__} after the kernel ran "
                                      f"({state.stage}): {msg}", traceback.format_exc()))
    if any(s.stage == "timing" and s.status is not Status.SKIPPED for s in stages):
        # nvidia-smi cannot run under seccomp (no exec): NVML in this process instead
        after = _gpu_state_nvml(env.get("uuid") or None)
        env.update({f"{k}_after_timing": v for k, v in after.items() if k != "driver"})
    if stages and stages[-1].stage == "correctness":
        stages.append(StageResult("timing", Status.SKIPPED,
                                  f"not run: correctness {stages[-1].status.value}"))
    return {
        "protocol": PROTOCOL_VERSION,
        "stages": [stage_to_json(s) for s in stages],
        "fitness": fitness,
        "timings": timings,
        "env": env,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m evaluators.child.harness JOBDIR", file=sys.stderr)
        return 2
    jobdir = Path(argv[0])
    faulthandler.enable()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s harness %(levelname)s %(message)s")
    state = _State(jobdir)
    t0 = time.monotonic()
    try:
        warm = not (jobdir / "job.json").exists()   # a warm child: its job comes later
        job = json.loads((jobdir / ("spec.json" if warm else "job.json")).read_text())
        result = run_job(jobdir, job, state, warm=warm)
    except BaseException as e:  # noqa: BLE001 - harness bug: report, exit nonzero
        from evaluators.sandbox import SandboxError

        from evaluators.child.reference import ReferenceCompileError

        kind = ("task" if isinstance(e, TaskLoadError) else "sandbox" if isinstance(e, SandboxError)
                else "reference" if isinstance(e, ReferenceCompileError) else "bug")
        if "sees no CUDA device" in str(e):
            kind = "cuda"
        _write_json(jobdir / "error.json",
                    {"error": f"{type(e).__name__}: {e}", "kind": kind,
                     "traceback": traceback.format_exc()})
        sys.stderr.flush()
        os._exit(HARNESS_BUG_EXIT)
    result["seconds"] = time.monotonic() - t0
    _write_json(jobdir / "result.json", result)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: after a CUDA fault, freeing device memory can hang or abort.
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover - entry point
    main()
