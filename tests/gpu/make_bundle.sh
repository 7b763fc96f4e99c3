#!/usr/bin/env bash
# Builds the GPU bundle: every gpu-tagged test, optim_bench, kernels_bench, the server and the
# train_mlp trainer, built with --config=cuda -c opt for sm_90 (+ compute_90 PTX), with every
# shared library they need that a bare GPU machine lacks, in one folder that
# tests/gpu/run_bundle.sh runs on the GPU machine (docs/gpu.md).
#
#   tests/gpu/make_bundle.sh                 # -> build/gpu-bundle/
#   tests/gpu/make_bundle.sh OUT_DIR
#
# The build has its own output base (bazel-optstep-cuda-opt under $OPTSTEP_SANITIZER_CACHE,
# default ~/.cache) so the default build's cache stays as it is. Linking is static for the
# project's code (--dynamic_mode=off) and the binaries carry an rpath (DT_RPATH, so it also
# serves the bundled libraries' own dependencies) of $ORIGIN/lib. lib/ holds every library `ldd`
# resolves except glibc's and CUDA's: cuBLAS, cuSOLVER, NCCL (and what they load) come from the
# GPU machine's toolkit or NVIDIA wheels, the driver from the machine itself.
#
# Layout of OUT_DIR: the binaries, lib/, tests.txt (one gpu test a line: NAME [VAR=VALUE...],
# the test's environment from its BUILD rule), MANIFEST (sizes and where each library came
# from). When the folder would exceed the limit (BUNDLE_LIMIT_MIB, default 60) the binaries and
# libraries are packed into bundle.tar.xz instead (xz -1: about a quarter of the size in about a
# minute; -9 only if that is still over the limit), which run_bundle.sh unpacks.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-build/gpu-bundle}
limit_mib=${BUNDLE_LIMIT_MIB:-60}
base=${OPTSTEP_SANITIZER_CACHE:-$HOME/.cache}/bazel-optstep-cuda-opt
flags=(--config=cuda -c opt --dynamic_mode=off --symlink_prefix=/
  "--linkopt=-Wl,--disable-new-dtags" "--linkopt=-Wl,-rpath,\$ORIGIN/lib")
binaries=(//bench:optim_bench //bench:kernels_bench //server:optstep_server
  //client/cpp/examples:train_mlp)

[[ -x /usr/local/cuda/bin/nvcc ]] || { echo "make_bundle: no /usr/local/cuda/bin/nvcc" >&2; exit 1; }
gpu_tests='attr(tags, "\bgpu\b", tests(//...))'
tests=$(bazel --output_base="$base" query "$gpu_tests" 2>/dev/null)
[[ -n "$tests" ]] || { echo "make_bundle: no gpu-tagged tests found" >&2; exit 1; }

start=$(date +%s)
# shellcheck disable=SC2086
bazel --output_base="$base" build "${flags[@]}" $tests "${binaries[@]}"
bin=$(bazel --output_base="$base" info "${flags[@]}" bazel-bin 2>/dev/null)
echo "make_bundle: built in $(($(date +%s) - start)) s"

rm -rf "$out"
mkdir -p "$out/lib"
names=()
for label in $tests "${binaries[@]}"; do
  path="$bin/$(sed -e 's|^//||' -e 's|:|/|' <<<"$label")"
  name=$(basename "$path")
  [[ -e "$out/$name" ]] && { echo "make_bundle: two binaries named $name" >&2; exit 1; }
  install -m 755 "$path" "$out/$name"
  names+=("$name")
done

# The gpu tests: NAME TIMEOUT_S [VAR=VALUE...], the timeout from the test's size (small 60 s,
# medium 120 s: the runner's whole budget is 7 minutes) and the environment its BUILD rule gives it
# (optim_test's *_gpu variants: OPTSTEP_TEST_DEVICE=cuda).
bazel --output_base="$base" query --output=xml "$gpu_tests" 2>/dev/null | python3 -c '
import sys, xml.etree.ElementTree as ET
for rule in ET.parse(sys.stdin).getroot().iter("rule"):
    name = rule.get("name").split(":")[-1]
    size = next((s.get("value") for s in rule.iter("string") if s.get("name") == "size"), "medium")
    env = [
        "=".join(v.get("value") for v in pair.iter("string"))
        for d in rule.iter("dict") if d.get("name") == "env" for pair in d.iter("pair")
    ]
    print(" ".join([name, {"small": "60"}.get(size, "120")] + env))
' >"$out/tests.txt"

# Libraries: every one ldd resolves, except glibc's (every Linux has them, and they must match the
# machine's loader) and CUDA's (the machine's toolkit or NVIDIA wheels; libcudart is static).
keep_library() {
  case "$1" in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnss_*) return 1 ;;
    libcuda.so.* | libcudart.so.* | libcublas*.so.* | libcusolver*.so.* | libcusparse.so.* | \
      libnccl.so.* | libnvJitLink.so.* | libnvrtc*.so.* | libnvidia-*) return 1 ;;
  esac
  return 0
}
{
  echo "# optstep GPU bundle: built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "# bazel $(bazel --version | cut -d' ' -f2), nvcc $(/usr/local/cuda/bin/nvcc --version |
    sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_90 + compute_90 PTX"
} >"$out/MANIFEST"
for name in "${names[@]}"; do
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    keep_library "$soname" || continue
    [[ "$path" == "not" ]] && { echo "make_bundle: $name needs $soname, not found here" >&2; exit 1; }
    if [[ ! -e "$out/lib/$soname" ]]; then
      install -m 644 "$(readlink -f "$path")" "$out/lib/$soname"
      echo "lib/$soname <- $path" >>"$out/MANIFEST"
    fi
  done < <(ldd "$out/$name")
done
for name in "${names[@]}"; do echo "$name" >>"$out/MANIFEST"; done
# The newest glibc symbol version the bundled C++ runtime needs (run_bundle.sh uses the machine's
# own libstdc++ where its glibc is older).
echo "# C++ runtime needs $(objdump -T "$out"/lib/libstdc++.so.* "$out"/lib/libgcc_s.so.* |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)" >>"$out/MANIFEST"

size_kib=$(du -sk "$out" | cut -f1)
if ((size_kib > limit_mib * 1024)); then
  echo "make_bundle: $((size_kib / 1024)) MiB unpacked; packing into bundle.tar.xz"
  # xz -1 first (fast); -9 only when that is still over the limit.
  for level in -1 -9; do
    (cd "$out" && tar -cf - "${names[@]}" lib | xz -T0 "$level" >bundle.tar.xz) || exit 1
    size_kib=$(du -sk "$out/bundle.tar.xz" | cut -f1)
    ((size_kib <= limit_mib * 1024)) && break
  done
  (cd "$out" && rm -rf "${names[@]}" lib)
  size_kib=$(du -sk "$out" | cut -f1)
fi
echo "make_bundle: $out holds ${#names[@]} binaries and $(grep -c '^lib/' "$out/MANIFEST") libraries," \
  "$((size_kib / 1024)) MiB (limit $limit_mib MiB), in $(($(date +%s) - start)) s"
((size_kib <= limit_mib * 1024)) || { echo "make_bundle: over the limit" >&2; exit 1; }
