#!/usr/bin/env bash
# Issue 40's closing GPU check in one call, on a fresh machine (benchmarks/judge_gpu/h100/README.md,
# "Session 11"):   source .whl/setup.sh && bash benchmarks/judge_gpu/close_check.sh "$OUT"
# 1. the demo twice: first with every cache of the machine cold (Triton's, the compile cache, the
#    page cache: a user's first run), then again (a user's next run)  -> OUT/cold.tgz, OUT/warm.tgz
# 2. `evo check` of the kb19_relu seed, start to verdict, twice       -> OUT/check_time.txt
# 3. the adversarial GPU tests under the judge, and the evaluation path's own GPU tests (gpu_tests.sh)
#                                                                      -> OUT/tests.tgz
# A table of the lines that matter last (and in OUT/summary.txt). Five files come back.
set -u
out=${1:?usage: close_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
for r in cold warm; do
  EVO_CHECK_QUICK=1 bash benchmarks/judge_gpu/session_check.sh "$work/$r" > "$work/$r.log" 2>&1
  (cd "$work" && tar czf "$out/$r.tgz" "$r" "$r.log")
done
bash benchmarks/judge_gpu/check_time.sh "$work/check" > /dev/null 2>&1
cp "$work/check/check_time.txt" "$out/check_time.txt"
bash benchmarks/judge_gpu/gpu_tests.sh "$work"
(cd "$work" && tar czf "$out/tests.tgz" b b_run.txt gpu_path.txt)
{ echo "== GPU"; cat "$work/cold/gpu.txt"
  for r in cold warm; do
    echo "== demo, $r"
    grep -E '^\| demo|card memory|evaluations:' "$work/$r/a_run.txt"
    grep -m 2 "behind warm" "$work/$r/a_run.txt"
  done
  echo "== evo check"; grep "start to verdict" "$work/check/check_time.txt"
  echo "== adversarial"; grep -E "rc=|passed|failed" "$work/b_run.txt" | tail -n 3
  echo "== evaluation path"; tail -n 3 "$work/gpu_path.txt"; } > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
