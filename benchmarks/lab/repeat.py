"""Call one kernel variant many times on one shape and report whether its output ever changes.

    python benchmarks/lab/repeat.py kb01_square --source render:evo.tasks.gemm_seeds:F32_3XTF32_SEEDS \\
        -D WGMMA=1 -D STAGES=5 --shape M=256 N=256 K=512 --calls 20 [--where 128 128]

A debugging aid for races (kernel development, not an evaluation): the harness reports
"output changed after N calls"; this reproduces it on a small shape, small enough to run under
``compute-sanitizer --tool racecheck|synccheck|memcheck python benchmarks/lab/repeat.py ...``.
It prints, per call, the max |diff| against the first call's output and against the float64
reference (each comparison waits for its call, so calls do not overlap). Exit 1 when any output differs from
the first. The source spec is the one benchmarks/lab/probe.py takes ("seed", "render:MOD:TABLE",
or a path).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _where(out, ref, tm: int, tn: int) -> None:
    """Print how many elements are off by more than 1e-3 of the reference's max, and where."""
    import torch

    bad = (out - ref).abs() > 1e-3 * float(ref.abs().max())
    if not bool(bad.any()):
        return
    r, c = bad.nonzero(as_tuple=True)
    tiles = torch.unique((r // tm) * ((out.shape[1] + tn - 1) // tn) + c // tn)
    print(f"    {int(bad.sum())} wrong elements in {tiles.numel()} tiles; per wrong tile "
          f"{int(bad.sum()) / tiles.numel():.0f} of {tm * tn}; rows%{tm} seen {torch.unique(r % tm).numel()}, "
          f"cols%{tn} seen {torch.unique(c % tn).numel()}; first tiles {tiles[:6].tolist()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task")
    ap.add_argument("--source", default="seed")
    ap.add_argument("-D", dest="defs", action="append", default=[], help="tunable NAME=VALUE")
    ap.add_argument("--shape", nargs="*", default=[], help="NAME=VALUE overrides of the first shape")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--where", type=int, nargs=2, metavar=("TM", "TN"), default=None,
                    help="for a 2-D output, summarise where wrong elements sit in TM x TN tiles")
    args = ap.parse_args(argv)

    import torch

    from benchmarks.lab.probe import _source
    from evaluators.abi import load_kernel
    from evaluators.base import CompileSettings
    from evaluators.compile import compile_to_file
    from evo.tasks import get_task

    task = get_task(args.task)
    params = dict(d.split("=", 1) for d in args.defs)
    shape = dict(task.shapes[0])
    for kv in args.shape:
        k, v = kv.split("=", 1)
        shape[k] = int(v)
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "k.so"
        out = compile_to_file(_source(args.task, args.source), params,
                              CompileSettings(cache_dir=str(ROOT / ".evo" / "cache")), so)
        if not out.ok:
            print(out.result.reason)
            return 2
        lib = load_kernel(so)
        g = torch.Generator(device="cuda").manual_seed(0)
        ins = task.make_inputs(shape, g, task.distributions[0], torch.device("cuda"))
        ref = task.reference(*[t.double() if t.is_floating_point() else t for t in ins])
        refs = ref if isinstance(ref, tuple) else (ref,)
        first = None
        bad = 0
        stream = torch.cuda.current_stream().cuda_stream
        for i in range(args.calls):
            outs = [torch.full(r.shape, float("nan"), dtype=ins[0].dtype, device="cuda") for r in refs]
            rc = lib.launch(ins, outs, task.scalars, stream)
            if rc != 0:
                print(f"call {i}: evo_launch returned {rc} ({lib.error_name(rc)})")
                return 2
            if first is None:
                first = [o.clone() for o in outs]
            d_first = max(float((o.double() - f.double()).abs().nan_to_num(float("inf")).max())
                          for o, f in zip(outs, first))
            d_ref = max(float((o.double() - r).abs().nan_to_num(float("inf")).max()) for o, r in zip(outs, refs))
            bad += d_first > 0
            print(f"call {i:3d}: max|diff| vs first {d_first:.3g}  vs reference {d_ref:.3g}")
            if args.where and outs[0].dim() == 2:
                _where(outs[0].double(), refs[0], *args.where)
        print(f"{args.task} {params} {shape}: {bad}/{args.calls} calls differ from the first")
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
