"""Regenerate benchmarks/probes/f32_3xtf32.json and benchmarks/probes/src/<task>_3xtf32.cu.

    python benchmarks/probes/make_f32_3xtf32.py      # from the repository root

One check+time entry per strict-fp32 GEMM task (the F32_3XTF32_SEEDS seed as rendered now),
then tunable sweeps: time-only where only tile sizes / pipeline depth / launch bounds move,
check+time where a variant takes another code path (staged epilogue, PTX cvt, split factor).
Run on the GPU with ``python benchmarks/probe.py benchmarks/probes/f32_3xtf32.json``.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from evo.tasks.gemm_seeds import F32_3XTF32_SEEDS
from evo.tasks.seedspec import render
from evo.tunables import parse_tunables, violated_constraints

root = ROOT
entries = []
srcs = {}
for task, spec in F32_3XTF32_SEEDS.items():
    src = render(spec)
    path = f"benchmarks/probes/src/{task}_3xtf32.cu"
    (root / path).write_text(src)
    srcs[task] = (path, src)
    params = {t.name: t.default for t in parse_tunables(src)}
    assert violated_constraints(src, params) == []
    entries.append({"label": f"{task} 3xTF32 seed", "task": task, "source": path, "params": params,
                    "mode": "check+time"})

def variant(task, label, check=False, **kw):
    path, src = srcs[task]
    params = {t.name: t.default for t in parse_tunables(src)}
    params.update({k: str(v) for k, v in kw.items()})
    bad = violated_constraints(src, params)
    assert not bad, (label, bad)
    entries.append({"label": f"{task} {label}", "task": task, "source": path, "params": params,
                    "mode": "check+time" if check else "time-only"})

V = variant
V("kb01_square", "128x128x32 s4", STAGES=4)
V("kb01_square", "128x128x32 s2", STAGES=2)
V("kb01_square", "128x128x16 s4", BK=16, STAGES=4)
V("kb01_square", "128x128x16 s5", BK=16, STAGES=5)
V("kb01_square", "warps 4x2 (warp 32x64)", WARPS_M=4, WARPS_N=2)
V("kb01_square", "warps 4x4 (warp 32x32, 512 thr)", WARPS_M=4, WARPS_N=4)
V("kb01_square", "64x128 warps 2x4 MIN_BLOCKS 2", BM=64, BN=128, MIN_BLOCKS=2)
V("kb01_square", "128x64 warps 2x2 MIN_BLOCKS 2", BN=64, WARPS_N=2, MIN_BLOCKS=2)
V("kb01_square", "256x64 warps 4x4 (warp 64x16)", BM=256, BN=64, WARPS_M=4, WARPS_N=4, STAGES=3)
V("kb01_square", "EPI_SMEM 1", EPI_SMEM=1, check=True)
V("kb01_square", "TF32_CVT 1 (PTX cvt.rna)", TF32_CVT=1, check=True)
V("kb01_square", "GROUP_M 16", GROUP_M=16)
V("kb01_square", "GROUP_M 1", GROUP_M=1)
V("kb06_large_k", "64x64 warps 2x4", WARPS_N=4)
V("kb06_large_k", "64x64 s5", STAGES=5)
V("kb06_large_k", "64x64 BK16 s5", BK=16, STAGES=5)
V("kb06_large_k", "128x64 split 8 (64 CTAs)", BM=128, WARPS_M=2, WARPS_N=2, BN=64)
V("kb06_large_k", "64x64 split 4", SPLIT_K=4, check=True)
V("kb07_small_k", "EPI_SMEM 0", check=True, EPI_SMEM=0)
V("kb07_small_k", "64x128 MIN_BLOCKS 2", BM=64, MIN_BLOCKS=2)
V("kb09_tall_skinny", "EPI_SMEM 0", check=True, EPI_SMEM=0)
V("kb09_tall_skinny", "64x128 MIN_BLOCKS 2", BM=64, MIN_BLOCKS=2)
V("kb09_tall_skinny", "warps 4x4 (512 thr)", WARPS_M=4, WARPS_N=4)
(root / "benchmarks/probes/f32_3xtf32.json").write_text(json.dumps(entries, indent=1) + "\n")
print(len(entries), "entries")
