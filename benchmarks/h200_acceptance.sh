#!/usr/bin/env bash
# One device call for the evaluator and engine acceptance on an H200:
#   1. every task's seed: compile, check on every shape, time vs torch -> SEEDS.md
#   2. the embedded demo search (configs/demo.toml) with a reduced evaluation budget
# usage (device):  source .whl/setup.sh && bash benchmarks/h200_acceptance.sh "$OUT" [MAX_EVALS]
set -uo pipefail
out=${1:?output folder}; evals=${2:-40}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
python benchmarks/seeds.py --out "$out/seeds" --table "$out/SEEDS.md" --jobs 16 --timeout 150 \
  > "$out/seeds_stdout.txt" 2> "$out/seeds_stderr.txt"
echo "seeds rc=$? in $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
python -m evo.cli search configs/demo.toml --max-evals "$evals" --db "$out/demo.db" --no-progress \
  > "$out/demo_stdout.txt" 2> "$out/demo_stderr.txt"
echo "demo rc=$? in $(( $(date +%s) - t1 )) s"
tail -n 12 "$out/demo_stdout.txt"
grep -E "^\| " "$out/SEEDS.md" | cut -c1-110
