"""The judge's Triton kernels compiled into Triton's on-disk cache by a process of their own,
begun at ``evo search``'s entry, so that the judge's warm-up finds them built.

The judge's warm-up (:meth:`evaluators.judge.judge.Judge.warm`) compiles the fused tolerance
check and the timed calls' input draw before the first candidate may be judged; on a machine
whose Triton cache is empty (a user's first run) those compiles are seconds on the first
verdict's path, and the judge starts them only once Ray and its GPU actor are up. This child
starts with the command, beside the early Ray start (:mod:`evo.engine.early_ray`), compiles
the same kernels (:func:`warm_kernels`, here in the reverse order, so that where the judge
begins before the child is done the two meet in the middle rather than build the same kernel
twice) and exits; Triton keys its cache by kernel, specialisation and target, so the judge's
process loads what the child built. The kernels' list (:func:`kernel_steps`, :func:`warm_checks`)
is this module's, and the judge's warm-up runs the same list in its own order.

Trusted code only (our kernels, never a candidate's), and nothing depends on it: it has no
output, a failure of any kind (no CUDA, no Triton, a compile error) ends it quietly, and the
judge then compiles what it needs itself. The command kills it at exit if it still runs.

    python -m evaluators.judge.prewarm      (exit status 0 whatever happened)
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any, Callable, Sequence

__all__ = ["WARM_SIZES", "warm_checks", "warm_kernels", "kernel_steps", "begin_prewarm", "end_prewarm", "main"]

log = logging.getLogger(__name__)

#: Element counts the warm-up checks with: Triton compiles a kernel once per specialisation of
#: its integer arguments, and an element count divisible by 16 is another specialisation than
#: one that is not (the correctness shapes are sizes like 129 x 1031; the timing shapes are
#: powers of two), so both are compiled before the first candidate waits on them.
WARM_SIZES = (1 << 12, (1 << 12) + 13)


def warm_checks(*kinds: tuple[Any, Any]) -> list[tuple[int, Any, Any]]:
    """``(element count, dtype, tolerance)`` of each warm-up check: every size of
    :data:`WARM_SIZES` for every ``(dtype, tolerance)`` of ``kinds``."""
    return [(n, dt, tol) for dt, tol in kinds for n in WARM_SIZES]


def kernel_steps(torch: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The judge's Triton compiles as ``(span, step)`` pairs in the judge's order: the fused
    check for each (dtype, tolerance) of the common outputs at each warm-up size, then the
    timed calls' input draw for float32 and bfloat16 (its self-check compiles and runs it)."""
    from evaluators.judge.fill import self_check_once
    from evo.tasks.tolerance import BF16_ELEMENTWISE, FP32_ELEMENTWISE, check

    def one_check(n: int, dt: Any, tol: Any) -> Callable[[], Any]:
        def run() -> Any:
            ref = torch.linspace(-1.0, 1.0, n, device="cuda", dtype=torch.float64)
            return check(ref.to(dt), ref, tol, dtype=dt, fused="triton")
        return run

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("warm:checks", one_check(n, dt, tol))
        for n, dt, tol in warm_checks((torch.float32, FP32_ELEMENTWISE), (torch.bfloat16, BF16_ELEMENTWISE))]
    steps += [("warm:draws", lambda dt=dt: self_check_once("cuda", dt, "normal"))
              for dt in (torch.float32, torch.bfloat16)]
    return steps


def warm_kernels(steps: Sequence[tuple[str, Callable[[], Any]]], *, reverse: bool = False,
                 span: Callable[[str], Any] | None = None) -> None:
    """Run ``steps`` (:func:`kernel_steps`), in reverse when ``reverse``, each consecutive run
    of one span's steps inside ``span(name)`` (a context manager; the judge's records which
    part a first evaluation waited behind). Raises what a step raises."""
    import contextlib

    ordered = list(reversed(steps)) if reverse else list(steps)
    i = 0
    while i < len(ordered):
        name = ordered[i][0]
        with (span(name) if span is not None else contextlib.nullcontext()):
            while i < len(ordered) and ordered[i][0] == name:
                ordered[i][1]()
                i += 1


def begin_prewarm(*, secret_env: Sequence[str] = (), popen: Callable[..., Any] = subprocess.Popen) -> Any:
    """Start ``python -m evaluators.judge.prewarm`` in the background and return its process
    (None when it could not start: nothing depends on it). The caller decides that a local GPU
    will judge this run (``evo search`` does where it begins a local Ray instance at entry).

    The child gets the command's environment without its secrets (every name
    :func:`evaluators.sandbox.environment.secret_names` finds, and ``secret_env``: the LLM
    models' ``key_env`` names), as Ray's processes do: the driver alone holds a key."""
    try:
        from evaluators.sandbox.environment import secret_names

        env = dict(os.environ)
        for name in secret_names(env, extra=tuple(secret_env)):
            env.pop(name, None)
        return popen([sys.executable, "-m", "evaluators.judge.prewarm"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    except Exception as e:  # noqa: BLE001 - nothing depends on the child (an environment read mid-change included)
        log.debug("the judge's kernel prewarm did not start: %s", e)
        return None


def end_prewarm(proc: Any) -> None:
    """Kill ``proc`` (:func:`begin_prewarm`'s) if it still runs, and reap it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:   # pragma: no cover - a killed process is reaped at once
        pass


def main() -> int:
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return 0
        warm_kernels(kernel_steps(torch), reverse=True)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - nothing depends on this process: the judge compiles what it lacks
        log.debug("prewarm stopped: %s", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
