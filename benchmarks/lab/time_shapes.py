"""Time kernel variants of one task on shapes of your choice (kernel development, not evaluation).

    python benchmarks/lab/time_shapes.py gemm_bf16_irregular --variant "" --variant PAD=0 \\
        --shape M=8205,N=5921,K=2949 --shape M=8205,N=5928,K=2952 [--source seed] [--reps 30]

Each variant (comma-separated tunables, "" = the template's defaults) is compiled into
``.evo/cache`` (in parallel) and called on each shape: one correctness comparison against the
float64 reference (max |diff| printed, not judged), then ``--reps`` timed calls with the L2
flushed before each, the torch reference timed the same way in the same loop; medians. A
workspace the kernel asks for is made (and poisoned) before the clock starts, as the harness
does. Use it to split a cost (e.g. the padded path at an unaligned shape against the same
kernel at the padded, aligned shape) where probe.py only runs a task's own shapes. Results of
record come from ``evo bench``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _kv(text: str) -> dict[str, str]:
    return dict(x.split("=", 1) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task")
    ap.add_argument("--source", default="seed", help="as in probe.py: seed | render:MOD:TABLE | path")
    ap.add_argument("--variant", action="append", default=None, help='tunables "NAME=V,NAME=V" ("" = defaults)')
    ap.add_argument("--shape", action="append", required=True, help='"NAME=V,NAME=V" overrides of the first shape')
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--flush-mb", type=int, default=256)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.lab.probe import _candidate, _compile_all
    from evaluators.abi import load_kernel
    from evo.tasks import get_task

    task = get_task(args.task)
    variants = args.variant if args.variant is not None else [""]
    outcomes = _compile_all([_candidate(args.task, args.source, _kv(v)) for v in variants], len(variants))
    flush = torch.empty(args.flush_mb * 2**20, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        libs = []
        for i, (v, out) in enumerate(zip(variants, outcomes)):
            if not out.ok:
                print(f"variant {v!r} did not compile: {out.result.reason[:2000]}")
                return 2
            so = Path(tmp) / f"k{i}.so"
            so.write_bytes(out.so_bytes)
            libs.append(load_kernel(so))
        for shape_text in args.shape:
            shape = {**dict(task.shapes[0]), **{k: int(x) for k, x in _kv(shape_text).items()}}
            g = torch.Generator(device="cuda").manual_seed(0)
            ins = task.make_inputs(shape, g, task.distributions[0], torch.device("cuda"))
            with torch.no_grad():
                ref = task.reference(*ins)
                refs = ref if isinstance(ref, (tuple, list)) else (ref,)
                exact = task.reference(*[t.double() if t.is_floating_point() else t for t in ins])
                exact = exact if isinstance(exact, (tuple, list)) else (exact,)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ref_ms = []
            for _ in range(args.reps):
                flush.zero_()
                ev[0].record(stream)
                with torch.no_grad():
                    task.reference(*ins)
                ev[1].record(stream)
                torch.cuda.synchronize()
                ref_ms.append(ev[0].elapsed_time(ev[1]))
            for v, lib in zip(variants, libs):
                outs = [torch.empty_like(r) for r in refs]
                rc = lib.launch(ins, outs, task.scalars, stream.cuda_stream)
                torch.cuda.synchronize()
                if rc != 0:
                    rows.append((v or "defaults", shape_text, f"evo_launch returned {lib.error_name(rc)}", "", "", ""))
                    continue
                err = max(float((o.double() - e.double()).abs().nan_to_num(float("inf")).max())
                          for o, e in zip(outs, exact))
                ms = []
                for _ in range(args.reps):
                    ws = lib.make_workspace(ins, outs, task.scalars)
                    flush.zero_()
                    ev[0].record(stream)
                    lib.launch(ins, outs, task.scalars, stream.cuda_stream, ws)
                    ev[1].record(stream)
                    torch.cuda.synchronize()
                    ms.append(ev[0].elapsed_time(ev[1]))
                ours, theirs = statistics.median(ms), statistics.median(ref_ms)
                rows.append((v or "defaults", shape_text, f"{ours:.4f}", f"{theirs:.4f}",
                             f"{theirs / ours:.3f}", f"{err:.3g}"))
    print("| variant | shape | ours ms | torch ms | speedup | max abs err vs fp64 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
