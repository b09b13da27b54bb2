"""The cascade's shared records: the stage settings and the error that means "ours".

The cascade is: policy (static, ms) -> compile (CPU worker, cached) -> correctness and
timing (GPU: decided by the judge, the candidate run in a fresh sandboxed runner) -> profile
(delayed, survivors only). Each
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
    """Our failure, not the candidate's: a bug of the judge, a task that cannot be loaded in
    the evaluating process, a missing toolchain, a full disk.

    Raised by stage implementations (compile, the judge, profiler), and believed only from a
    process that never loaded candidate code; the engine stops the
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
    The judge (:mod:`evaluators.judge`) reads it; every field is a plain value.

    ``trials``: fresh-seed correctness trials per shape (>= 5 by the contract).
    ``warmup`` / ``reps``: timing warm-up calls and timed calls per shape (median reported).
    ``flush_mb``: bytes written to flush L2 before every timed call.
    ``timeout_s``: wall clock for one whole evaluation (the runner's start, every call, the
    checks); its runner is killed after.
    ``check_only``: skip timing (used by ``evo check`` and the self-test).
    ``task_files``: absolute paths of the user task files of the run; the judge imports them
    before it looks a task up (correctness, timing, profile, tuning trials, confirmation), so
    user tasks are known wherever a candidate is evaluated.
    """

    trials: int = config_key(5, ge=5)
    warmup: int = config_key(10, ge=1)
    reps: int = config_key(50, ge=10)
    flush_mb: int = config_key(256, ge=64)
    timeout_s: float = config_key(300.0, gt=0)
    check_only: bool = False
    task_files: tuple[str, ...] = ()
    #: What fitness is measured against: the task's reference run eagerly, or under
    #: ``torch.compile`` (:mod:`evaluators.judge.reference`; compiled by the judge before the
    #: candidate's runner starts, warm-up outside the clock). Every timing records which, and
    #: both speedups when both were timed.
    reference: str = config_key("eager", pattern=r"^(eager|compile)$")
    #: Also time the compiled reference when fitness is against eager (``evo bench`` sets
    #: it): the timing then carries both speedups.
    time_compiled_reference: bool = False
    #: The run's tasks, which the GPU actor's judge prepares before its first candidate
    #: (:meth:`evaluators.judge.judge.Judge.prepare`; set by ``evo search``, not a config key).
    warm_tasks: tuple[str, ...] = ()
    #: Longest wait for one call of the candidate, s (a hang is killed and recorded after
    #: this; the whole evaluation stays bounded by ``timeout_s``).
    call_timeout_s: float = config_key(10.0, gt=0)
