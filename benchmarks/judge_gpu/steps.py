"""What each step of the judge's correctness and timing loops costs on a GPU (GPU machine only).

For each task's largest shape: the judge's own steps (fresh inputs, the kept copies, the
float64 ground truth, the tolerance check at three chunk sizes (its lean and full passes, with
rows saying whether they agree, and again with one NaN in the output and with the poison of
an unwritten output), the inputs-unchanged check, the
determinism check, the poison scan of a timed call), each timed with a device synchronise
around it, median of ``--reps``. The candidate is stood in by the eager reference (written
into the output buffer), so no runner is involved: this measures the judge alone.

    python3 benchmarks/judge_gpu/steps.py [--tasks kb19_relu kb23_softmax] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def agree(name: str, shape: dict, what: str, lean: list, full: list) -> None:
    """Rows saying whether the lean tolerance check gave the full one's verdicts (ok and
    reason) and its metrics bit for bit (``repr``: -0.0 and NaN count)."""
    verdicts = all(a[:2] == b[:2] for a, b in zip(lean, full))
    metrics = all(repr(a[2]) == repr(b[2]) for a, b in zip(lean, full))
    print(f"| {name} | {shape} | lean == full, {what}: verdict and reason | {verdicts} |", flush=True)
    print(f"| {name} | {shape} | lean == full, {what}: every metric, bit for bit | {metrics} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["kb19_relu", "kb23_softmax"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", type=int, default=None,
                    help="shape index (default: the largest; with --cpu the smallest)")
    ap.add_argument("--cpu", action="store_true", help="host buffers, no GPU (checks the script itself)")
    ap.add_argument("--fused", default=None, help="fused backend of the check: triton (the default on a GPU; on "
                    "the CPU with TRITON_INTERPRET=1) or a torch.compile backend (inductor; aot_eager on the CPU)")
    args = ap.parse_args()
    import torch

    from evaluators.judge.checks import ground_truth, output_dtype, poison_, same_bits
    from evaluators.judge.exchange import IpcExchange
    from evaluators.judge.slots import free_slots, make_slots, probe_specs
    from evaluators.judge.timing import _sanity
    from evaluators.judge.trials import fill_inputs
    from evo.tasks.registry import get_task
    from evo.tasks.tolerance import check, check_deterministic

    if args.cpu:
        import tempfile

        from evaluators.judge.exchange import HostExchange

        ex = HostExchange(Path(tempfile.mkdtemp()))
        torch.cuda.synchronize = lambda: None
    else:
        ex = IpcExchange()
    print(f"{'cpu' if args.cpu else torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("| task | shape | step | median ms |\n|---|---|---|---|")
    for name in args.tasks:
        task = get_task(name)
        pick = min if args.cpu else max    # the host has no room for the largest float64 truths
        si = args.shape if args.shape is not None else pick(range(len(task.shapes)),
                                                             key=lambda i: sum(task.shapes[i].values()))
        shape = dict(task.shapes[si])
        ins, outs = probe_specs(task, shape, ex.device)
        slots = make_slots(ex, ins, outs)
        dist = task.distributions[0]
        dt = getattr(torch, task.dtype)

        def timed(step, fn):
            xs = []
            for _ in range(args.reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                r = fn()
                torch.cuda.synchronize()
                xs.append((time.perf_counter() - t0) * 1e3)
            print(f"| {name} | {shape} | {step} | {statistics.median(xs):.1f} |", flush=True)
            return r

        with torch.no_grad():
            timed("fill inputs (no copy kept)", lambda: fill_inputs(task, slots, shape, 1, dist, keep=False))
            saved = timed("fill inputs + kept copy", lambda: fill_inputs(task, slots, shape, 1, dist, keep=True))
            truth = timed("float64 ground truth", lambda: ground_truth(task, saved))
            eager = task.reference(*slots.ins)
            eager = tuple(eager) if isinstance(eager, (tuple, list)) else (eager,)
            timed("poison outputs", lambda: [poison_(o) for o in slots.outs])
            for o, e in zip(slots.outs, eager):
                o.copy_(e)
            def lean_vs_full(what: str, label: str, **kw) -> None:
                """The full then the lean check of the outputs as they are, timed; rows saying
                whether they agree."""
                res = {lean: timed(f"tolerance check, {'lean' if lean else 'full'}, {what}",
                                   lambda lean=lean: [check(o, r, task.tolerance, dtype=output_dtype(r, dt), lean=lean, **kw)
                                                      for o, r in zip(slots.outs, truth)])
                       for lean in (False, True)}
                agree(name, shape, label, res[True], res[False])

            for chunk in (1 << 21, 1 << 23, 1 << 26):   # 2^21: a lean chunk's temporaries fit in L2
                label = f"chunk 2^{chunk.bit_length() - 1}"
                lean_vs_full(label, label, chunk=chunk)
            if slots.outs and slots.outs[0].is_floating_point() and slots.outs[0].numel():    # a failing output: one NaN, its chunk checked in full
                flat = slots.outs[0].view(-1)
                mid = flat.numel() // 2
                keep = flat[mid].clone()
                flat[mid] = float("nan")
                lean_vs_full("one NaN in the output", "one NaN")
                flat[mid] = keep
            for o in slots.outs:          # an unwritten output: the poison everywhere
                poison_(o)
            lean_vs_full("poisoned (unwritten) output", "poisoned")
            for o, e in zip(slots.outs, eager):
                o.copy_(e)
            if not args.cpu or args.fused:
                be = args.fused or "triton"
                t0 = time.perf_counter()   # the first fused check compiles: timed apart
                first_fused = [check(o, r, task.tolerance, dtype=output_dtype(r, dt), fused=be)
                               for o, r in zip(slots.outs, truth)]
                torch.cuda.synchronize()
                print(f"| {name} | {shape} | tolerance check, fused ({be}), first call incl. compile | "
                      f"{(time.perf_counter() - t0) * 1e3:.1f} |", flush=True)
                eager_v = [check(o, r, task.tolerance, dtype=output_dtype(r, dt)) for o, r in zip(slots.outs, truth)]
                same = all(a[0] == b[0] and a[1] == b[1] for a, b in zip(first_fused, eager_v))
                print(f"| {name} | {shape} | fused verdict == eager verdict | {same} |", flush=True)
                from evo.tasks import tolerance as _tol

                print(f"| {name} | {shape} | fused backend fell back to eager (compile or self-check failed) | "
                      f"{_tol._FUSED_BROKEN} |", flush=True)
                timed(f"tolerance check, fused ({be})",
                      lambda: [check(o, r, task.tolerance, dtype=output_dtype(r, dt), fused=be)
                               for o, r in zip(slots.outs, truth)])
            timed("inputs unchanged (same_bits)", lambda: [same_bits(x, s) for x, s in zip(slots.ins, saved)])
            first = timed("copy of the outputs", lambda: [o.clone() for o in slots.outs])
            timed("determinism (bitwise equal)",
                  lambda: [check_deterministic(a, b, task.tolerance) for a, b in zip(first, slots.outs)])
            timed("timed-call sanity (poison scan + sample)", lambda: _sanity(task, slots.outs, eager, seed=3))
            timed("eager reference", lambda: task.reference(*slots.ins))
        del saved, truth, eager, first
        free_slots(ex, slots)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
