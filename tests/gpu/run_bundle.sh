#!/usr/bin/env bash
# Runs the GPU bundle of tests/gpu/make_bundle.sh on a GPU machine that has no Bazel and none of
# the project's build dependencies: only the NVIDIA driver, and the CUDA libraries (cuBLAS,
# cuSOLVER, NCCL) from a CUDA 13 toolkit or NVIDIA wheels in a Python's site-packages. Under
# 7 minutes in all; exits non-zero when anything fails (docs/gpu.md says what each figure means).
#
#   tests/gpu/run_bundle.sh [BUNDLE_DIR]     # from the repository root; default build/gpu-bundle
#
#   1. the GPU and driver (nvidia-smi), and where each CUDA library is loaded from;
#   2. every gpu test of the bundle (tests.txt: its timeout and environment);
#   3. benchmarks: optim_bench --device=cuda (device copy bandwidth, device AdamW and the other
#      element-wise parts, Newton–Schulz against the bare cuBLAS GEMM sequence, one step of the
#      124M GPT-like model under adam, muon, adaptive_muon and soap), kernels_bench (the CPU
#      AdamW on this machine's cores against its triad);
#   4. the server on cuda:0 (--comm=nccl, world size 1), trained through by train_mlp (adam, sgd);
#   5. compute-sanitizer --tool memcheck over the device conformance test.
# Every step's output goes to the terminal and, when $OUT is set, to $OUT/<step>.txt (gtest XML
# under $OUT/tests/); $OUT/summary.txt lists each step's result.
# The functions run by `step` are called through `bash -c` (SC2317: not unreachable).
# shellcheck disable=SC2317
set -uo pipefail
bundle=$(realpath "${1:-build/gpu-bundle}")
bundle_script=$(realpath "$0")
budget_s=${BUNDLE_BUDGET_S:-420}
start=$(date +%s)
out_dir=${OUT:+$(realpath -m "$OUT")}
[[ -n "$out_dir" ]] && mkdir -p "$out_dir/tests"
work=$(mktemp -d -t optstep-gpu.XXXXXX)
export bundle work bundle_script
trap 'rm -rf "$work"' EXIT
failures=()
summary=()

# remaining: seconds left of the whole run's budget.
remaining() { echo $((budget_s - ($(date +%s) - start))); }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND (a program, or a function of this script exported
# with `export -f`) under `timeout` (at most what is left of the budget), its output to the
# terminal and to $OUT/NAME.txt; records the result.
step() {
  local name=$1 limit=$2 rc
  shift 2
  local left
  left=$(remaining)
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    echo "=== $name: SKIPPED, out of time"
    failures+=("$name (out of time)")
    summary+=("$name: not run (out of time)")
    return 1
  fi
  echo "=== $name (timeout ${limit}s): $*"
  local step_start
  step_start=$(date +%s)
  [[ $(type -t "$1") == function ]] && set -- bash -c '"$@"' bash "$@"
  if [[ -n "$out_dir" ]]; then
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$out_dir/$name.txt"
  else
    timeout --kill-after=5 "$limit" "$@" 2>&1
  fi
  rc=${PIPESTATUS[0]}
  local took=$(($(date +%s) - step_start))
  if ((rc == 0)); then
    summary+=("$name: ok in ${took}s")
  else
    ((rc == 124 || rc == 137)) && rc="$rc (timed out)"
    failures+=("$name")
    summary+=("$name: FAILED, exit $rc after ${took}s")
  fi
  echo "=== $name: exit $rc after ${took}s ($(($(date +%s) - start))s in all)"
}

finish() {
  local line
  line="gpu bundle: $([[ ${#failures[@]} -eq 0 ]] && echo passed || echo "FAILED (${failures[*]})")"
  line+=" in $(($(date +%s) - start)) s"
  echo
  printf '%s\n' "${summary[@]}" "$line"
  [[ -n "$out_dir" ]] && printf '%s\n' "${summary[@]}" "$line" >"$out_dir/summary.txt"
  [[ ${#failures[@]} -eq 0 ]]
  exit $?
}

# ---- the bundle ------------------------------------------------------------------------------
if [[ -f "$bundle/bundle.tar.xz" ]]; then
  cp "$bundle"/tests.txt "$bundle"/MANIFEST "$work/"
  xz -dc "$bundle/bundle.tar.xz" | tar -xf - -C "$work" || { failures+=(unpack); finish; }
  bundle=$work
fi
export bundle
[[ -f "$bundle/tests.txt" ]] || { echo "no bundle at $bundle (tests/gpu/make_bundle.sh)" >&2; exit 2; }
head -2 "$bundle/MANIFEST"

# The bundled libstdc++ and libgcc_s need the build machine's glibc (MANIFEST: "needs GLIBC_x.y").
# On an older glibc the machine's own C++ runtime is used instead (every binary still needs no
# newer GLIBCXX than GCC 12's); the libraries check below says whether that is enough.
needed=$(sed -n 's/^# C++ runtime needs GLIBC_\([0-9.]*\)$/\1/p' "$bundle/MANIFEST")
have=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if [[ -n "$needed" && -n "$have" && "$(printf '%s\n' "$needed" "$have" | sort -V | head -1)" != "$needed" ]]; then
  echo "glibc $have is older than the $needed of the bundled C++ runtime: using the machine's"
  if [[ "$bundle" != "$work" ]]; then
    cp -r "$bundle"/. "$work/"
    bundle=$work
  fi
  rm -f "$bundle"/lib/libstdc++.so.* "$bundle"/lib/libgcc_s.so.*
fi

# ---- 1. the machine --------------------------------------------------------------------------
step gpu_info 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
  --format=csv

# The CUDA libraries: the toolkit's first, then every NVIDIA wheel's lib folder (nvidia/*/lib,
# and nvidia/cu13/lib of the CUDA 13 wheels) of the site-packages of python3. A wheel's
# compute-sanitizer is remembered for step 5.
cuda_dirs=()
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && cuda_dirs+=("$d")
done
wheel_sanitizer=
while read -r d; do
  case "$d" in
    "sanitizer "*) wheel_sanitizer=${d#sanitizer } ;;
    ?*) cuda_dirs+=("$d") ;;
  esac
done < <(python3 - 2>/dev/null <<'EOF'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
        if glob.glob(os.path.join(d, "lib*.so*")):
            print(d)
    for tool in glob.glob(os.path.join(root, "nvidia", "*", "compute-sanitizer", "compute-sanitizer")):
        print("sanitizer " + tool)
EOF
)
export LD_LIBRARY_PATH
LD_LIBRARY_PATH=$(IFS=:; echo "$bundle/lib:${cuda_dirs[*]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

# Every binary's libraries must resolve; print where the CUDA ones come from.
check_libraries() {
  local missing=0 name
  for name in "$bundle"/*; do
    [[ -f "$name" && -x "$name" ]] || continue
    if ldd "$name" 2>&1 | grep -q 'not found'; then
      echo "$(basename "$name"): $(ldd "$name" 2>&1 | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')"
      missing=1
    fi
  done
  echo "CUDA libraries:"
  ldd "$bundle"/* 2>/dev/null | grep -E 'lib(cublas|cusolver|cusparse|nvJitLink|nccl)' |
    sed 's/ (0x.*//' | sort -u
  return "$missing"
}
export -f check_libraries
step libraries 30 check_libraries

# ---- 2. the gpu tests ------------------------------------------------------------------------
while read -r name timeout_s env_vars; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  mkdir -p "$work/tmp/$name"
  # shellcheck disable=SC2086
  step "$name" "$timeout_s" env TEST_TMPDIR="$work/tmp/$name" $env_vars \
    "$bundle/$name" --gtest_output="xml:${out_dir:-$work}/tests/$name.xml"
done <"$bundle/tests.txt"

# ---- 3. benchmarks ---------------------------------------------------------------------------
# DeviceCopy runs first (registration order): every ratio divides by its GB/s.
step optim_bench 150 "$bundle/optim_bench" --device=cuda --benchmark_min_time=0.2 \
  --benchmark_color=false --benchmark_out="$work/optim_bench.json" \
  '--benchmark_filter=DeviceCopy|Elementwise/|NewtonSchulz/|NsCublas|GptStep/(adam|muon|muon_highest|adaptive_muon|soap)/'
[[ -n "$out_dir" && -f "$work/optim_bench.json" ]] && cp "$work/optim_bench.json" "$out_dir/"

# The references on the same GPU, where python3 has torch with CUDA: torch's copy and fused
# AdamW, torch.optim.Muon and its Newton–Schulz, against optim_bench's figures above. A machine
# without them skips this step (it is no check of the bundle). REFERENCE_WHEELS: a folder of
# pure-Python wheels (Emerging-Optimizers 0.3.0) installed for this step alone.
torch_reference() {
  if ! python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "skipped: python3 has no torch with CUDA"
    return 0
  fi
  if [[ -n "${REFERENCE_WHEELS:-}" ]]; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$work/site" \
      "$REFERENCE_WHEELS"/*.whl || return 1
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  python3 "$(dirname "$bundle_script")/../../bench/compare/matrix_reference.py" --device=cuda \
    --threads="$(nproc)" --repeats=10 --optstep_json="$work/optim_bench.json"
}
export -f torch_reference
[[ -f "$work/optim_bench.json" ]] && step torch_reference 90 torch_reference
step kernels_bench 60 "$bundle/kernels_bench" --benchmark_min_time=0.1 --benchmark_color=false \
  '--benchmark_filter=Triad|AdamW'

# ---- 4. the server on CUDA, world size 1, a trainer through it ---------------------------------
server_on_cuda() {
  local log="$work/server.log" server address optimizer rc=0
  "$bundle/optstep_server" --device=cuda:0 --comm=nccl --world_size=1 --port=0 \
    --host=127.0.0.1 >"$log" 2>&1 &
  server=$!
  # On the step's timeout too: no server left behind.
  trap 'kill "$server" 2>/dev/null; cat "$log"; exit 1' TERM
  for _ in $(seq 300); do
    grep -q "listening on" "$log" && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  address=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$log")
  if [[ -z "$address" ]]; then
    echo "the server did not start:"
    cat "$log"
    kill "$server" 2>/dev/null
    return 1
  fi
  echo "server on cuda:0 (--comm=nccl, world size 1) at $address"
  for optimizer in adam sgd; do
    "$bundle/train_mlp" --server="$address" --optimizer="$optimizer" --steps=200 || rc=1
  done
  kill -TERM "$server"
  wait "$server" || { echo "the server exited with $?"; rc=1; }
  echo "--- server log"
  cat "$log"
  return "$rc"
}
export -f server_on_cuda
step server_cuda 60 server_on_cuda

# ---- 5. memcheck -----------------------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer)
for candidate in "${CUDA_HOME:-/usr/local/cuda}"/{bin,compute-sanitizer}/compute-sanitizer \
  "$wheel_sanitizer"; do
  [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer=$candidate
done
if [[ -n "$sanitizer" ]]; then
  # API errors are not reported: the suite provokes some on purpose (an allocation of 2^52
  # bytes must come back as RESOURCE_EXHAUSTED), and the code checks every API status itself.
  step memcheck 120 "$sanitizer" --tool memcheck --error-exitcode 1 --report-api-errors no \
    "$bundle/device_conformance_cuda_test"
else
  echo "=== memcheck: compute-sanitizer not found (CUDA toolkit)"
  failures+=("memcheck (no compute-sanitizer)")
  summary+=("memcheck: not run, no compute-sanitizer")
fi

finish
