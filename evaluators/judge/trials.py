"""Correctness, decided by the judge (shared/EVALUATION.md, Correctness).

The same protocol as ever, with every check in the judge's process: for every shape (smallest
first) at least ``trials`` trials with fresh seeds cycling through the task's distributions;
per trial the judge writes fresh inputs into the shape's buffers (same addresses, new values),
keeps copies, poisons the outputs, has the runner call the candidate once, then checks the
inputs unchanged, every output against the ground truth (the reference on upcast copies of
the inputs, computed here and never placed where a runner can see it) and, with a second
poisoned call on the same inputs, determinism.

``call(slots)`` is the one way the candidate runs: it returns the runner's report or raises
:class:`CallFailed` (crash, timeout, an error code). On the CPU the tests pass a function
that computes on the buffers directly, and the same code decides.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

from evaluators.judge.slots import ShapeSlots
from evaluators.protocol import Done
from evo.core.records import StageResult, Status

__all__ = ["CallFailed", "Call", "ask", "cuda_error_name", "check_done", "run_correctness", "fill_inputs",
           "draw_inputs", "draw_into"]


class CallFailed(Exception):
    """The candidate's call did not complete as a call must (the runner died, hung, said
    something outside the protocol, or the call returned an error): ``status`` is the
    stage's verdict (``crash`` or ``timeout``)."""

    def __init__(self, status: Status, reason: str, artifacts: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.artifacts = artifacts or {}


#: call(slots) -> (the runner's report, the judge's wall-clock ms around it)
Call = Callable[[ShapeSlots], "tuple[Done, float]"]

#: The cudaError_t names a kernel most often returns (the rest are shown by number).
_CUDA_ERRORS = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 9: "cudaErrorInvalidConfiguration",
                98: "cudaErrorInvalidDeviceFunction", 200: "cudaErrorInvalidKernelImage",
                209: "cudaErrorNoKernelImageForDevice", 400: "cudaErrorInvalidResourceHandle",
                700: "cudaErrorIllegalAddress", 701: "cudaErrorLaunchOutOfResources",
                702: "cudaErrorLaunchTimeout", 710: "cudaErrorAssert", 715: "cudaErrorIllegalInstruction",
                716: "cudaErrorMisalignedAddress", 719: "cudaErrorLaunchFailure", 720: "cudaErrorCooperativeLaunchTooLarge"}


def cuda_error_name(code: int) -> str:
    return _CUDA_ERRORS.get(int(code), f"cudaError {int(code)}")


def ask(runner: Any, line: str, what: str, *, deadline: float, bound: float, spent: str,
        under: str = "") -> tuple[Any, float]:
    """One request to a runner that has loaded the candidate, its failures as the candidate's
    verdicts: no answer within ``bound`` s (or past ``deadline``, ``time.monotonic()``) is a
    ``timeout``; a runner that died, answered outside the protocol or answered ``ERR`` is a
    ``crash``. ``spent`` names the budget that ran out; ``under`` is added to the reasons (" under
    ncu")."""
    from evaluators.judge.runner_process import RunnerGone, RunnerTimeout
    from evaluators.protocol import Failed, ProtocolViolation

    left = deadline - time.monotonic()
    if left <= 0:
        raise CallFailed(Status.TIMEOUT, f"{what}: {spent} were spent")
    try:
        return_ = runner.request(line, min(bound, left))
    except RunnerTimeout:
        raise CallFailed(Status.TIMEOUT, f"{what}: no answer within {min(bound, left):.1f} s{under} (the kernel "
                                         "hangs or is far too slow); the runner was killed") from None
    except RunnerGone as e:
        raise CallFailed(Status.CRASH, f"{what}: the runner died{under}: {e}", {"stderr": runner.stderr_tail()}) from None
    except ProtocolViolation as e:
        raise CallFailed(Status.CRASH, f"{what}: the runner answered outside the protocol ({e})") from None
    reply, _ = return_
    if isinstance(reply, Failed):
        raise CallFailed(Status.CRASH, f"{what}: {reply.where}: {reply.message}")
    return return_


def check_done(done: Done, where: str) -> Done:
    """``done`` when the call returned success and left no CUDA error, else :class:`CallFailed`."""
    if done.rc != 0:
        raise CallFailed(Status.CRASH, f"{where}: evo_launch returned {cuda_error_name(done.rc)} ({done.rc})")
    if done.last_error != 0:
        raise CallFailed(Status.CRASH, f"{where}: cudaGetLastError after evo_launch: "
                                       f"{cuda_error_name(done.last_error)} ({done.last_error})")
    return done


def fill_inputs(task: Any, slots: ShapeSlots, shape: dict[str, int], seed: int, dist: str,
                keep: bool = True) -> list[Any]:
    """Fresh inputs for ``seed`` written into the shape's input buffers; returns the judge's
    own copies (what the inputs must still be after the call), or ``[]`` without ``keep``."""
    draw_into(task, list(slots.ins), shape, seed, dist)
    return [f.clone() for f in slots.ins] if keep else []


def draw_inputs(task: Any, like: Sequence[Any], shape: dict[str, int], seed: int, dist: str) -> list[Any]:
    """The inputs :func:`fill_inputs` writes for ``seed``, drawn again into new tensors shaped
    ``like`` the buffers: the same generator from the same seed gives the same bits, so the
    judge can re-create, after a call, what the call was given without keeping a copy before
    it (a copy made only before some calls would be a clock signal the candidate could read)."""
    import torch

    bufs = [torch.empty_like(x) for x in like]
    draw_into(task, bufs, shape, seed, dist)
    return bufs


def draw_into(task: Any, bufs: list[Any], shape: dict[str, int], seed: int, dist: str) -> None:
    """The task's own draw for ``seed`` written into ``bufs`` (its generator's bits: what
    ``task.make_inputs`` returns for the seed, in place where it can)."""
    import torch

    dev = bufs[0].device if bufs else torch.device("cpu")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    with torch.no_grad():
        fill = getattr(task.make_inputs, "fill_", None)
        if fill is not None:  # drawn into the buffers in place where it can (TensorInputs.fill_)
            fill(bufs, dict(shape), gen, dist)
            return
        fresh = tuple(task.make_inputs(dict(shape), gen, dist, dev))
        if len(fresh) != len(bufs):
            raise RuntimeError(f"task {task.name}: make_inputs gave {len(fresh)} inputs, {len(bufs)} expected")
        for k, (b, f) in enumerate(zip(bufs, fresh)):
            if tuple(b.shape) != tuple(f.shape) or b.dtype != f.dtype:
                raise RuntimeError(f"task {task.name}: input {k} of shape {shape} is {tuple(f.shape)} {f.dtype} "
                                   f"in one trial and {tuple(b.shape)} {b.dtype} in another: make_inputs must "
                                   "give the same shapes and dtypes for a shape")
            b.copy_(f)
        del fresh


def run_correctness(task: Any, call: Call, slots_for: Callable[[int], ShapeSlots], *, trials: int, seed: int,
                    shape_indices: Sequence[int] | None = None, sync: Callable[[], None] = lambda: None,
                    progress: Callable[[dict[str, Any]], None] = lambda p: None,
                    fused: str | None = None) -> StageResult:
    """The correctness stage: ``ok`` or ``incorrect`` (first failing check, named for a repair
    prompt). Raises :class:`CallFailed` when a call fails (the caller records its status).
    ``fused``: the tolerance check's ``torch.compile`` backend (:func:`evo.tasks.tolerance.check`)."""
    import torch

    from evaluators.judge.checks import (_jsonable, _tolerance_fns, ground_truth, output_dtype, poison_,
                                         same_bits, shape_order, trial_seed, worst_element)

    check, determinism = _tolerance_fns()
    t_start = time.monotonic()
    dists = tuple(task.distributions) or ("normal",)
    n_trials = max(int(trials), len(dists), 1)
    task_dtype = getattr(torch, task.dtype)
    per_shape: list[dict[str, Any]] = []
    calls = 0
    worst_l2 = 0.0

    def fail(reason: str, artifacts: dict[str, str] | None = None) -> StageResult:
        return StageResult("correctness", Status.INCORRECT, reason,
                           {"seed": seed, "calls": calls, "shapes": per_shape, "trials": n_trials},
                           artifacts or {}, time.monotonic() - t_start)

    for si in shape_order(task.shapes, shape_indices):
        shape = dict(task.shapes[si])
        slots = slots_for(si)
        metrics: dict[str, Any] = {"shape": shape, "index": si}
        for t in range(n_trials):
            dist = dists[t % len(dists)]
            where = f"shape {shape} (index {si}), trial {t} ({dist} inputs)"
            saved = fill_inputs(task, slots, shape, trial_seed(seed, si, t), dist)
            with torch.no_grad():
                truth = ground_truth(task, saved, host_fallback=True)
                for o in slots.outs:
                    poison_(o)
            sync()
            progress({"stage": "correctness", "shape": shape, "trial": t, "dist": dist, "step": "call"})
            calls += 1
            check_done(call(slots)[0], where)
            sync()
            for k, (x, s) in enumerate(zip(slots.ins, saved)):
                if not same_bits(x, s):
                    n = int((x.reshape(-1) != s.reshape(-1)).sum())
                    return fail(f"{where}: the kernel modified input {k} ({n} elements changed); "
                                "inputs are read-only (write only into `out`)")
            for k, (o, r) in enumerate(zip(slots.outs, truth)):
                rule = getattr(task, "index_rule", None)
                if rule is not None and not r.is_floating_point():
                    from evaluators.judge.checks import _upcast

                    ok, why, m = rule(_upcast(saved, getattr(torch, task.reference_dtype)), o, r.to(o.device))
                else:
                    ok, why, m = check(o, r, task.tolerance, dtype=output_dtype(r, task_dtype), fused=fused)
                m = _jsonable(m or {})
                if isinstance(m.get("rel_l2"), float) and math.isfinite(m["rel_l2"]):
                    worst_l2 = max(worst_l2, m["rel_l2"])
                metrics[f"out{k}"] = m
                if not ok:
                    per_shape.append(metrics)
                    detail = worst_element(o, r)
                    return fail(f"{where}, output {k}: {why}; {detail}",
                                {"failing_check": f"{where}, output {k}", "worst": detail})
            del truth   # the ground truth is the largest temporary (float64): not kept for the second call
            first = [o.clone() for o in slots.outs]
            with torch.no_grad():
                for o in slots.outs:
                    poison_(o)
            sync()
            progress({"stage": "correctness", "shape": shape, "trial": t, "dist": dist, "step": "determinism call"})
            calls += 1
            check_done(call(slots)[0], f"{where}, determinism call")
            sync()
            for k, (o1, o2) in enumerate(zip(first, slots.outs)):
                same, why, _diff = determinism(o1, o2, task.tolerance)
                if not same:
                    detail = worst_element(o2, o1)
                    return fail(f"{where}, output {k}: {why}; the kernel is nondeterministic, keeps state "
                                f"between calls, or leaves elements unwritten (second call vs first: {detail})",
                                {"failing_check": f"{where}, output {k}, determinism", "worst": detail})
            del saved, first
        per_shape.append(metrics)
    return StageResult("correctness", Status.OK, "",
                       {"seed": seed, "calls": calls, "trials": n_trials, "shapes": per_shape,
                        "max_rel_l2": worst_l2, "distributions": list(dists)},
                       seconds=time.monotonic() - t_start)
