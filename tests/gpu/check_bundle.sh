#!/usr/bin/env bash
# Checks, on a machine without a GPU, that the bundle of tests/gpu/make_bundle.sh is complete:
# that a bare GPU machine (glibc, the NVIDIA driver, CUDA libraries from a toolkit or NVIDIA
# wheels, nothing else) can load every binary in it, and that it is under the size limit.
#
#   tests/gpu/check_bundle.sh [BUNDLE_DIR]        # default build/gpu-bundle
#
# 1. The bundle as shipped is at most BUNDLE_LIMIT_MIB (60) MiB, and tests.txt names binaries it
#    holds.
# 2. ldd of every binary, with LD_LIBRARY_PATH emptied except for the CUDA toolkit's stubs (so
#    the binaries' rpath $ORIGIN/lib must find the bundle): every library resolves from the
#    bundle, is glibc's, or is a CUDA library (cuBLAS, cuSOLVER, cuSPARSE, nvJitLink, NCCL, the
#    driver), which may be missing here.
# 3. Every binary runs a dry run (--gtest_list_tests, --benchmark_list_tests, --version) with
#    LD_LIBRARY_PATH emptied except for the bundle's lib/ and the stubs, and LD_BIND_NOW=1, so
#    that every symbol binds to a library that has it.
# Prints what it checked and one line `bundle check: passed|FAILED (...)`; exits non-zero on
# failure.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
bundle=$(realpath "${1:-build/gpu-bundle}")
limit_mib=${BUNDLE_LIMIT_MIB:-60}
cuda=${CUDA_HOME:-/usr/local/cuda}
problems=()

[[ -f "$bundle/tests.txt" ]] || { echo "no bundle at $bundle (tests/gpu/make_bundle.sh)" >&2; exit 1; }
size_kib=$(du -sk "$bundle" | cut -f1)
echo "size: $((size_kib / 1024)) MiB of $limit_mib MiB"
((size_kib <= limit_mib * 1024)) || problems+=("$((size_kib / 1024)) MiB over the limit")

work=$(mktemp -d -t optstep-bundle-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
dir=$bundle
if [[ -f "$bundle/bundle.tar.xz" ]]; then
  xz -dc "$bundle/bundle.tar.xz" | tar -xf - -C "$work" || problems+=("bundle.tar.xz does not unpack")
  dir=$work
fi

while read -r name _; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ -x "$dir/$name" ]] || problems+=("tests.txt names $name, not in the bundle")
done <"$bundle/tests.txt"

# The environment of the GPU machine, as far as this one can stand for it: nothing but the
# bundle and the stub of the driver library on the library path (run_bundle.sh puts the bundle's
# lib/ there too). ldd runs without the bundle on the path: the binaries' rpath must find it.
bare=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$dir/lib:$cuda/lib64/stubs")
rpath_only=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$cuda/lib64/stubs")

# glibc's libraries (every machine has them) and CUDA's (the GPU machine's toolkit or wheels).
glibc='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl)\.so'
cuda_libs='^(libcuda|libcudart|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libnccl)\.so'

binaries=0
for path in "$dir"/*; do
  [[ -f "$path" && -x "$path" ]] || continue
  name=$(basename "$path")
  binaries=$((binaries + 1))
  # 2. Where each library comes from.
  while read -r soname arrow resolved _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$soname" =~ $glibc || "$soname" =~ $cuda_libs ]] && continue
    if [[ "$resolved" == "not" ]]; then
      problems+=("$name: $soname missing")
    elif [[ "$(realpath "$resolved")" != "$dir/lib/"* ]]; then
      problems+=("$name: $soname comes from $resolved, not from the bundle")
    fi
  done < <("${rpath_only[@]}" ldd "$path")
  # 3. A dry run, every symbol bound at load time.
  case "$name" in
    *_bench) dry=(--benchmark_list_tests=true) ;;
    *_test*) dry=(--gtest_list_tests) ;;
    *) dry=(--version) ;;
  esac
  if ! "${bare[@]}" LD_BIND_NOW=1 "$path" "${dry[@]}" >"$work/$name.out" 2>&1; then
    problems+=("$name ${dry[*]} failed: $(head -c 300 "$work/$name.out" | tr '\n' ' ')")
  fi
done
((binaries > 0)) || problems+=("no binaries")

glibc_needed=$(objdump -T "$dir"/* "$dir"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV |
  tail -1)
echo "binaries: $binaries, libraries: $(find "$dir/lib" -type f | wc -l), needs $glibc_needed"
if ((${#problems[@]} == 0)); then
  echo "bundle check: passed"
else
  printf '  %s\n' "${problems[@]}"
  echo "bundle check: FAILED (${#problems[@]} problems)"
  exit 1
fi
