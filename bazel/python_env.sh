#!/usr/bin/env bash
# Creates .venv with what the Python client, its tests, its type check and the demo need, from
# PyPI: grpcio, grpcio-tools, protobuf, numpy, pytest, torch, scikit-learn, matplotlib, mypy (with
# the protobuf and grpcio type stubs), ruff, transformers, accelerate and lightning (the trainer
# examples), and the package itself (client/python, editable, stubs generated from proto/).
# Idempotent: does nothing when .venv was built from the same inputs (this script, the package's
# build files, the protos). The system Python stays untouched. Prints the
# venv's python on the last line.
#
# torch comes from PyPI, whose Linux x86_64 wheels pull the CUDA libraries (about 5 GB installed;
# the CPU-only wheels live on another index that these machines cannot reach). The CPU is all
# the tests and the demo use.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${OPTSTEP_VENV:-.venv}
source bazel/venv_lib.sh

# The native data path of the client (optstep.native, client/python/native): built by Bazel
# where Bazel is installed and copied into the package; without it the client keeps its
# pure-Python data path.
if command -v bazel >/dev/null && bazel build //client/python/native:liboptstep_native.so >&2; then
  install -m 0644 bazel-bin/client/python/native/liboptstep_native.so client/python/optstep/
fi

inputs=(bazel/python_env.sh bazel/venv_lib.sh client/python/pyproject.toml client/python/setup.py
        proto/optstep/v1/*.proto)
want=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
stamp=$VENV/.optstep-env
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] &&
   "$VENV/bin/python" -c 'import optstep.v1.optimizer_service_pb2_grpc' 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi

ensure_venv "$VENV"

pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
start=$SECONDS
"${pip[@]}" "setuptools>=64" wheel "grpcio-tools>=1.62" >&2
# --no-build-isolation: build with the grpcio-tools just installed, so that the generated stubs
# and the protobuf runtime agree.
"${pip[@]}" --no-build-isolation -e "client/python[dev]" >&2
# safetensors: tests/python/test_checkpoint_format.py reads checkpoint shards with it.
"${pip[@]}" "safetensors>=0.4" >&2
# The trainer examples and their tests (client/python/examples: hf_trainer.py, lightning_fit.py).
"${pip[@]}" "transformers>=4.40" "accelerate>=0.26" "lightning>=2.2" >&2
echo "python env ready in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$want" >"$stamp"
echo "$VENV/bin/python"
