#!/usr/bin/env bash
# Usage: layering_test.sh DEPS FORBIDDEN [GRANTEE BUILD_FILE...]
#   DEPS       the labels a layer depends on, one a line (a genquery's output)
#   FORBIDDEN  package prefixes the layer must not depend on, separated by '|' ("//server|//client")
#   GRANTEE    a package prefix ("//client") that none of the BUILD_FILEs may grant visibility to
#              (nor to //visibility:public)
# Fails, listing the offending lines, when a dependency lies under FORBIDDEN or a BUILD_FILE names
# GRANTEE or //visibility:public.
set -euo pipefail

deps=$1
forbidden=$2
shift 2
status=0

if [[ ! -s $deps ]]; then
  echo "layering_test: $deps is empty" >&2
  exit 1
fi
pattern="^(${forbidden})[/:]"
if grep -En "$pattern" "$deps"; then
  echo "layering_test: dependencies under $forbidden (lines above)" >&2
  status=1
fi
echo "layering_test: $(wc -l <"$deps") dependencies checked against $forbidden"

if (($# > 0)); then
  grantee=$1
  shift
  for build in "$@"; do
    # Comments aside: a line that names the grantee or everyone.
    if grep -n -v '^[[:space:]]*#' "$build" | grep -F -e "$grantee" -e "//visibility:public"; then
      echo "layering_test: $build makes a target visible to $grantee (lines above)" >&2
      status=1
    fi
  done
  ((status == 0)) && echo "layering_test: $# BUILD files grant nothing to $grantee"
fi
exit $status
