#!/usr/bin/env bash
# The device checks, on a machine with a GPU (one script, under 8 minutes):
#   1. builds with --config=cuda and runs the gpu-tagged tests
#      (bazel test --config=cuda --config=gpu_tests //...): the Device conformance suite on
#      cuda:0 and the *_gpu variants of the optimizer tests (NS, Muon, AdaptiveMuon, SOAP, Lion);
#   2. runs the GPU benchmarks (optim_bench --device=cuda: device copy bandwidth, element-wise
#      parts, Newton–Schulz per matrix, GPT-like optimizer steps) and prints the figures.
# Every command's output is also written under $OUT when that variable is set.
#
#   tests/gpu/run_device_checks.sh                      # from anywhere in the repository
#   SKIP_BENCH=1 tests/gpu/run_device_checks.sh         # tests only
set -uo pipefail
cd "$(dirname "$0")/../.."

out_dir="${OUT:-}"
if [[ -n "$out_dir" ]]; then mkdir -p "$out_dir"; fi
start=$(date +%s)
status=0

# run NAME COMMAND...: runs the command, its output to the terminal and to $OUT/NAME.txt.
run() {
  local name="$1"
  shift
  echo "=== $name: $*"
  if [[ -n "$out_dir" ]]; then
    "$@" 2>&1 | tee "$out_dir/$name.txt"
  else
    "$@" 2>&1
  fi
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $(($(date +%s) - start)) s"
  return "$rc"
}

run gpu_info nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || status=1

# Tests: everything tagged gpu, built with the CUDA device (timeouts well inside the budget).
run gpu_tests bazel test --config=cuda --config=gpu_tests --test_output=errors \
  --test_timeout=240 --jobs="$(nproc)" //... || status=1

# Benchmarks: optimized build, the GPU device. The GPT-like steps run one layer and the rest
# (embeddings) of a 124.4M-parameter model; the summary extrapolates to 12 layers.
if [[ -z "${SKIP_BENCH:-}" ]]; then
  run gpu_bench bazel run -c opt --config=cuda //bench:optim_bench -- --device=cuda \
    --benchmark_min_time=0.2 || status=1
fi

echo "device checks: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $(($(date +%s) - start)) s"
exit "$status"
