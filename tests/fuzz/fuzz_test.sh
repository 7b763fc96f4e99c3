#!/usr/bin/env bash
# Compiles checkpoint_parsers_fuzzer.cc and the checkpoint parsers with clang++
# -fsanitize=fuzzer,address and runs it for FUZZ_SECONDS (default 20) from the seed corpus.
# Fails on any crash, sanitizer report or property violation (libFuzzer exits nonzero).
# Needs clang and libclang-rt-dev (bazel/install_deps.sh).
set -euo pipefail

seconds=${FUZZ_SECONDS:-20}
work=${TEST_TMPDIR:-$(mktemp -d)}
# Bazel runs sh_test in the runfiles tree of the workspace: sources lie at their paths.
src=.
[[ -n ${TEST_SRCDIR:-} && -d $TEST_SRCDIR/optstep ]] && src=$TEST_SRCDIR/optstep

cxx=${CLANGXX:-clang++}
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz_test: $cxx not found; run bazel/install_deps.sh (clang, libclang-rt-dev)" >&2
  exit 1
fi

absl_libs=(statusor status cord cordz_info cord_internal cordz_functions cordz_handle
  exponential_biased hashtablez_sampler str_format_internal synchronization graphcycles_internal
  stacktrace symbolize debugging_internal demangle_internal malloc_internal time civil_time
  time_zone strings strings_internal int128 base spinlock_wait throw_delegate
  raw_logging_internal log_severity bad_optional_access bad_variant_access strerror
  raw_hash_set hash city low_level_hash)

echo "fuzz_test: compiling with $("$cxx" --version | head -1)"
"$cxx" -std=c++17 -O1 -g -fsanitize=fuzzer,address -fno-omit-frame-pointer -msse4.2 \
  -I"$src" \
  "$src/tests/fuzz/checkpoint_parsers_fuzzer.cc" \
  "$src/checkpoint/manifest.cc" \
  "$src/checkpoint/safetensors.cc" \
  "$src/kernels/tensor.cc" \
  "${absl_libs[@]/#/-labsl_}" -lcrypto -lpthread \
  -o "$work/checkpoint_parsers_fuzzer"

# libFuzzer adds what it finds to the first corpus directory: a writable copy of the seeds.
mkdir -p "$work/corpus"
cp "$src"/tests/fuzz/corpus/* "$work/corpus/"
echo "fuzz_test: fuzzing for ${seconds}s"
"$work/checkpoint_parsers_fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus"
echo "fuzz_test: no crash"
