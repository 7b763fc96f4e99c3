#!/usr/bin/env bash
# Makes (once) and prints the path of the comparison benchmarks' own virtual environment: torch
# and DeepSpeed from PyPI, next to nothing else of the project. The tests never use it.
#
#   bench/compare/venv.sh            # creates or reuses $OPTSTEP_COMPARE_VENV
#
# OPTSTEP_COMPARE_VENV: where the venv lives (default: .venv-compare at the repository root).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${OPTSTEP_COMPARE_VENV:-$root/.venv-compare}"
# The versions the figures in docs/benchmarks.md were measured with.
packages=(torch==2.15.0 deepspeed==0.19.8 numpy ninja py-cpuinfo psutil)
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, deepspeed" >/dev/null 2>&1; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet "${packages[@]}" >&2
fi
echo "$venv"
