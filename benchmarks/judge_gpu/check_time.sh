#!/usr/bin/env bash
# Issue 40's "`evo check` of a legit kernel, start to verdict": the kb19_relu seed written to a
# file with its parameters, then `evo check` run on it twice (cold, then with the caches warm),
# each timed from the command's start to its exit.  Output: OUT/check_time.txt
#   source .whl/setup.sh && bash benchmarks/judge_gpu/check_time.sh "$OUT"
set -u
out=${1:?usage: check_time.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
dir=$(mktemp -d)
params=$($py - "$dir/seed.cu" <<'PY'
import sys
from evo.engine.search import seed_for
src, params = seed_for("kb19_relu")
open(sys.argv[1], "w").write(src)
print(" ".join(f"--params {k}={v}" for k, v in params.items()))
PY
)
for run in 1 2; do
  t0=$(date +%s%N)
  $py -m evo.cli check "$dir/seed.cu" --task kb19_relu $params > "$out/check_$run.txt" 2>&1
  rc=$?
  t1=$(date +%s%N)
  echo "evo check kb19_relu seed, run $run: rc=$rc, start to verdict $(( (t1 - t0) / 1000000 )) ms" | tee -a "$out/check_time.txt"
  cat "$out/check_$run.txt" >> "$out/check_time.txt"
done
