#!/usr/bin/env bash
# Issue 40's GPU tests, as session_check.sh and close_check.sh run them after their demos:
#   bash benchmarks/judge_gpu/gpu_tests.sh DIR
# the adversarial GPU tests under the judge -> DIR/b/, DIR/b_run.txt (EVO_JUDGE_ADV_S, default 120 s)
# the evaluation path's own GPU tests (hangs, re-timing, the stages' conformance)
#                                            -> DIR/gpu_path.txt (EVO_GPU_PATH_S, default 100 s)
set -u
dir=${1:?usage: gpu_tests.sh DIR}
mkdir -p "$dir"
cd "$(dirname "$0")/../.."
EVO_JUDGE_PARTS=adversarial EVO_JUDGE_ADV_S=${EVO_JUDGE_ADV_S:-120} bash benchmarks/h200_acceptance.sh "$dir/b" judge \
  > "$dir/b_run.txt" 2>&1
timeout "${EVO_GPU_PATH_S:-100}" "${PYTHON:-python3}" -m pytest -q -rs -p no:cacheprovider -m gpu \
  tests/gpu/test_harness_gpu.py tests/gpu/test_stages_conformance_gpu.py > "$dir/gpu_path.txt" 2>&1
