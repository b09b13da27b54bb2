"""Does a kernel's timed speed depend on what its process did before? (diagnostic, GPU only)

    python benchmarks/lab/timing_state.py --task gelu_bf16 [--param ITEMS=2 ...] [--reps 30] [--trace]
    python benchmarks/lab/timing_state.py --task gelu_bf16 --offsets [--variant ITEMS=4 ...]

Why it exists: timed right after the correctness trials in the same process, memory-bound
kernels (and torch's references) measured up to 11% slower than in a fresh process; this is
what made ``check+time`` time in a process of its own (docs/evaluator.md, "Timing in a fresh
process"). The script runs in one process set up like the harness child (TF32 off, harness
stream, poisoned allocator) and times the task's first benchmark shape in three states:

  fresh                  nothing ran before;
  checked                after the real correctness stage and the harness's release step
                         (where the timing stage of the one-process protocol starts);
  checked, extra first   the same, but the extra measurements below run before the timing stage.

In each state: the real timing stage (``evaluators.child.timing.time_shapes``: ours and the torch
reference) twice in a row, each with new buffers; a plain ``copy_`` of the input; ours with a
~100 us GPU spin queued before the start event (hides a host-side launch gap); ours by a plain
loop; the host time of one ``evo_launch``; SM / memory clocks; where the output lay relative
to the input. ``--trace`` first traces a 256 MB memset's bandwidth for 1.5 s after several
kinds of frees. ``--offsets`` instead times the kernel, each ``--variant`` and ``copy_`` with
the output at fixed distances from the input in one pool. A short table is printed last; JSON
goes to ``--out``. Nothing here changes the harness; it only measures.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("benchmarks.lab.timing_state")


def _clocks() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return r.stdout.strip().replace(",", "")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"n/a ({e})"


def _kernel(task: str, params: dict[str, str], out: Path):
    """The task's seed with ``params`` as tunables, compiled (cached) and loaded."""
    from evaluators import abi
    from evaluators.base import CompileSettings
    from evaluators.compile import compile_candidate
    from evo.core.records import Candidate, Operator
    from evo.tasks.seeds import seed_source

    c = Candidate.create(task, seed_source(task), params, operator=Operator.SEED)
    b = compile_candidate(c, CompileSettings(cache_dir=str(ROOT / ".evo" / "cache")))
    if not b.ok:
        raise SystemExit(f"compile of {task} {params} failed: {b.result.reason}")
    path = out / f"{c.id[:16]}.so"
    path.write_bytes(b.so_bytes)
    try:
        return abi.load_kernel(path)
    finally:
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="gelu_bf16")
    ap.add_argument("--param", action="append", default=[], help="tunable NAME=VALUE (repeatable)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("runs/timing_state"))
    ap.add_argument("--offsets", action="store_true",
                    help="only time the kernel (and copy_) with the output at fixed distances from the input")
    ap.add_argument("--variant", action="append", default=[],
                    help="with --offsets: another tunable set A=1,B=2 timed at the same placements")
    ap.add_argument("--trace", action="store_true",
                    help="first trace a memset's bandwidth over 1.5 s after freeing memory in several ways")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from evaluators.judge.checks import check_correctness
    from evaluators.child.harness import _poison_allocator
    from evaluators.judge.summary import median, time_shapes
    from evo.tasks import get_task

    task = get_task(args.task)
    params = dict(p.split("=", 1) for p in args.param)

    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stream = torch.cuda.Stream()
    _poison_allocator(torch)
    kernel = _kernel(task.name, params, args.out)
    scalars = tuple(float(s) for s in task.scalars)
    handle = int(stream.cuda_stream)

    ptrs: list[tuple[int, int]] = []   # (first input, first output) of every launch, in order

    class Recording:
        """The kernel, noting where each launch reads and writes (placement may matter)."""

        def __getattr__(self, name):
            return getattr(kernel, name)

        def launch(self, ins, outs, *a, **k):
            ptrs.append((int(ins[0].data_ptr()), int(outs[0].data_ptr())))
            return kernel.launch(ins, outs, *a, **k)

    rec = Recording()

    def launch(ins, outs):
        rc = kernel.launch(ins, outs, scalars, handle)
        if rc:
            raise RuntimeError(f"evo_launch returned {rc}")

    def release():
        torch.cuda.synchronize()
        _poison_allocator(torch)

    def extra() -> dict:
        """copy_, ours behind a GPU spin, host launch time, on new inputs of the timing shape."""
        shape = dict(task.shapes[0])
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        ins = tuple(task.make_inputs(shape, gen, task.distributions[0] if task.distributions else "normal",
                                     torch.device("cuda")))
        with torch.no_grad():
            ref = task.reference(*ins)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        outs = [torch.empty_like(r, dtype=getattr(torch, task.dtype)) for r in refs]
        del ref, refs
        flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        res: dict[str, list[float]] = {"copy": [], "ours_spin": [], "ours_plain": [], "host_launch_us": []}
        for _ in range(3):
            launch(ins, outs)
        torch.cuda.synchronize()
        for _ in range(args.reps):
            flush.zero_()
            ev[0].record(stream)
            outs[0].copy_(ins[0].view_as(outs[0]))
            ev[1].record(stream)
            torch.cuda.synchronize()
            res["copy"].append(ev[0].elapsed_time(ev[1]))
            flush.zero_()
            torch.cuda._sleep(200_000)
            ev[0].record(stream)
            launch(ins, outs)
            ev[1].record(stream)
            torch.cuda.synchronize()
            res["ours_spin"].append(ev[0].elapsed_time(ev[1]))
            flush.zero_()
            ev[0].record(stream)
            t0 = time.perf_counter()
            launch(ins, outs)
            res["host_launch_us"].append((time.perf_counter() - t0) * 1e6)
            ev[1].record(stream)
            torch.cuda.synchronize()
            res["ours_plain"].append(ev[0].elapsed_time(ev[1]))
        res_m = {k: median(v) for k, v in res.items()}
        res_m["placement"] = f"{(outs[0].data_ptr() - ins[0].data_ptr()) / 2**20:+.0f} MiB"
        del ins, outs, flush
        torch.cuda.empty_cache()
        return res_m

    def offsets() -> list[tuple[str, str, float]]:
        """Each variant (and copy_) with the output placed at input + nbytes + d in one pool."""
        shape = dict(task.shapes[0])
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1234)
        x = task.make_inputs(shape, gen, "normal", torch.device("cuda"))[0]
        nb = x.numel() * x.element_size()
        ds = [0, 1, 2, 64]
        pool = torch.empty(2 * nb + (max(ds) << 20) + (1 << 20), dtype=torch.uint8, device="cuda")
        xin = pool[:nb].view(x.dtype).view(x.shape)
        xin.copy_(x)
        del x
        flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        kernels = [("seed" if not params else ",".join(args.param), kernel)]
        kernels += [(v, _kernel(task.name, {**params, **dict(p.split("=", 1) for p in v.split(","))}, args.out)) for v in args.variant]
        out = []
        for d in ds:
            y = pool[nb + (d << 20): 2 * nb + (d << 20)].view(xin.dtype).view(xin.shape)
            fns = [(lab, (lambda k=k, y=y, x=xin: k.launch((x,), (y,), scalars, handle))) for lab, k in kernels]
            fns.append(("copy_", lambda y=y, x=xin: y.copy_(x)))
            for lab, fn in fns:
                fn()
                ts = []
                for _ in range(10):
                    flush.zero_()
                    ev[0].record(stream)
                    fn()
                    ev[1].record(stream)
                    torch.cuda.synchronize()
                    ts.append(ev[0].elapsed_time(ev[1]))
                out.append((f"+{nb / 2**20:.0f} {d:+d} MiB", lab, median(ts)))
                log.info("offset %s", out[-1])
        del pool, xin, flush
        torch.cuda.empty_cache()
        return out

    def trace(label: str, seconds: float = 1.5, bin_s: float = 0.05) -> list[float]:
        """Bandwidth (GB/s) of a 256 MB memset, back to back for ``seconds``, medians per bin."""
        buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        t0 = time.monotonic()
        samples: list[tuple[float, float]] = []
        while (now := time.monotonic() - t0) < seconds:
            ev[0].record(stream)
            buf.zero_()
            ev[1].record(stream)
            ev[1].synchronize()
            samples.append((now, ev[0].elapsed_time(ev[1])))
        bins = []
        for b in range(int(seconds / bin_s)):
            ms = [m for t, m in samples if b * bin_s <= t < (b + 1) * bin_s]
            bins.append((256 << 20) / (median(ms) * 1e-3) / 1e9 if ms else float("nan"))
        log.info("trace %s: %s", label, " ".join(f"{g:.0f}" for g in bins))
        del buf
        return bins

    traces: dict[str, list[float]] = {}
    if args.trace:
        with torch.cuda.stream(stream):
            traces["after startup poison"] = trace("startup")
            big = torch.empty(40 << 30, dtype=torch.uint8, device="cuda")
            big.fill_(1)
            torch.cuda.synchronize()
            del big
            torch.cuda.empty_cache()
            traces["after freeing 40 GB"] = trace("free40")
            big = torch.empty(40 << 30, dtype=torch.uint8, device="cuda")
            big.fill_(1)
            torch.cuda.synchronize()
            del big
            traces["40 GB freed, cache kept"] = trace("keep40")
            torch.cuda.empty_cache()
            check_correctness(task, launch, device="cuda", trials=args.trials, seed=7,
                              sync=torch.cuda.synchronize, release=release)
            release()
            traces["after check + release"] = trace("checked")

    rows = []
    with torch.cuda.stream(stream):
        # (label, run the correctness stage first, the extra measurements before the timing stage)
        states = [("fresh", False, False), ("checked", True, False), ("checked, extra first", True, True)]
        for state, check_first, extra_first in (() if args.offsets else states):
            if check_first:
                t0 = time.monotonic()
                c = check_correctness(task, launch, device="cuda", trials=args.trials, seed=7,
                                      sync=torch.cuda.synchronize, release=release)
                log.info("correctness %s in %.1f s %s", c.status.value, time.monotonic() - t0, c.reason[:200])
                release()
            clk = _clocks()
            e = extra() if extra_first else {}
            n0 = len(ptrs)
            sh = []
            for _ in range(2):   # the timing stage twice in a row: a state that persists shows in both
                t = time_shapes(task, rec, shape_indices=[0], scalars=scalars, warmup=5, reps=args.reps,
                                flush_mb=256, seed=7, stream=stream, sol_ms=lambda s: None)
                if t.status.value != "ok":
                    raise SystemExit(f"timing {t.status.value}: {t.reason}")
                sh.append(t.metrics["shapes"][0])
            if not extra_first:
                e = extra()
            places = sorted({f"{(o - i) / 2**20:+.0f} MiB" for i, o in ptrs[n0:]})
            row = {"state": state, "ours_ms": sh[0]["median_ms"], "torch_ms": sh[0]["ref_median_ms"],
                   "speedup": sh[0]["speedup"], "ours2_ms": sh[1]["median_ms"], "torch2_ms": sh[1]["ref_median_ms"],
                   "timing_placement": ",".join(places), **e, "clocks": clk}
            log.info("%s", row)
            rows.append(row)
    (args.out / "timing_state.json").write_text(json.dumps({"rows": rows, "traces": traces}, indent=1))
    if traces:
        print("\nmemset bandwidth (GB/s), medians per 50 ms bin from the start of each trace")
        for k, v in traces.items():
            print(f"{k:>26}: " + " ".join(f"{g:.0f}" for g in v))
    offs = []
    if args.offsets:
        with torch.cuda.stream(stream):
            offs = offsets()
        (args.out / "offsets.json").write_text(json.dumps(offs, indent=1))
        places = list(dict.fromkeys(p for p, _, _ in offs))
        labels = list(dict.fromkeys(lab for _, lab, _ in offs))
        ms = {(p, lab): v for p, lab, v in offs}
        print("\n| kernel | " + " | ".join(f"out at in {p}" for p in places) + " |")
        print("|---|" + "---|" * len(places))
        for lab in labels:
            print(f"| {lab} | " + " | ".join(f"{ms[(p, lab)]:.4f}" for p in places) + " |")
    print(f"\ntask {task.name} params {params} shape {dict(task.shapes[0])} reps {args.reps}")
    print("| state | timing stage ours ms (out - in) | torch ms | speedup | again: ours / torch ms | copy_ ms "
          "| ours after spin ms | ours plain ms (out - in) | host launch us | clocks (sm mem temp power) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['state']} | {r['ours_ms']:.4f} ({r['timing_placement']}) | {r['torch_ms']:.4f} | "
              f"{r['speedup']:.3f} | {r['ours2_ms']:.4f} / {r['torch2_ms']:.4f} | {r['copy']:.4f} | "
              f"{r['ours_spin']:.4f} | {r['ours_plain']:.4f} ({r['placement']}) | {r['host_launch_us']:.1f} | "
              f"{r['clocks']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
