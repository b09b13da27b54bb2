#!/usr/bin/env bash
# GPU acceptance checks on an H200, as one device call. Steps (default: all, in this order):
#   seeds  every task's seed (benchmarks/lab/seeds.py): compile, check on every shape, time vs torch -> $OUT/SEEDS.md
#   demo   the embedded demo search (configs/demo.toml) -> $OUT/demo.db
#   gemm   GEMM search with ncu profiling + Optuna tuning + scripted LLM endpoint -> $OUT/gemm.db
#   tests  the gpu-marked tests, one bounded pytest per file (harness, export, profile, tasks, row stream,
#          exploits), then the self-test as the selftest step runs it -> $OUT/gpu_tests.txt (a line per
#          file and shard), $OUT/gpu_<file>.txt
#   files  only the gpu test files in EVO_GPU_TEST_FILES (e.g. "test_user_task_search_gpu"), bounded
#   selftest  the self-test alone (every task's null / zero / copy / constant / half kernels must fail),
#          split over EVO_SELFTEST_SHARDS (default 3) pytest processes on disjoint task lists at once
#          -> $OUT/gpu_selftest_<shard>.txt, a line per shard in $OUT/gpu_tests.txt
#   compile  every GEMM seed and variant configuration of the CPU compile tests (EVO_GEMM_COMPILE_ALL=1)
#          -> $OUT/compile_all.txt
#   judge  issue 40 on the GPU: the demo search (benchmarks/throughput.py, bounded by EVO_JUDGE_DEMO_S,
#          default 200 s: the demo runs to its end, champion confirmation included) -> $OUT/judge_demo.json;
#          the adversarial GPU tests -> $OUT/gpu_adversarial_judge.txt (the comparison with the removed
#          Python harness that issue 40's acceptance made: benchmarks/judge_gpu/h100/README.md)
#   bench  every seed vs torch with issue 8's targets and ncu reasons for misses -> $OUT/RESULTS.md
#          (about 9.5 minutes on an H200: run it in a device call of its own)
# usage (device):  source .whl/setup.sh && bash benchmarks/h200_acceptance.sh "$OUT" [STEP ...]
set -uo pipefail
out=${1:?output folder}; shift
steps=${*:-seeds demo gemm tests}   # bench is never implied: it needs a call of its own
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
# The GPU self-test split into EVO_SELFTEST_SHARDS (default 3) pytest processes over disjoint,
# round-robin task lists (which spreads the long GEMM builds), run at once: checks are not timed,
# so they may share the GPU. A kernel "fails" on any non-OK verdict, so a shard that ran out of
# GPU memory would pass vacuously: the verdicts naming out-of-memory are counted at the end.
selftest_shards() {
  local shards=${EVO_SELFTEST_SHARDS:-3} per=${EVO_GPU_TEST_TIMEOUT:-540} tasks part sh i
  tasks=${EVO_SELFTEST_TASKS:-$(python -c "from evo.tasks.registry import task_names; print(','.join(task_names()))")}
  IFS=, read -ra all <<< "$tasks"
  for ((sh = 0; sh < shards; sh++)); do
    part=$(for ((i = sh; i < ${#all[@]}; i += shards)); do printf '%s,' "${all[i]}"; done)
    ( EVO_SELFTEST_TASKS=${part%,} timeout "$per" python -m pytest -m gpu -q -s -rs -p no:cacheprovider \
        -o log_cli=true --log-cli-level=INFO tests/gpu/test_selftest.py > "$out/gpu_selftest_$sh.txt" 2>&1
      rc=$?
      echo "selftest shard $sh (${part%,}) rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)'): $(tail -n 1 "$out/gpu_selftest_$sh.txt")" \
        >> "$out/gpu_tests.txt" ) &
  done
  wait
  grep '^selftest shard' "$out/gpu_tests.txt"
  echo "kernel verdicts: $(cat "$out"/gpu_selftest_*.txt | grep -c '^\[selftest\]'); naming out-of-memory: $(cat "$out"/gpu_selftest_*.txt | grep '^\[selftest\]' | grep -ci 'out of memory')"
}

# One bounded pytest per gpu test file (a hang or a slow file cannot eat the call, and every
# file gets a verdict line in $out/gpu_tests.txt; its log in $out/gpu_<file>.txt).
gpu_files() {
  local per=${EVO_GPU_TEST_TIMEOUT:-300} f t1 rc
  for f in "$@"; do
    t1=$(date +%s)
    timeout "$per" python -m pytest -m gpu -q -s -rs -p no:cacheprovider -o log_cli=true --log-cli-level=INFO \
      "tests/gpu/$f.py" > "$out/gpu_$f.txt" 2>&1
    rc=$?
    echo "$f rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)') in $(( $(date +%s) - t1 )) s: $(tail -n 1 "$out/gpu_$f.txt")" \
      | tee -a "$out/gpu_tests.txt"
  done
}

for step in $steps; do
  t0=$(date +%s)
  case $step in
    seeds)
      python benchmarks/lab/seeds.py --out "$out/seeds" --table "$out/SEEDS.md" --jobs 16 --timeout 150 \
        > "$out/seeds_stdout.txt" 2> "$out/seeds_stderr.txt" ;;
    demo)
      python -m evo.cli search configs/demo.toml --db "$out/demo.db" --no-progress \
        > "$out/demo_stdout.txt" 2> "$out/demo_stderr.txt"
      tail -n 12 "$out/demo_stdout.txt" ;;
    gemm)
      python -m evo.cli fake-llm --cassette tests/fixtures/llm/gemm_optimize.jsonl --port 8011 \
        > "$out/fake_llm.txt" 2>&1 &
      llm=$!; sleep 2
      python -m evo.cli search configs/examples/gemm_profile_tune.toml --db "$out/gemm.db" --no-progress \
        > "$out/gemm_stdout.txt" 2> "$out/gemm_stderr.txt"
      kill $llm
      python - "$out/gemm.db" <<'PY' | tee "$out/gemm_summary.txt"
import json, sys
from evo.store import Store
s = Store.open_reader(sys.argv[1]); run = s.list_runs()[0]["id"]
ev = s.events(run)
prof = [e["payload"] for e in ev if e["kind"] == "profile"]
done = [e["payload"] for e in ev if e["kind"] == "tuning_done"]
calls = s.llm_calls(run)
quoted = [c for c in calls if c["kind"] == "optimize" and "Profile" in (c["prompt"] or "")]
print(f"run {run}: profiles {len(prof)} (ok {sum(p['status'] == 'ok' for p in prof)}), "
      f"ncu wall s {[p.get('ncu_wall_s') for p in prof]}")
print(f"studies finished {len(done)}, improved {[d['improved'] for d in done]}, "
      f"best {[d['best_fitness'] for d in done]} vs parent {[d['parent_fitness'] for d in done]}")
print(f"optimize prompts quoting profile numbers: {len(quoted)} of {sum(c['kind'] == 'optimize' for c in calls)}")
PY
      ;;
    tests)
      # One bounded pytest per file (a hang or a slow file cannot eat the call, and every file
      # gets a verdict line); the self-test (41 tasks x 5 kernels, long builds) goes last, in
      # shards (selftest_shards). EVO_GPU_TEST_TIMEOUT (s, per file or shard) and
      # EVO_SELFTEST_TASKS narrow it.
      : > "$out/gpu_tests.txt"
      gpu_files test_harness_gpu test_export_gpu test_profile_gpu test_tasks_gpu test_row_stream_gpu \
        test_adversarial_gpu test_user_task_search_gpu test_tolerance_fast_gpu test_inputs_fill_gpu
      selftest_shards ;;
    files)
      # Only the gpu test files named in EVO_GPU_TEST_FILES (space-separated, without .py).
      gpu_files ${EVO_GPU_TEST_FILES:?set EVO_GPU_TEST_FILES} ;;
    selftest)
      selftest_shards ;;
    compile)
      # Every GEMM seed and every variant configuration of the CPU compile tests (CI builds a
      # representative of each: tests/toolchain.py, "Variants"), on this machine's cores.
      EVO_GEMM_COMPILE_ALL=1 timeout "${EVO_COMPILE_TIMEOUT:-540}" python -m pytest -q -n "$(nproc)" -m slow \
        -p no:cacheprovider tests/test_gemm_seeds.py tests/test_gemm_3xtf32.py > "$out/compile_all.txt" 2>&1
      echo "compile rc=$?: $(tail -n 1 "$out/compile_all.txt")" ;;
    judge)
      # EVO_JUDGE_PARTS narrows it (default: runner demo adversarial); the card's
      # memory and activity are sampled every second throughout -> $out/gpu_mem.csv
      parts=${EVO_JUDGE_PARTS:-runner demo adversarial}
      nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 1000 \
        > "$out/gpu_mem.csv" 2>&1 &
      smi=$!
      if [[ " $parts " == *" runner "* ]]; then
        timeout 120 python -m pytest -m gpu -q -s -rs -p no:cacheprovider tests/test_runner.py tests/test_judge_profile.py \
          > "$out/gpu_runner.txt" 2>&1
        echo "runner + profile gpu tests rc=$?: $(tail -n 1 "$out/gpu_runner.txt")"; grep -E "^(FAILED|ERROR)|Error" "$out/gpu_runner.txt" | head -n 8
      fi
      if [[ " $parts " == *" ncu "* ]]; then
        timeout 240 python benchmarks/judge_gpu/ncu_matrix.py --out "$out/ncu_matrix" > "$out/ncu_matrix.txt" 2>&1
        echo "ncu matrix rc=$?"; cat "$out/ncu_matrix.txt" | grep -v "^warning" | tail -n 12
      fi
      if [[ " $parts " == *" demo "* ]]; then
        timeout $(( ${EVO_JUDGE_DEMO_S:-200} + 60 )) python benchmarks/throughput.py --part demo \
          --limit-s "${EVO_JUDGE_DEMO_S:-200}" --json "$out/judge_demo.json" --keep-db "$out" \
          > "$out/judge_demo.txt" 2>&1
        echo "judge demo rc=$?"; tail -n 8 "$out/judge_demo.txt"
      fi
      if [[ " $parts " == *" adversarial "* ]]; then
        EVO_ADVERSARIAL_TABLE="$out/adversarial_judge.md" timeout "${EVO_JUDGE_ADV_S:-180}" \
          python -m pytest -m gpu -q -s -rs -p no:cacheprovider tests/gpu/test_adversarial_gpu.py \
          > "$out/gpu_adversarial_judge.txt" 2>&1
        echo "adversarial (judge) rc=$?: $(tail -n 1 "$out/gpu_adversarial_judge.txt")"
        cat "$out/adversarial_judge.md" 2>/dev/null
      fi
      kill $smi 2>/dev/null
      echo "card memory used, max MiB: $(cut -d, -f2 "$out/gpu_mem.csv" | tr -dc '0-9\n' | sort -n | tail -n 1)" ;;
    bench)
      timeout 575 python -m evo.cli bench --targets benchmarks/targets.toml --profile-misses \
        --out "$out/RESULTS.md" --jobs 16 > "$out/bench_log.txt" 2>&1
      sed -n '/## Families/,/^$/p' "$out/RESULTS.md" ;;
    *) echo "unknown step $step (seeds demo gemm tests files selftest compile judge bench)"; exit 2 ;;
  esac
  echo "$step rc=$? in $(( $(date +%s) - t0 )) s"
done
[ -f "$out/SEEDS.md" ] && grep -E "^\| " "$out/SEEDS.md" | cut -c1-110
