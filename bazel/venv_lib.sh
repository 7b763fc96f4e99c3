# Sourced by bazel/python_env.sh and bazel/deploy_env.sh: the system Python and the making of a
# virtual environment from it.

# Debian's Python (never a virtualenv's or a toolchain's found first on PATH).
PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)

# ensure_venv DIR: DIR as a virtual environment of $PYTHON, installing python3-venv from Debian
# first where the interpreter lacks venv/ensurepip (as root, or through sudo).
ensure_venv() {
  local venv=$1
  if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "installing python3-venv" >&2
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
      python3-venv >&2
  fi
  [[ -x $venv/bin/python ]] || "$PYTHON" -m venv "$venv"
}
