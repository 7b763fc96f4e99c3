#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS: runs a fuzz target from tests/fuzz/BUILD on its seed corpus.
# Under --config=asan the target is a libFuzzer binary: it fuzzes for FUZZ_SECONDS (default 20)
# into a writable copy of the seeds. Elsewhere it is linked with fuzz_replay_main.cc and runs each
# seed once (it ignores the libFuzzer flags). Fails on a crash, a sanitizer report or a violated
# property (the targets abort).
set -euo pipefail

fuzzer=$1
seeds=$2
seconds=${FUZZ_SECONDS:-20}
work=${TEST_TMPDIR:-$(mktemp -d)}
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-$work}

# libFuzzer adds what it finds to the first corpus directory, so that one is scratch.
mkdir -p "$work/corpus"
"$fuzzer" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$work/corpus" "$seeds"
