#!/usr/bin/env bash
# Runs every test of the project and prints one closing line `N passed, N failed[, N skipped]`
# (also written to .test-summary). Used by `make test` and by CI.
#   1. bazel test //...            (C++ unit, service and integration tests; `gpu` tests filtered)
#   2. bazel test --config=asan    the same tests built by clang with the thread-safety checks,
#                                  under ASan + UBSan; the fuzz targets fuzz for FUZZ_SECONDS each
#   3. bazel test --config=tsan    the engine, rpc and comm tests under TSan (`notsan` filtered)
#   4. bazel build --config=cuda //...   where nvcc exists, so CUDA code keeps compiling; then
#                                  the GPU bundle (tests/gpu/make_bundle.sh, own output base) and
#                                  its completeness check (tests/gpu/check_bundle.sh, docs/gpu.md)
#   5. pytest tests/python tests/chaos   (the Python client; ranks killed under their supervisor
#                                  while a trainer runs; bazel/python_env.sh makes .venv first),
#                                  mypy --strict over client/python/optstep, and ruff over the
#                                  repository's Python (ruff.toml)
#   6. pytest tests/deploy         (deploy/k8s and deploy/docker: kubernetes-validate, checkov,
#                                   the rank contract; the CPU image around the binaries built
#                                   here, run by podman as a rank and a 2-rank group;
#                                   bazel/deploy_env.sh makes .venv-deploy and installs podman first)
# Stages 2 and 3 build in their own output bases, bazel-optstep-<config> under
# $OPTSTEP_SANITIZER_CACHE (default ~/.cache), so the default build's cache stays as it is.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
skipped=0
add() {  # add "N passed, N failed[, N skipped]"
  local line="$1"
  passed=$((passed + $(sed -n 's/^\([0-9]*\) passed.*/\1/p' <<<"$line")))
  failed=$((failed + $(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$line")))
  local s
  s=$(sed -n 's/.* \([0-9]*\) skipped.*/\1/p' <<<"$line")
  skipped=$((skipped + ${s:-0}))
}

bazel test --keep_going //... 2>&1 | tee /tmp/optstep-bazel-test.log | grep -vE '^\(|^Loading|^Analyzing|^INFO: From|^\[' || true
labels=$(bazel query 'tests(//...) except attr(tags, "gpu", tests(//...))' 2>/dev/null)
add "$(python3 bazel/test_summary.py "$(bazel info bazel-testlogs 2>/dev/null)" $labels)"

# sanitizer_stage CONFIG LABEL...: `bazel test --config=CONFIG` of the test targets LABEL in the
# config's own output base; prints and counts `CONFIG: N passed, N failed`.
sanitizer_stage() {
  local config=$1
  shift
  local base=${OPTSTEP_SANITIZER_CACHE:-$HOME/.cache}/bazel-optstep-$config
  echo "== bazel test --config=$config ($# test targets)"
  bazel --output_base="$base" test --config="$config" --keep_going "$@" 2>&1 |
    tee "/tmp/optstep-bazel-test-$config.log" | grep -vE '^\(|^Loading|^Analyzing|^INFO: From|^\[' |
    grep -vE 'ld.gold: warning: Cannot export local symbol' || true
  local testlogs line
  testlogs=$(bazel --output_base="$base" info --config="$config" bazel-testlogs 2>/dev/null)
  line=$(python3 bazel/test_summary.py "$testlogs" "$@")
  echo "$config: $line"
  add "$line"
}

# The labels come from the default server's query: the sanitizer servers then load only the
# packages named, never the bazel-* links of the default build.
sanitizer_stage asan $labels
sanitizer_stage tsan $(bazel query 'tests(//tests/server/engine/... + //tests/server/rpc/...
  + //tests/kernels/comm/...) except attr(tags, "gpu|notsan", tests(//...))' 2>/dev/null)

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "== bazel build --config=cuda //..."
  if bazel build --config=cuda //... 2>&1 | tail -3; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
    add "1 passed, 0 failed"
  else
    echo "CUDA build FAILED"
    add "0 passed, 1 failed"
  fi
  # The GPU bundle (docs/gpu.md), built in its own output base, and its completeness check.
  echo "== tests/gpu/make_bundle.sh, tests/gpu/check_bundle.sh"
  if tests/gpu/make_bundle.sh >/tmp/optstep-gpu-bundle.log 2>&1 && tests/gpu/check_bundle.sh; then
    add "1 passed, 0 failed"
  else
    tail -20 /tmp/optstep-gpu-bundle.log
    echo "GPU bundle FAILED"
    add "0 passed, 1 failed"
  fi
fi

# add_pytest LOG: counts the closing line of the pytest run logged in LOG (none: 1 failed).
add_pytest() {
  local line p f s
  line=$(grep -E '[0-9]+ (passed|failed)' "$1" | tail -1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  f=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | awk '{n += $1} END {print n + 0}')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  [[ -z "$line" ]] && f=1
  add "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
}

if [[ -d tests/python ]]; then
  echo "== pytest tests/python tests/chaos"
  bazel/python_env.sh >/dev/null || add "0 passed, 1 failed"
  # The tests start the server binary (bazel test builds only what tests depend on).
  bazel build //server:optstep_server 2>&1 | tail -1
  if [[ -x .venv/bin/python ]]; then
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/python tests/chaos 2>&1 |
      tee /tmp/optstep-pytest.log | tail -30
    add_pytest /tmp/optstep-pytest.log
    # The package's annotations, checked (configuration: client/python/pyproject.toml).
    echo "== mypy --strict client/python/optstep"
    if (cd client/python && ../../.venv/bin/python -m mypy --strict) 2>&1 | tail -5;
       [[ ${PIPESTATUS[0]} -eq 0 ]]; then
      add "1 passed, 0 failed"
    else
      echo "mypy FAILED"
      add "0 passed, 1 failed"
    fi
    # Pyflakes' findings over every Python file (configuration: ruff.toml).
    echo "== ruff check"
    if .venv/bin/python -m ruff check . 2>&1 | tail -20; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
      add "1 passed, 0 failed"
    else
      echo "ruff FAILED"
      add "0 passed, 1 failed"
    fi
  fi
fi

if [[ -d tests/deploy ]]; then
  echo "== pytest tests/deploy"
  # The image tests put these two binaries into the CPU image's runtime stage.
  bazel build //server:optstep_server //client/cli:optstep 2>&1 | tail -1
  if bazel/deploy_env.sh >/dev/null && [[ -x .venv-deploy/bin/python ]]; then
    .venv-deploy/bin/python -m pytest -q -p no:cacheprovider tests/deploy 2>&1 |
      tee /tmp/optstep-pytest-deploy.log | tail -30
    add_pytest /tmp/optstep-pytest-deploy.log
  else
    echo "bazel/deploy_env.sh FAILED"
    add "0 passed, 1 failed"
  fi
fi

summary="$passed passed, $failed failed"
((skipped)) && summary="$summary, $skipped skipped"
echo "$summary" > .test-summary
echo "$summary"
[[ $failed -eq 0 ]]
