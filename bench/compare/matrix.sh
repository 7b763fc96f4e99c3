#!/usr/bin/env bash
# Newton–Schulz (3 shapes, `highest` and `medium`), the Muon step of the 124M GPT layout
# (`medium` and `highest`) and SOAP on one GPT layer: optstep against Emerging-Optimizers 0.3.0
# and torch.optim.Muon, in one run, ratios printed (bench/compare/matrix_reference.py).
#
#   bench/compare/matrix.sh [--threads N] [--repeats N]
#
# optstep's side is bench/optim_bench (one device, N OpenMP threads, the GEMM backend the CPU
# device picks: OPTSTEP_CPU_GEMM, docs/configuration.md); the references run in the comparison
# venv (bench/compare/venv.sh), with torch on the same N threads. Emerging-Optimizers needs Python
# >= 3.12: it is installed when the venv's Python has it (PYTHON=python3.12 picks the interpreter
# of a new venv), else its columns are skipped and the table says why.
#
# OPTSTEP_COMPARE_BAZEL_FLAGS: flags of the optim_bench build (default "-c opt").
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

threads=$(nproc)
repeats=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--repeats N]" >&2; exit 2 ;;
  esac
done

venv=$(bench/compare/venv.sh)
py="$venv/bin/python"
if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  "$py" -c 'import emerging_optimizers' 2>/dev/null ||
    "$venv/bin/pip" install --quiet "emerging-optimizers==0.3.0" >&2
else
  echo "note: $("$py" -V) in $venv; Emerging-Optimizers 0.3.0 needs Python >= 3.12:" \
       "its columns will be skipped" >&2
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# shellcheck disable=SC2086
bazel build ${OPTSTEP_COMPARE_BAZEL_FLAGS--c opt} //bench:optim_bench >&2
bin="$(bazel info ${OPTSTEP_COMPARE_BAZEL_FLAGS--c opt} bazel-bin 2>/dev/null)/bench/optim_bench"
OMP_NUM_THREADS=$threads "$bin" \
  --benchmark_filter='^(NewtonSchulz/|GptStep/(muon|muon_highest|soap|soap_medium)/)' \
  --benchmark_out="$out/optstep.json" --benchmark_out_format=json >&2
"$py" bench/compare/matrix_reference.py --optstep_json "$out/optstep.json" \
  --threads "$threads" --repeats "$repeats"
