"""The cascade's shared records: the stage settings and the error that means "ours".

The cascade is: policy (static, ms) -> compile (CPU worker, cached) -> correctness and
timing (GPU, one fresh process per candidate) -> profile (delayed, survivors only). Each
stage turns a candidate into a :class:`~evo.core.records.StageResult`; a candidate's failure is a
result with a non-ok status, never an exception. Exceptions mean *our* failure (nvcc
missing, the GPU gone, a bug) and propagate.

The stages' contracts as the engine drives them are the Protocols in :mod:`evo.engine.seams`
(``CompileFn``, ``EvaluateFn``, ``ProfileFn``); this package never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from evo.core.settings import config_key

__all__ = ["CompileSettings", "HarnessSettings", "InfrastructureError"]


class InfrastructureError(RuntimeError):
    """Our failure, not the candidate's: a harness bug, a task that cannot be loaded in the
    evaluating process, a missing toolchain, a full disk.

    Raised by stage implementations (compile, GPU harness, profiler); the engine stops the
    run at the first one (status ``failed``, resumable) instead of charging candidates or
    retrying: every later candidate would meet the same failure. ``fix`` says what the user
    can do; ``detail`` carries the long form (a traceback) for the log, never the terminal.
    """

    def __init__(self, message: str, *, fix: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.fix = fix
        self.detail = detail

    def __reduce__(self):  # keep fix/detail across pickling (Ray ships exceptions)
        return (_rebuild_infra, (type(self), str(self), self.fix, self.detail))

    def one_line(self) -> str:
        """The message and the fix on one line: what the CLI prints."""
        first = str(self).strip().splitlines()[0] if str(self).strip() else type(self).__name__
        return f"{first}; {self.fix}" if self.fix else first


def _rebuild_infra(cls, message: str, fix: str, detail: str) -> "InfrastructureError":
    return cls(message, fix=fix, detail=detail)


@dataclass(frozen=True)
class CompileSettings:
    """How candidates are built: the record of config section ``[compile]`` (its keys are
    the ``config_key`` fields, :mod:`evo.core.settings`; the others are set by code).

    ``arch``: nvcc's target. ``timeout_s``: wall clock of one nvcc run (its process group is
    killed after). ``memory_mb``: address-space limit of each nvcc process (0 = none; the
    config allows 512 up, the byte count must fit the limit wrapper). ``cache_dir``: the
    content-addressed compile cache. ``nvcc``: executable name or path. ``extra_flags``:
    appended to nvcc's command line (and to the key of the cache).
    """

    arch: str = config_key("sm_90a", pattern=r"^sm_\d+a?$")
    timeout_s: float = config_key(300.0, gt=0, le=86400)
    memory_mb: int = config_key(8192, ge=512, le=1048576)
    cache_dir: str = config_key(".evo/cache", path=True)
    nvcc: str = "nvcc"
    extra_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessSettings:
    """How a built candidate is checked and timed on a GPU: the record of config section
    ``[evaluator]`` (its keys are the ``config_key`` fields; the others are set by code).
    It travels into the isolated child as JSON (``dataclasses.asdict``), so every field is
    a plain value.

    ``trials``: fresh-seed correctness trials per shape (>= 5 by the contract).
    ``warmup`` / ``reps``: timing warm-up calls and timed calls per shape (median reported).
    ``flush_mb``: bytes written to flush L2 before every timed call.
    ``timeout_s``: wall clock for the whole isolated process; its group is killed after.
    ``check_only``: skip timing (used by ``evo check`` and the self-test).
    ``fresh_timing_process``: ``check+time`` times in a second fresh process after the
    correctness process passed (``False``: both stages in one process, one start-up less but
    memory-bound timings up to ~11% slow on an H200; see docs/evaluator.md).
    ``timeout_s`` applies to each process.
    ``task_files``: absolute paths of the user task files of the run; every isolated child
    (correctness, timing, profile, tuning trials, confirmation) imports them before it looks
    its task up, so user tasks are known wherever a candidate is evaluated.
    """

    trials: int = config_key(5, ge=5)
    warmup: int = config_key(10, ge=1)
    reps: int = config_key(50, ge=10)
    flush_mb: int = config_key(256, ge=64)
    timeout_s: float = config_key(300.0, gt=0)
    check_only: bool = False
    device: int = 0
    fresh_timing_process: bool = config_key(True)
    task_files: tuple[str, ...] = ()
    #: Per-child timeouts (s) for the correctness (``check``) and the timing process, set by
    #: the GPU actor from this task's own history (:mod:`evaluators.timeouts`); None: use
    #: ``timeout_s``, which stays the upper bound of both.
    timeout_check_s: float | None = None
    timeout_time_s: float | None = None
    #: Why the per-child timeouts have their values (quoted in a timeout's reason).
    timeout_note: str = ""
    #: What fitness is measured against: the task's reference run eagerly, or under
    #: ``torch.compile`` (:mod:`evaluators.child.reference`; compiled before the candidate
    #: is loaded, warm-up outside the clock). Every timing records which, and both speedups
    #: when both were timed.
    reference: str = config_key("eager", pattern=r"^(eager|compile)$")
    #: Also time the compiled reference when fitness is against eager (``evo bench`` sets
    #: it): the timing then carries both speedups.
    time_compiled_reference: bool = False
    #: Correctness processes of different candidates that may share one GPU at once (the GPU
    #: actor's schedule, evaluators.gpu_schedule; they are not timed). Timing always has
    #: the GPU alone. Default 1 (one at a time, the protocol measured on the H200) until
    #: benchmarks/throughput.py has measured more on a GPU.
    check_concurrency: int = config_key(1, ge=1, le=16)
    #: Harness processes the GPU actor keeps started and waiting per task and process kind
    #: (correctness, timing), so a candidate's process start-up is off the critical path
    #: (evaluators.warm); 0: every process starts when its candidate arrives. Default 0
    #: (the start-up path measured on the H200) until benchmarks/throughput.py has measured
    #: warm children on a GPU; tested on the CPU with stand-in children.
    warm_children: int = config_key(0, ge=0, le=8)
    #: Who runs the candidate and who decides: ``"harness"`` (one isolated Python process
    #: loads the candidate and computes its own verdict, the path measured so far) or
    #: ``"judge"`` (the judge, a trusted process that never loads candidate code, decides
    #: every verdict and drives a small sandboxed runner per candidate: evaluators.judge).
    #: Default ``"harness"`` until a GPU run has passed issue 40's acceptance.
    isolation: str = config_key("harness", pattern=r"^(harness|judge)$")
    #: The run's tasks, which the GPU actor's judge prepares before its first candidate
    #: (:meth:`evaluators.judge.judge.Judge.prepare`; set by ``evo search``, not a config key).
    warm_tasks: tuple[str, ...] = ()
    #: With the judge: longest wait for one call of the candidate, s (a hang is killed and
    #: recorded after this; the whole evaluation stays bounded by ``timeout_s``).
    call_timeout_s: float = config_key(10.0, gt=0)
