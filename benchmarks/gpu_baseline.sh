#!/usr/bin/env bash
# The landed path's GPU baseline, as one device call (issues 40 and 41):
#   1. `evo check` of the kb19_relu seed, start to verdict (wall seconds): issue 40's "before";
#   2. `evo bench` of every seed, eager and torch.compile columns (issue 41), bounded by
#      EVO_BENCH_TIMEOUT (default 420 s); the table is rewritten after every kernel, so a bench
#      cut short keeps its rows.
# usage (device):  source .whl/setup.sh && bash benchmarks/gpu_baseline.sh "$OUT"
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; date -u; } | tee "$out/gpu.txt"
python3 -c "from evo.tasks.seeds import seed_source; print(seed_source('kb19_relu'))" > "$out/kb19_relu_seed.cu"
for i in 1 2; do
  t0=$(date +%s.%N)
  python3 -m evo.cli check "$out/kb19_relu_seed.cu" --task kb19_relu > "$out/check_$i.txt" 2>&1
  rc=$?
  echo "evo check kb19_relu seed (run $i): rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" | tee -a "$out/check_wall.txt"
done
tail -n 15 "$out/check_2.txt"
t0=$(date +%s)
timeout "${EVO_BENCH_TIMEOUT:-420}" python3 -m evo.cli bench --targets benchmarks/targets.toml \
  --out "$out/RESULTS.md" --jobs 16 > "$out/bench_log.txt" 2>&1
echo "bench rc=$? in $(( $(date +%s) - t0 )) s"
grep -c '^| ' "$out/RESULTS.md" 2>/dev/null
sed -n '/## Families/,/^$/p' "$out/RESULTS.md" 2>/dev/null
tail -n 5 "$out/bench_log.txt"
