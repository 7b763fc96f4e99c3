#!/usr/bin/env bash
# The per-variant builds of the CPU element-wise loops (//kernels/cpu:cpu_elementwise_<variant>)
# are safe to link into one portable binary: each archive defines no global or weak function but
# its table accessor (so the linker can never pick a copy built for a wider variant for a caller
# of a narrower one), and its static initializer, which runs on every CPU before any dispatch,
# uses no VEX / EVEX instruction. (Weak data, such as the typeinfo UBSan emits, holds no code.)
#
# Arguments: the archives of the three variant libraries (tests/kernels/cpu:isa_archives).
set -euo pipefail
failed=0
checked=0
for lib in "$@"; do
  checked=$((checked + 1))
  # Global and weak functions (T, W; i: indirect), demangled.
  globals=$(nm --defined-only -C "$lib" | awk 'NF >= 3 && $2 ~ /^[TWi]$/ { $1 = ""; $2 = ""; print substr($0, 3) }')
  unexpected=$(grep -Ev '^optstep::internal::(Baseline|Avx2|Avx512)ElementwiseKernels\(\)$' <<< "$globals" || true)
  if [[ -n "$unexpected" ]]; then
    echo "FAIL: $lib defines global or weak functions besides its accessor:" >&2
    echo "$unexpected" >&2
    failed=1
  fi
  init=$(objdump -d --no-show-raw-insn "$lib" | awk '/<_GLOBAL__sub_I/ { on = 1; next } /^$/ { on = 0 } on')
  vector=$(grep -E '%[xyz]mm(1[6-9]|2[0-9]|3[01])|%[yz]mm|%k[0-7]|\s(v[a-z0-9]+|kmov[a-z]*)\s' <<< "$init" || true)
  if [[ -n "$vector" ]]; then
    echo "FAIL: the static initializer of $lib uses vector instructions of its variant:" >&2
    echo "$vector" >&2
    failed=1
  fi
done
if [[ "$checked" -lt 3 ]]; then
  echo "FAIL: expected the libraries of three variants, found $checked of: $*" >&2
  exit 1
fi
[[ "$failed" -eq 0 ]] && echo "$checked variant libraries: only their accessors exported, plain static initializers"
exit "$failed"
