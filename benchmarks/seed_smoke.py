"""GPU smoke test and benchmark of the memory-bound seed kernels (elementwise, rowreduce, matvec).

Two steps, because the GPU machine has nvcc but not the CUTLASS headers:

  # here (CPU, nvcc + nvidia-cutlass): render and compile every seed for sm_90a
  python benchmarks/seed_smoke.py --build .evo/seed_smoke
  # on the GPU machine (torch + ctypes only): check and time the prebuilt .so files
  python3 benchmarks/seed_smoke.py --libs .evo/seed_smoke --out OUTDIR

The check follows shared/EVALUATION.md in miniature: outputs poisoned with NaN, reference in
fp64 (fp32 tasks) or fp32 (bf16 tasks) on the same inputs, the benchmark shape plus small
irregular shapes and a misaligned view, a determinism re-run; timing with CUDA events, the
median of --reps calls, a 256 MB L2 flush before each. It is a development tool, not the
evaluator (evaluators/harness.py is).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EVO_MAX_DIMS = 8
F32, BF16 = 0, 2


# --------------------------------------------------------------------------- build (CPU side)
def build(outdir: Path, names: list[str] | None, jobs: int, variants: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import cutlass_library

    from evo.tasks import seeds

    inc = Path(cutlass_library.__file__).parent / "source" / "include"
    kdir = Path(__file__).resolve().parents[1] / "evo" / "tasks" / "kernels"
    outdir.mkdir(parents=True, exist_ok=True)
    todo = names or [n for n, s in seeds.SEEDS.items() if s.template in ("elementwise", "rowreduce", "matvec")]

    def one(item) -> str:
        name, tag, defs = item
        stem = f"{name}__{tag}" if tag else name
        src = outdir / f"{stem}.cu"
        src.write_text(seeds.seed_source(name))
        cmd = ["nvcc", *[f"-D{d}" for d in defs], "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
               "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", f"-I{inc}", f"-I{kdir}", str(src), "-o",
               str(outdir / f"{stem}.so")]
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        (outdir / f"{stem}.log").write_text(r.stderr)
        if r.returncode:
            return f"{stem}: FAILED\n{r.stderr[-3000:]}"
        return f"{stem}: ok ({time.time() - t:.1f} s)"

    items = [(n, "", ()) for n in todo]
    for v in variants:  # NAME:TAG:K=V,K=V -- the seed with tunables overridden by -D flags
        name, tag, defs = v.split(":")
        items.append((name, tag, tuple(defs.split(","))))
    with ThreadPoolExecutor(jobs) as ex:
        for line in ex.map(one, items):
            print(line, flush=True)


# --------------------------------------------------------------------------- GPU side
class EvoTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * EVO_MAX_DIMS), ("strides", ctypes.c_int64 * EVO_MAX_DIMS)]


def _desc(t):
    import torch

    d = EvoTensor()
    d.data = t.data_ptr()
    d.dtype = {torch.float32: F32, torch.bfloat16: BF16}[t.dtype]
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


class Seed:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.fn = self.lib.evo_launch
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.POINTER(EvoTensor), ctypes.c_int, ctypes.POINTER(EvoTensor), ctypes.c_int,
                            ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_void_p]

    def __call__(self, ins, outs, scalars=()):
        import torch

        a_in = (EvoTensor * len(ins))(*[_desc(t) for t in ins])
        a_out = (EvoTensor * len(outs))(*[_desc(t) for t in outs])
        a_s = (ctypes.c_double * max(1, len(scalars)))(*scalars)
        rc = self.fn(a_in, len(ins), a_out, len(outs), a_s, len(scalars), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"evo_launch returned {rc}")


def task_table():
    import torch
    import torch.nn.functional as F

    act = (4096, 393216)
    small = [(129, 1031), (3, 65537), (1, 7)]
    T = {}

    def unary(name, fn, dtype="f32", scalars=(), wide=5.0):
        T[name] = dict(kind="unary", fn=fn, dtype=dtype, scalars=scalars, shapes=[act] + small, wide=wide)

    unary("kb05_scalar", lambda x: x * 3.14, scalars=(3.14,))
    T["kb05_scalar"]["shapes"] = [(65536, 16384), (257, 1031), (3, 13)]
    unary("kb19_relu", torch.relu)
    unary("kb20_leaky_relu", lambda x: F.leaky_relu(x, 0.01), scalars=(0.01,))
    unary("kb21_sigmoid", torch.sigmoid)
    unary("kb22_tanh", torch.tanh)
    unary("kb25_swish", lambda x: x * torch.sigmoid(x))
    unary("kb26_gelu", F.gelu)
    unary("kb27_selu", torch.selu)
    unary("kb28_hardsigmoid", F.hardsigmoid)
    unary("kb29_softplus", F.softplus, wide=10.0)
    unary("kb30_softsign", lambda x: x / (1 + torch.abs(x)))
    unary("kb31_elu", lambda x: F.elu(x, alpha=1.0), scalars=(1.0,))
    unary("kb32_hardtanh", lambda x: F.hardtanh(x, -1.0, 1.0), scalars=(-1.0, 1.0))
    unary("gelu_bf16", F.gelu, dtype="bf16")
    unary("silu_bf16", F.silu, dtype="bf16")
    T["kb12_diag"] = dict(kind="diag", fn=lambda a, b: a[:, None] * b, dtype="f32", scalars=(),
                          shapes=[(4096, 4096), (257, 1031), (3, 13)])
    T["kb23_softmax"] = dict(kind="row", fn=lambda x: torch.softmax(x, dim=1), dtype="f32", scalars=(),
                             shapes=[act] + small, wide=5.0)
    T["kb24_log_softmax"] = dict(kind="row", fn=lambda x: torch.log_softmax(x, dim=1), dtype="f32",
                                 scalars=(), shapes=[act] + small, wide=5.0)
    T["softmax_bf16"] = dict(kind="row", fn=lambda x: torch.softmax(x, dim=-1), dtype="bf16", scalars=(),
                             shapes=[(32768, 4096)] + small, wide=5.0)
    T["rmsnorm_bf16"] = dict(kind="rms", dtype="bf16", scalars=(1e-6,),
                             shapes=[(32768, 4096), (129, 1031), (3, 16387), (1, 7)], wide=1.0)
    T["kb04_matvec"] = dict(kind="matvec", dtype="f32", scalars=(), shapes=[(2048, 1048576), (129, 1031), (33, 65537), (1, 7)])
    return T


def rms_ref(x, w, eps):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def run_gpu(libs: Path, outdir: Path, names: list[str] | None, reps: int) -> int:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
    table = task_table()
    rows, failures = [], []

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        times.sort()
        return times[len(times) // 2]

    def make(shape, dt, wide, offset=0):
        n = 1
        for s in shape:
            n *= s
        buf = torch.randn(n + offset, generator=gen, device=dev, dtype=torch.float32).mul_(wide)
        return buf.to(dt)[offset:].view(shape)

    jobs = []
    for name, t in table.items():
        if names and name not in names:
            continue
        jobs.append((name, t, libs / f"{name}.so"))
        jobs += [(f"{name}[{p.stem.split('__', 1)[1]}]", t, p) for p in sorted(libs.glob(f"{name}__*.so"))]
    for name, t, so in jobs:
        if not so.exists():
            failures.append(f"{name}: no {so}")
            continue
        seed = Seed(so)
        dt = torch.float32 if t["dtype"] == "f32" else torch.bfloat16
        refdt = torch.float64 if t["dtype"] == "f32" else torch.float32
        tol = 1e-5 if t["dtype"] == "f32" else 1.6e-2
        worst = 0.0
        torch_worst = 0.0
        bench = None
        variants = [(s, 0) for s in t["shapes"]]
        if t["kind"] == "unary":
            variants.append((t["shapes"][1], 1))  # misaligned by one element: scalar path
        for vi, (shape, off) in enumerate(variants):
            kind = t["kind"]
            if kind in ("unary", "row"):
                x = make(shape, dt, t["wide"], off)
                ins = [x]
                ref = (t["fn"](x.to(refdt)),)
                out = torch.empty(shape, dtype=dt, device=dev)
                torch_call = (lambda x=x, f=t["fn"]: f(x))
            elif kind == "rms":
                x = make(shape, dt, 1.0)
                w = make((shape[1],), dt, 1.0)
                ins = [x, w]
                ref = (rms_ref(x.to(refdt), w.to(refdt), t["scalars"][0]),)
                out = torch.empty(shape, dtype=dt, device=dev)
                torch_call = (lambda x=x, w=w: F.rms_norm(x, (x.shape[-1],), w, t["scalars"][0]))
            elif kind == "diag":
                a = make((shape[0],), dt, 2.0)
                b = make(shape, dt, 2.0)
                ins = [a, b]
                ref = (t["fn"](a.to(refdt), b.to(refdt)),)
                out = torch.empty(shape, dtype=dt, device=dev)
                torch_call = (lambda a=a, b=b, f=t["fn"]: f(a, b))
            else:  # matvec
                m, k = shape
                a = make((m, k), dt, 1.0)
                b = make((k, 1), dt, 1.0)
                ins = [a, b]
                ref = (a.to(refdt) @ b.to(refdt),)
                out = torch.empty((m, 1), dtype=dt, device=dev)
                torch_call = (lambda a=a, b=b: a @ b)
            out.fill_(float("nan"))
            seed(ins, [out], t["scalars"])
            torch.cuda.synchronize()
            r = ref[0]
            scale = r.abs().max().item() if r.numel() else 1.0
            diff = (out.to(refdt) - r).abs()
            if kind == "matvec":  # a reduction of length K: error scales with ||a_i|| ||b||
                floor = (ins[0].norm(dim=1, keepdim=True, dtype=refdt) * ins[1].norm(dtype=refdt)) * 1e-6
                rel = (diff / (r.abs() + floor)).max().item()
            else:
                rel = (diff / (r.abs() + 1e-6 * scale)).max().item() if t["dtype"] == "f32" else \
                    (diff / (r.abs() + 1e-2 * scale)).max().item()
            nan = bool(torch.isnan(out).any().item())
            # calibration: the same metric for torch's own op in the task's dtype
            tout = torch_call().to(refdt)
            tdiff = (tout - r).abs()
            if kind == "matvec":
                trel = (tdiff / (r.abs() + floor)).max().item()
            else:
                trel = (tdiff / (r.abs() + (1e-6 if t["dtype"] == "f32" else 1e-2) * scale)).max().item()
            del diff, r, ref, tout, tdiff
            torch_worst = max(torch_worst, trel)
            worst = max(worst, rel if not nan else float("inf"))
            ok = (not nan) and rel <= max(tol, 2 * trel)
            if vi == 0:
                again = torch.empty_like(out).fill_(float("nan"))
                seed(ins, [again], t["scalars"])
                torch.cuda.synchronize()
                if not torch.equal(again, out):
                    ok = False
                    failures.append(f"{name}: not deterministic")
                del again
                nbytes = sum(i.numel() * i.element_size() for i in ins) + out.numel() * out.element_size()
                ms_seed = timed(lambda: seed(ins, [out], t["scalars"]))
                ms_torch = timed(torch_call)
                bench = (shape, ms_seed, ms_torch, nbytes / ms_seed / 1e6)
            if not ok:
                failures.append(f"{name} {shape} off={off}: rel {rel:.3g} (torch {trel:.3g}) nan={nan}")
            del ins, out
            torch.cuda.empty_cache()
        shape, ms_s, ms_t, gbs = bench
        rows.append(dict(task=name, shape=list(shape), max_rel_err=worst, torch_rel_err=torch_worst, seed_ms=ms_s, torch_ms=ms_t,
                         speedup=ms_t / ms_s, gbps=gbs))
        print(f"{name:24s} {str(tuple(shape)):18s} err {worst:9.2e} (torch {torch_worst:8.2e})  seed {ms_s:8.4f} ms  torch {ms_t:8.4f} ms"
              f"  x{ms_t / ms_s:5.2f}  {gbs:6.0f} GB/s", flush=True)

    print("\n| task | shape | max rel err | torch err | seed ms | torch ms | speedup | GB/s |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {tuple(r['shape'])} | {r['max_rel_err']:.2e} | {r['torch_rel_err']:.2e} | {r['seed_ms']:.4f} | "
              f"{r['torch_ms']:.4f} | {r['speedup']:.2f} | {r['gbps']:.0f} |")
    print("\nFAILURES:\n" + "\n".join(failures) if failures else "\nall correct")
    if outdir:
        outdir.mkdir(parents=True, exist_ok=True)
        (outdir / "seed_smoke.json").write_text(json.dumps(dict(
            gpu=torch.cuda.get_device_name(), torch=torch.__version__, reps=reps, rows=rows, failures=failures),
            indent=1))
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, help="render + compile the seeds into this folder (CPU side)")
    ap.add_argument("--libs", type=Path, help="folder of prebuilt <task>.so files (GPU side)")
    ap.add_argument("--out", type=Path, default=None, help="write seed_smoke.json here")
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--variant", action="append", default=[], help="NAME:TAG:K=V,K=V extra build (with --build)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    if a.build:
        build(a.build, a.tasks, a.jobs, a.variant)
        return 0
    if not a.libs:
        ap.error("give --build DIR or --libs DIR")
    return run_gpu(a.libs, a.out, a.tasks, a.reps)


if __name__ == "__main__":
    sys.exit(main())
