#!/usr/bin/env bash
# Issue 40's GPU check in one call (benchmarks/judge_gpu/h100/README.md, "Session 7"):
#   source .whl/setup.sh && bash benchmarks/judge_gpu/session_check.sh "$OUT"
# 1. the GPU, torch, CUDA and Triton versions          -> OUT/gpu.txt
# 2. the timed calls' input draw: speed and repeat bits -> OUT/fill_speed.txt (the tests' lines last)
# 3. the demo under the judge to its end, its records   -> OUT/a.tgz (demo.db, startup_events.txt,
#    read by startup_events.py and evaluation_gaps.py       evaluation_gaps.txt, judge_demo.*)
#    then a local Ray instance's start, three ways (ray_start.py)  -> OUT/ray_start.txt
# 4. the adversarial GPU tests under the judge          -> OUT/b.tgz (EVO_JUDGE_ADV_S, default 120 s)
# 5. the evaluation path's own GPU tests (hangs, re-timing, the stages' conformance)
#                                                       -> OUT/gpu_path.txt (EVO_GPU_PATH_S, default 100 s)
# The demo's results are packed before step 4, so a call cut short there keeps them;
# EVO_CHECK_QUICK=1 runs the demo alone (steps 1 and 3).
set -u
out=${1:?usage: session_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $py -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  date -u; } > "$out/gpu.txt" 2>&1
# The carried wheels are installed with --no-compile (.whl/setup.sh); `pip install` byte-compiles
# them by default, so a user's first run imports Ray from .pyc files: do the same here, before
# anything is timed, so that the demo's start-up is a user's first run, not the install's.
t0=$(date +%s)
[ -d /tmp/site ] && $py -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
echo "byte-compiled /tmp/site (as pip install does) in $(( $(date +%s) - t0 )) s" >> "$out/gpu.txt"
if [ -z "${EVO_CHECK_QUICK:-}" ]; then
  timeout 90 $py benchmarks/judge_gpu/fill_speed.py > "$out/fill_speed.txt" 2>&1
  timeout 120 $py -m pytest -q -p no:cacheprovider -m gpu tests/test_judge_fill.py >> "$out/fill_speed.txt" 2>&1
fi
EVO_JUDGE_PARTS=demo bash benchmarks/h200_acceptance.sh "$out/a" judge > "$out/a_run.txt" 2>&1
for s in startup_events evaluation_gaps; do
  $py "benchmarks/judge_gpu/$s.py" "$out/a/demo.db" > "$out/a/$s.txt" 2>&1
done
# the lines the summary below shows: where start-up waited, and the confirmations against the end
{ grep -m 4 "waited" "$out/a/evaluation_gaps.txt"; grep -E "confirm_start|finish|evaluations:" "$out/a/startup_events.txt"; } \
  >> "$out/a_run.txt" 2>/dev/null
(cd "$out" && tar czf a.tgz a && rm -rf a)
# a local Ray instance's start alone, beside torch's import, and as a child process (after the
# demo: the probe warms the caches the demo's start met cold)
[ -z "${EVO_CHECK_QUICK:-}" ] && timeout 200 $py benchmarks/judge_gpu/ray_start.py > "$out/ray_start.txt" 2>&1
if [ -n "${EVO_CHECK_QUICK:-}" ]; then   # the demo only (no draw or Ray probes), when little device time is left
  echo "== GPU"; cat "$out/gpu.txt"; echo "== demo"; tail -n 20 "$out/a_run.txt"; exit 0
fi
bash benchmarks/judge_gpu/gpu_tests.sh "$out"   # steps 4 and 5
(cd "$out" && tar czf b.tgz b && rm -rf b)   # eight files at most come back from a device call
echo "== GPU";          cat "$out/gpu.txt"
echo "== input draw";   cat "$out/fill_speed.txt"
echo "== demo";         tail -n 20 "$out/a_run.txt"
echo "== Ray's start";  cat "$out/ray_start.txt"
echo "== adversarial";  grep -E "rc=|passed|failed" "$out/b_run.txt" | tail -n 3
echo "== evaluation path";  tail -n 3 "$out/gpu_path.txt"
