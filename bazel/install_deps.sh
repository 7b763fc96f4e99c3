#!/usr/bin/env bash
# Installs what the build and the tests need from Debian's packages (and, with --python, the
# Python test dependencies into .venv from PyPI). Idempotent: installs only what is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ make python3 python3-venv
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev liblapacke-dev nlohmann-json3-dev libgloo-dev prometheus-cpp-dev openssl
  clang libclang-rt-dev libssl-dev  # checkpoint parser fuzz test; libcrypto for SHA-256 and CNs
  zlib1g-dev  # CRC-32 of upload streams (wire/stream_end)
  libdnnl-dev  # oneDNN: bf16 GEMMs of matmul precision medium (kernels/cpu/dnnl_gemm)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
