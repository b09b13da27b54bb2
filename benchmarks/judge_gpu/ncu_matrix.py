"""Why ncu in front of a sandboxed runner captures no kernel (GPU machine only).

The kb19_relu seed, compiled once, profiled through the judge (evaluators.judge.profile)
with the sandbox's layers switched off one at a time, on the big and a small shape. The
layer whose removal makes kernels appear is the one that hides them from ncu. Prints one
line per variant:  variant | status | kernels | ncu_kernel_ms | reason / ncu's first lines.

    python3 benchmarks/judge_gpu/ncu_matrix.py [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


#: A CUDA program of ours: one trivial kernel on memory it allocates (argv[1] == "own") or on
#: memory a parent process exported by IPC (the runner's way: the handle in hex on stdin).
_PROBE_CU = r"""
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
__global__ void fill(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 1.f; }
int main(int argc, char** argv) {
  const int n = 1 << 20; float* p = nullptr;
  if (argc > 1 && !strcmp(argv[1], "ipc")) {
    cudaIpcMemHandle_t h; unsigned char* b = reinterpret_cast<unsigned char*>(&h);
    for (size_t i = 0; i < sizeof h; ++i) { unsigned v; if (scanf("%2x", &v) != 1) return 3; b[i] = (unsigned char)v; }
    if (cudaIpcOpenMemHandle(reinterpret_cast<void**>(&p), h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) return 4;
  } else if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) return 2;
  fill<<<(n + 255) / 256, 256>>>(p, n);
  cudaError_t e = cudaDeviceSynchronize();
  printf("probe: %s\n", cudaGetErrorName(e));
  return e == cudaSuccess ? 0 : 1;
}
"""

#: The parent of the "ipc" probe: torch allocates, exports the handle, runs the probe under ncu.
_IPC_PARENT = r"""
import ctypes, subprocess, sys, torch
x = torch.zeros(1 << 20, device="cuda")
h = (ctypes.c_ubyte * 64)()
lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuIpcGetMemHandle(h, ctypes.c_uint64(x.data_ptr())) == 0
p = subprocess.run(sys.argv[1:], input=bytes(h).hex(), capture_output=True, text=True, timeout=100)
torch.cuda.synchronize()
print("exit", p.returncode, "| sum", float(x.sum()), "|", (p.stdout + " / " + p.stderr).replace(chr(10), " / ")[-500:])
"""


def _probe_rows(ncu: str, out: Path) -> list[tuple[str, list[str], str]]:
    """Rows that tell the runner from CUDA programs in general: the probe built with cudart
    static (as the runner is) and shared, on its own memory and on IPC-imported memory."""
    from evaluators.compile.toolchain import find_nvcc

    nvcc = find_nvcc()
    src = out / "probe.cu"
    src.write_text(_PROBE_CU)
    rows: list[tuple[str, list[str], str]] = []
    for rt in ("static", "shared"):
        exe = out / f"probe_{rt}"
        b = subprocess.run([nvcc, "-O2", "-cudart", rt, "-o", str(exe), str(src)], capture_output=True, text=True)
        if b.returncode:
            print(f"probe build ({rt}) failed: {b.stderr[-400:]}", flush=True)
            continue
        base = [ncu, "--target-processes", "all", "--launch-count", "1"]
        rows.append((f"raw: ncu over a CUDA probe (cudart {rt}), own memory", [*base, str(exe), "own"], ""))
        rows.append((f"raw: ncu over a CUDA probe (cudart {rt}), IPC memory from torch",
                     [sys.executable, "-c", _IPC_PARENT, *base, str(exe), "ipc"], ""))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/ncu_matrix"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from evaluators.base import CompileSettings, HarnessSettings
    from evaluators.compile import compile_candidate
    from evaluators.judge.judge import Judge
    from evaluators.judge.profile import profile_with_runner
    from evaluators.profile import find_ncu
    from evaluators.profile.settings import ProfileSettings
    from evaluators.sandbox import SandboxSettings
    from evo.core.records import Candidate
    from evo.engine.search import seed_for

    ncu = find_ncu()
    print("ncu:", ncu, subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
    # ncu and the runner alone, no sandbox, no judge: HELLO (CUDA context) then QUIT, and ncu
    # over a torch one-liner: does ncu profile anything on this machine, does the runner live under it
    from evaluators.protocol import PROTOCOL_VERSION
    from evaluators.runner import runner_binary

    runner = str(runner_binary("cuda"))
    raw = [
        ("raw: ncu over the runner, HELLO/QUIT", [ncu, "--target-processes", "all", runner],
         f"HELLO {PROTOCOL_VERSION}\nQUIT\n"),
        ("raw: ncu over a torch relu", [ncu, "--target-processes", "all", "--launch-count", "1", sys.executable, "-c",
                                        "import torch; torch.relu(torch.randn(1 << 20, device='cuda')); "
                                        "torch.cuda.synchronize()"], ""),
    ]
    raw += _probe_rows(ncu, args.out)
    # what ncu puts into its target's environment (its injection's paths: what Landlock's read
    # set must hold for the injection to load in a sandboxed runner)
    raw.append(("raw: the environment ncu adds to its target", [ncu, "--target-processes", "all", sys.executable, "-c",
                "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k not in "
                + repr(sorted(os.environ)) + "}))"], ""))
    for name, argv, stdin in raw:
        t0 = time.monotonic()
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        text = (p.stdout + " / " + p.stderr).replace("\n", " / ")
        print(f"{name} | exit {p.returncode} | {text[-600 if 'environment' not in name else -3000:]} | "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    src, params = seed_for("kb19_relu")
    cand = Candidate.create("kb19_relu", src, params)
    out = compile_candidate(cand, CompileSettings())
    assert out.result.passed, out.result.reason
    base = SandboxSettings.from_env()
    variants = [
        ("default, shape 1 (small)", base, {}, 1),
        ("default, shape 0", base, {}, 0),
        ("seccomp off", base, {"EVO_SANDBOX_SECCOMP": "0"}, 1),
        ("landlock off", dataclasses.replace(base, landlock=False), {}, 1),
        ("landlock reads off", dataclasses.replace(base, landlock_reads=False), {}, 1),
        ("landlock fs off", dataclasses.replace(base, landlock_fs=False), {}, 1),
        ("sandbox off (seccomp off too)", dataclasses.replace(base, enabled=False), {"EVO_SANDBOX_SECCOMP": "0"}, 1),
    ]
    for name, sb, env, shape in variants:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        t0 = time.monotonic()
        try:
            judge = Judge(backend="cuda", sandbox=sb, workdir=args.out / "work")
            r = profile_with_runner(judge, cand.id, out.so_bytes, "kb19_relu", shape,
                                    settings=ProfileSettings(cache_dir="", timeout_s=120),
                                    harness=HarnessSettings())
            m = r.metrics
            ncu_text = (r.artifacts.get("ncu") or "").strip().replace("\n", " / ")[:300]
            line = (f"{name} | {r.status.value} | {m.get('kernels')} | {m.get('ncu_kernel_ms')} | "
                    f"{r.reason[:200]} | {ncu_text} | {m.get('sandbox', '')}")
        except Exception as e:  # noqa: BLE001 - a diagnostic: every variant gets its line
            line = f"{name} | error | - | - | {type(e).__name__}: {str(e)[:400]}"
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(f"{line} | {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
