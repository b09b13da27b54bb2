"""GPU smoke test of the GEMM seeds: build, check against torch, time, dump SASS counts.

Two steps, so that the GPU machine needs neither the ``evo`` package's dependencies nor the
CUTLASS wheel:

  prepare (any machine with the repo installed):
      python benchmarks/gemm_smoke.py prepare --out .gemm_build [--compile] [--jobs N]
    renders every GEMM seed (``evo.tasks.gemm_seeds``) into ``OUT/src/<hash>.cu`` plus
    ``OUT/manifest.json``; with ``--compile`` also builds ``OUT/so/<hash>.so`` in parallel
    (identical sources are built once) and keeps the ptxas reports in ``OUT/ptxas/``.

  run (the GPU machine; needs torch, and nvcc only for .so files not built yet):
      python3 benchmarks/gemm_smoke.py run --build .gemm_build [--tasks a,b] [--include DIR]
    for each task: loads the seed with ctypes, poisons the output with NaN, runs it on the
    current torch stream, compares with the torch reference (fp64 for fp32 tasks, also
    reporting torch fp32's and a TF32 product's error for calibration; fp32 for bf16 tasks)
    on the benchmark shape and on small irregular shapes, checks two calls are bitwise equal,
    times seed and torch (CUDA events, median, 256 MB L2 flush before every rep), counts
    HGMMA/HMMA/FFMA in the SASS (cuobjdump), and prints a table last. Logs go to $OUT (or
    --logdir).

Not library code: prints are the point.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Extra instantiations timed next to the seeds ("task@label" -> tunable overrides), for
#: choosing seed defaults; they run on the task's shapes and are listed in the table too.
VARIANTS: dict[str, dict[str, str]] = {
    "kb01_square@128x256": {"BN": "256"},
    "kb01_square@mb2": {"MIN_BLOCKS": "2"},
    "kb17_trans_b@mb2": {"MIN_BLOCKS": "2"},
}

NVCC_FLAGS = [
    "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
    "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
]

# --------------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------------


def cutlass_include() -> str:
    import cutlass_library

    return str(Path(cutlass_library.__file__).parent / "source" / "include")


def compile_one(src: Path, so: Path, include: str, log: Path) -> tuple[str, bool, float]:
    t0 = time.time()
    cmd = ["nvcc", *NVCC_FLAGS, f"-I{include}", f"-I{REPO / 'evo/tasks/kernels'}", str(src), "-o", str(so)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    return src.name, proc.returncode == 0, time.time() - t0


def prepare(out: Path, do_compile: bool, jobs: int) -> None:
    sys.path.insert(0, str(REPO))
    from evo.tasks.gemm_seeds import GEMM_SEEDS
    from evo.tasks.seedspec import render

    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "so").mkdir(exist_ok=True)
    (out / "ptxas").mkdir(exist_ok=True)
    import dataclasses

    specs = dict(GEMM_SEEDS)
    for variant, overrides in VARIANTS.items():
        base = GEMM_SEEDS[variant.split("@")[0]]
        merged = {**dict(base.tunable_defaults), **overrides}
        specs[variant] = dataclasses.replace(base, tunable_defaults=tuple(merged.items()))
    manifest = {}
    for task, spec in specs.items():
        text = render(spec)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        (out / "src" / f"{digest}.cu").write_text(text)
        manifest[task] = {"hash": digest, "template": spec.template}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.copy(REPO / "evo/tasks/kernels/evo_abi.h", out / "src" / "evo_abi.h")
    print(f"rendered {len(manifest)} seeds, {len({m['hash'] for m in manifest.values()})} distinct sources")
    if do_compile:
        build_all(out, cutlass_include(), jobs)


def build_all(out: Path, include: str, jobs: int) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    todo = sorted({m["hash"] for m in manifest.values() if not (out / "so" / f"{m['hash']}.so").exists()})
    (out / "so").mkdir(exist_ok=True)
    (out / "ptxas").mkdir(exist_ok=True)
    with cf.ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = [
            pool.submit(compile_one, out / "src" / f"{h}.cu", out / "so" / f"{h}.so", include, out / "ptxas" / f"{h}.log")
            for h in todo
        ]
        for f in cf.as_completed(futs):
            name, ok, secs = f.result()
            print(f"compile {name}: {'ok' if ok else 'FAILED'} in {secs:.0f}s", flush=True)


# --------------------------------------------------------------------------------------------
# run (GPU)
# --------------------------------------------------------------------------------------------


class EvoTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 8),
        ("strides", ctypes.c_int64 * 8),
    ]


def to_evo(t) -> EvoTensor:
    import torch

    codes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5}
    e = EvoTensor()
    e.data = t.data_ptr()
    e.dtype = codes[t.dtype]
    e.ndim = t.dim()
    for i in range(t.dim()):
        e.shape[i] = t.shape[i]
        e.strides[i] = t.stride(i)
    return e


class Seed:
    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        self.fn = self.lib.evo_launch
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [
            ctypes.POINTER(EvoTensor), ctypes.c_int, ctypes.POINTER(EvoTensor), ctypes.c_int,
            ctypes.POINTER(ctypes.c_double), ctypes.c_int, ctypes.c_void_p,
        ]

    def __call__(self, inputs, out) -> None:
        import torch

        ins = (EvoTensor * len(inputs))(*[to_evo(t) for t in inputs])
        outs = (EvoTensor * 1)(to_evo(out))
        rc = self.fn(ins, len(inputs), outs, 1, None, 0, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc != 0:
            raise RuntimeError(f"evo_launch returned {rc}")


def task_table():
    """name -> (dtype, bench shapes, small shapes, make(shape, gen) -> inputs, ref(inputs) -> out, flops)."""
    import torch
    import torch.nn.functional as F

    def mm(s, g, dt=torch.float32):
        return (torch.randn(s["M"], s["K"], generator=g, device="cuda", dtype=dt),
                torch.randn(s["K"], s["N"], generator=g, device="cuda", dtype=dt))

    def bmm(s, g, dt=torch.float32):
        return (torch.randn(s["L"], s["M"], s["K"], generator=g, device="cuda", dtype=dt),
                torch.randn(s["L"], s["K"], s["N"], generator=g, device="cuda", dtype=dt))

    def sym(s, g):
        a, b = mm(s, g)
        return ((a + a.T) / 2, (b + b.T) / 2)

    def upper(s, g):
        a, b = mm(s, g)
        return (torch.triu(a), torch.triu(b))

    def lower(s, g):
        a, b = mm(s, g)
        return (torch.tril(a), torch.tril(b))

    def ta(s, g):
        return (torch.randn(s["K"], s["M"], generator=g, device="cuda"), torch.randn(s["K"], s["N"], generator=g, device="cuda"))

    def tb(s, g):
        return (torch.randn(s["M"], s["K"], generator=g, device="cuda"), torch.randn(s["N"], s["K"], generator=g, device="cuda"))

    def tab(s, g):
        return (torch.randn(s["K"], s["M"], generator=g, device="cuda"), torch.randn(s["N"], s["K"], generator=g, device="cuda"))

    def t3d(s, g):
        return (torch.randn(s["L"], s["M"], s["K"], generator=g, device="cuda"), torch.randn(s["K"], s["N"], generator=g, device="cuda"))

    def t4d(s, g):
        return (torch.randn(s["B"], s["I"], s["J"], s["K"], generator=g, device="cuda"),
                torch.randn(s["K"], s["N"], generator=g, device="cuda"))

    def bias_in(s, g):
        a, b = mm(s, g, torch.bfloat16)
        return (a, b, torch.randn(s["N"], generator=g, device="cuda", dtype=torch.bfloat16))

    def swiglu_in(s, g):
        a, w1 = mm(s, g, torch.bfloat16)
        w3 = torch.randn(s["K"], s["N"], generator=g, device="cuda", dtype=torch.bfloat16)
        return (a / 8, w1 / 8, w3 / 8)

    f_mm = lambda s: 2.0 * s["M"] * s["N"] * s["K"] * s.get("L", 1)
    sq = lambda n: {"M": n, "N": n, "K": n}
    small = {"M": 129, "N": 383, "K": 97}
    small_al = {"M": 200, "N": 264, "K": 136}
    T = {
        "kb01_square": ("f32", [sq(4096)], [small], mm, lambda a, b: a @ b, f_mm),
        "kb02_standard": ("f32", [{"M": 2048, "K": 8192, "N": 4096}], [small], mm, lambda a, b: a @ b, f_mm),
        "kb03_bmm": ("f32", [{"L": 128, "M": 512, "K": 1024, "N": 2048}], [{**small, "L": 3}], bmm, torch.bmm, f_mm),
        "kb06_large_k": ("f32", [{"M": 256, "K": 524288, "N": 256}], [{"M": 129, "K": 20001, "N": 383}], mm, lambda a, b: a @ b, f_mm),
        "kb07_small_k": ("f32", [{"M": 32768, "K": 64, "N": 32768}], [small], mm, lambda a, b: a @ b, f_mm),
        "kb08_irregular": ("f32", [{"M": 8205, "K": 2949, "N": 5921}], [small], mm, lambda a, b: a @ b, f_mm),
        "kb09_tall_skinny": ("f32", [{"M": 32768, "K": 32, "N": 32768}], [small], mm, lambda a, b: a @ b, f_mm),
        "kb10_3d": ("f32", [{"L": 16, "M": 1024, "K": 2048, "N": 768}], [{**small, "L": 3}], t3d, torch.matmul, f_mm),
        "kb11_4d": ("f32", [{"B": 8, "I": 256, "J": 512, "K": 256, "N": 768}], [{"B": 2, "I": 3, "J": 43, "K": 97, "N": 383}],
                    t4d, lambda a, b: torch.einsum("bijl,lk->bijk", a, b),
                    lambda s: 2.0 * s["B"] * s["I"] * s["J"] * s["K"] * s["N"]),
        "kb13_symmetric": ("f32", [sq(4096)], [{"M": 129, "N": 129, "K": 129}], sym, lambda a, b: a @ b, f_mm),
        "kb14_upper": ("f32", [sq(4096)], [{"M": 383, "N": 383, "K": 383}], upper, lambda a, b: torch.triu(a @ b), f_mm),
        "kb15_lower": ("f32", [sq(4096)], [{"M": 383, "N": 383, "K": 383}], lower, lambda a, b: torch.tril(a @ b), f_mm),
        "kb16_trans_a": ("f32", [{"M": 2048, "K": 8192, "N": 4096}], [small], ta, lambda a, b: a.T @ b, f_mm),
        "kb17_trans_b": ("f32", [{"M": 2048, "K": 8192, "N": 4096}], [small], tb, lambda a, b: a @ b.T, f_mm),
        "kb18_trans_both": ("f32", [{"M": 2048, "K": 8192, "N": 4096}], [small], tab, lambda a, b: a.T @ b.T, f_mm),
        "gemm_bf16": ("bf16", [sq(8192), sq(4096)], [small, small_al],
                      lambda s, g: mm(s, g, torch.bfloat16), lambda a, b: a @ b, f_mm),
        "gemm_bf16_irregular": ("bf16", [{"M": 8205, "K": 2949, "N": 5921}], [small, small_al],
                                lambda s, g: mm(s, g, torch.bfloat16), lambda a, b: a @ b, f_mm),
        "bmm_bf16": ("bf16", [{"L": 128, "M": 512, "K": 1024, "N": 2048}], [{**small, "L": 3}, {**small_al, "L": 3}],
                     lambda s, g: bmm(s, g, torch.bfloat16), torch.bmm, f_mm),
        "gemm_bias_gelu_bf16": ("bf16", [sq(8192)], [small, small_al], bias_in,
                                lambda a, b, c: F.gelu(a @ b + c), f_mm),
        "gemm_silu_mul_bf16": ("bf16", [{"M": 8192, "K": 4096, "N": 14336}], [small, small_al], swiglu_in,
                               lambda a, w1, w3: F.silu(a @ w1) * (a @ w3), lambda s: 4.0 * s["M"] * s["N"] * s["K"]),
    }
    return T


def rel_l2(out, ref) -> float:
    import torch

    o = out.double()
    r = ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    return float((o - r).norm() / r.norm().clamp_min(1e-300))


def time_fn(fn, flush, reps: int, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def sass_counts(so: Path) -> dict[str, int]:
    try:
        proc = subprocess.run(["cuobjdump", "--dump-sass", str(so)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    counts = {}
    for op in ("HGMMA", "HMMA", "FFMA", "LDL", "STL", "UTMALDG", "LDGSTS", "STG.E.128", "LDS.128"):
        counts[op] = len(re.findall(rf"\b{re.escape(op)}\b", proc.stdout))
    return counts


def run(build: Path, tasks: list[str] | None, include: str | None, logdir: Path, reps: int, jobs: int) -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    manifest = json.loads((build / "manifest.json").read_text())
    missing = [t for t, m in manifest.items() if not (build / "so" / f"{m['hash']}.so").exists()]
    if missing:
        if not include:
            print(f"no .so for {missing} and no --include for nvcc", flush=True)
        else:
            build_all(build, include, jobs)
    logdir.mkdir(parents=True, exist_ok=True)
    log = open(logdir / "gemm_smoke.log", "w")

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"device {torch.cuda.get_device_name()} torch {torch.__version__}")
    table = task_table()
    names = tasks or list(manifest)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    rows = []
    sass_done = {}
    for name in names:
        m = manifest[name]
        so = build / "so" / f"{m['hash']}.so"
        if not so.exists():
            rows.append((name, "no .so", "", "", "", "", ""))
            continue
        dt, bench, smalls, make, ref_fn, flops = table[name.split("@")[0]]
        try:
            seed = Seed(so)
        except OSError as exc:
            say(f"{name}: load failed: {exc}")
            rows.append((name, "load failed", "", "", "", "", ""))
            continue
        if dt == "bf16" and m["hash"] not in sass_done:
            sass_done[m["hash"]] = sass_counts(so)
            say(f"{name}: SASS {sass_done[m['hash']]}")
        g = torch.Generator(device="cuda")
        g.manual_seed(1234)
        ok_all = True
        small_errs = []
        for s in smalls:
            ins = make(s, g)
            ref = ref_fn(*[x.double() if dt == "f32" else x.float() for x in ins])
            out = torch.full(ref.shape, float("nan"), device="cuda", dtype=torch.float32 if dt == "f32" else torch.bfloat16)
            try:
                seed(ins, out)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                say(f"{name} small {s}: {exc}")
                ok_all = False
                continue
            err = rel_l2(out, ref)
            small_errs.append(err)
            say(f"{name} small {s}: rel_l2 {err:.3e}")
            ok_all &= err == err and err < (1e-5 if dt == "f32" else 1e-2)
        for bi, s in enumerate(bench):
            ins = make(s, g)
            ref = ref_fn(*[x.double() if dt == "f32" else x.float() for x in ins])
            out = torch.full(ref.shape, float("nan"), device="cuda", dtype=torch.float32 if dt == "f32" else torch.bfloat16)
            try:
                seed(ins, out)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                say(f"{name} bench {s}: {exc}")
                rows.append((name, "launch error", "", "", "", "", ""))
                ok_all = False
                continue
            err = rel_l2(out, ref)
            out2 = torch.full_like(out, float("nan"))
            seed(ins, out2)
            torch.cuda.synchronize()
            det = bool(torch.equal(out, out2))
            del out2
            calib = ""
            if dt == "f32":
                e32 = rel_l2(ref_fn(*ins), ref)
                torch.backends.cuda.matmul.allow_tf32 = True
                etf = rel_l2(ref_fn(*ins), ref)
                torch.backends.cuda.matmul.allow_tf32 = False
                calib = f" torch_fp32 {e32:.2e} tf32 {etf:.2e}"
            else:
                calib = f" torch_bf16 {rel_l2(ref_fn(*ins), ref):.2e}"
            del ref
            t_seed = time_fn(lambda: seed(ins, out), flush, reps)
            t_ref = time_fn(lambda: ref_fn(*ins), flush, reps)
            tf = flops(s) / (t_seed * 1e-3) / 1e12
            say(f"{name} bench {s}: rel_l2 {err:.3e}{calib} deterministic {det} seed {t_seed:.3f} ms torch {t_ref:.3f} ms "
                f"-> {t_ref / t_seed:.2f}x, {tf:.1f} TFLOP/s")
            ok = ok_all and err == err and err < (1e-5 if dt == "f32" else 1e-2) and det
            label = name if len(bench) == 1 else f"{name}[{s['M']}]"
            rows.append((label, f"{err:.2e}" + ("" if ok else " FAIL"), f"{max(small_errs, default=float('nan')):.1e}",
                         f"{t_seed:.3f}", f"{t_ref:.3f}", f"{t_ref / t_seed:.2f}", f"{tf:.1f}"))
            del ins, out
        torch.cuda.empty_cache()
    hdr = ("task", "rel_l2", "small", "seed ms", "torch ms", "speedup", "TFLOP/s")
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [hdr] + rows]
    say("\n".join(lines))
    (logdir / "gemm_table.md").write_text("\n".join("| " + l + " |" for l in lines) + "\n")
    log.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=REPO / ".gemm_build")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("run")
    r.add_argument("--build", type=Path, default=REPO / ".gemm_build")
    r.add_argument("--tasks", default="")
    r.add_argument("--include", default=None, help="CUTLASS include dir for building missing .so files")
    r.add_argument("--logdir", type=Path, default=Path(os.environ.get("OUT", "/tmp/gemm_smoke")))
    r.add_argument("--reps", type=int, default=15)
    r.add_argument("--jobs", type=int, default=16)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.out, a.compile, a.jobs)
        return 0
    return run(a.build, [t for t in a.tasks.split(",") if t] or None, a.include, a.logdir, a.reps, a.jobs)


if __name__ == "__main__":
    sys.exit(main())
