#!/usr/bin/env bash
# Creates .venv-deploy with the validators of deploy/k8s (tests/deploy): pytest, PyYAML,
# kubernetes-validate (schemas of the Kubernetes API) and checkov (security policies), pinned, from
# PyPI. A venv of its own so that checkov's many pinned dependencies never meet .venv's torch stack.
# As root, also installs from Debian what deploy/docker/build_images.sh and the image tests need:
# podman with runc and netavark (bridge networks), mmdebstrap (the base images).
# Idempotent: does nothing when .venv-deploy was built from this same script and the packages are
# installed. Prints the venv's python on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

CONTAINER_PACKAGES=(podman runc netavark aardvark-dns iptables mmdebstrap)
if [[ $(id -u) -eq 0 ]]; then
  missing=()
  for pkg in "${CONTAINER_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}"; } >&2 ||
      echo "could not install ${missing[*]}: tests/deploy skips the image tests" >&2
  fi
fi

VENV=${OPTSTEP_DEPLOY_VENV:-.venv-deploy}
source bazel/venv_lib.sh

REQUIREMENTS=(
  "pytest==8.4.2"
  "PyYAML==6.0.2"
  "kubernetes-validate==1.37.0"
  "checkov==3.3.30"
)

want=$(cat bazel/deploy_env.sh bazel/venv_lib.sh | sha256sum | cut -c1-16)
stamp=$VENV/.optstep-deploy-env
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] &&
   "$VENV/bin/python" -c 'import yaml, kubernetes_validate, checkov, pytest' 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi

rm -f "$stamp"
ensure_venv "$VENV"

start=$SECONDS
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "${REQUIREMENTS[@]}" >&2
echo "deploy env ready in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$want" >"$stamp"
echo "$VENV/bin/python"
