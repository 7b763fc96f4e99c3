#!/usr/bin/env bash
# AdamW on the CPU: optstep against torch fused / foreach and DeepSpeedCPUAdam on 16M, 64M, the
# 124M GPT layout and 2048 tensors of 16K, in one run, the medians of --rounds rounds printed
# (bench/compare/adamw.py). Builds
# //bench:adamw_compare (optstep's side and the streaming triad) and runs the references in the
# comparison venv (bench/compare/venv.sh), on all cores.
#
#   bench/compare/adamw.sh [--steps N] [--rounds N] [--no_deepspeed]
#
# OPTSTEP_CPU_ISA=baseline|avx2|avx512: optstep's narrower variants (docs/configuration.md).
# OPTSTEP_COMPARE_BAZEL_FLAGS: flags of the build (default "-c opt").
# OPTSTEP_COMPARE_BAZEL_STARTUP: bazel's startup options, e.g.
#   "--output_base=$HOME/.cache/bazel-optstep-opt" to keep the opt build apart from a checkout's
#   everyday fastbuild cache (default: none).
# OMP_WAIT_POLICY applies to every optimizer of the run alike (docs/benchmarks.md uses passive).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
read -r -a flags <<< "${OPTSTEP_COMPARE_BAZEL_FLAGS:--c opt}"
read -r -a startup <<< "${OPTSTEP_COMPARE_BAZEL_STARTUP:-}"
bazel "${startup[@]}" build "${flags[@]}" //bench:adamw_compare >&2
bin="$(bazel "${startup[@]}" info "${flags[@]}" bazel-bin 2>/dev/null)/bench/adamw_compare"
venv="$(bench/compare/venv.sh)"
exec "$venv/bin/python" bench/compare/adamw.py --optstep_bin "$bin" "$@"
