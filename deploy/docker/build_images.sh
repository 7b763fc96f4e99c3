#!/usr/bin/env bash
# Builds the optstep images offline from Debian's mirror and PyPI only (no Docker Hub, no NVIDIA
# apt repository), with podman (docker where podman is absent), from the repository root:
#   deploy/docker/build_images.sh [base|base-slim|cpu|cuda|all]...   (default: all = cpu cuda)
#   deploy/docker/build_images.sh prebuilt-cpu TAG [SERVER CLI]   (only the CPU image's runtime
#     stage, around binaries built here; default: bazel-bin/server/optstep_server and
#     bazel-bin/client/cli/optstep)
#   deploy/docker/build_images.sh check TAG   (ldd inside the image: nothing missing but the driver)
# base: debian:bookworm (minbase) and debian:bookworm-slim (minbase without documentation, manual
#   pages and locales, like Docker Hub's -slim), made by mmdebstrap and imported under the names
#   the Dockerfiles use; kept when present (OPTSTEP_REBUILD_BASE=1 makes them again).
# cpu, cuda: Dockerfile.cpu / Dockerfile.cuda, tagged $OPTSTEP_IMAGE:$VERSION-cpu and :cpu (-cuda).
# Environment: OPTSTEP_ENGINE (podman|docker), OPTSTEP_IMAGE (default localhost/optstep),
#   OPTSTEP_VERSION (default: the Python package's), DEBIAN_MIRROR (default deb.debian.org),
#   CUDA_SOURCE (wheels: CUDA from NVIDIA's wheels on PyPI, the default; apt: NVIDIA's repository),
#   PIP_CERT (a CA bundle for pip where TLS is intercepted; a build secret, not kept in the image).
# Prints each step's time; the images' sizes at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."

RELEASE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org}
IMAGE=${OPTSTEP_IMAGE:-localhost/optstep}
VERSION=${OPTSTEP_VERSION:-$(sed -n 's/^__version__ = "\(.*\)"/\1/p' \
  client/python/optstep/_version.py)}
CUDA_SOURCE=${CUDA_SOURCE:-wheels}
PIP_CERT=${PIP_CERT:-}
# Builds need more than the default 1024 processes of some hosts' containers and a fixed
# descriptor limit: runc (unlike crun) then starts also where the limits cannot be raised.
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

engine() {  # the container engine's command line
  local name=${OPTSTEP_ENGINE:-}
  if [[ -z $name ]]; then
    if command -v podman >/dev/null; then name=podman; else name=docker; fi
  fi
  if [[ $name == podman ]]; then
    # runc and cgroupfs: crun fails on hybrid cgroup hierarchies, and containers and build hosts
    # often run no systemd.
    local runtime=()
    command -v runc >/dev/null && runtime=(--runtime "$(command -v runc)")
    echo podman "${runtime[@]}" --cgroup-manager=cgroupfs
  else
    echo "$name"
  fi
}
ENGINE=($(engine))

has_image() { "${ENGINE[@]}" image inspect "$1" >/dev/null 2>&1; }

# base_image slim|full: debian:bookworm[-slim] from $MIRROR.
base_image() {
  local kind=$1 tag=docker.io/library/debian:$RELEASE
  [[ $kind == slim ]] && tag=$tag-slim
  if has_image "$tag" && [[ -z ${OPTSTEP_REBUILD_BASE:-} ]]; then
    echo "$tag: present"
    return
  fi
  local excludes=()
  if [[ $kind == slim ]]; then  # the path filters of Docker Hub's -slim images
    local p
    for p in /usr/share/doc/\* /usr/share/man/\* /usr/share/groff/\* /usr/share/info/\* \
             /usr/share/lintian/\* /usr/share/linda/\* /usr/share/locale/\*; do
      excludes+=("--dpkgopt=path-exclude=$p")
    done
    excludes+=("--dpkgopt=path-include=/usr/share/doc/*/copyright"
               "--dpkgopt=path-include=/usr/share/locale/locale.alias")
  fi
  # The apt settings of Docker Hub's images: no package caches or translations kept in layers.
  local clean='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb'
  clean="$clean /var/cache/apt/*.bin || true"
  local aptopts=("--aptopt=Acquire::Languages \"none\"" "--aptopt=Acquire::GzipIndexes \"true\""
                 "--aptopt=Dir::Cache::pkgcache \"\"" "--aptopt=Dir::Cache::srcpkgcache \"\""
                 "--aptopt=DPkg::Post-Invoke { \"$clean\"; }"
                 "--aptopt=APT::Update::Post-Invoke { \"$clean\"; }"
                 "--aptopt=APT::AutoRemove::SuggestsImportant \"false\"")
  local tar
  tar=$(mktemp --suffix=.tar)
  # shellcheck disable=SC2064
  trap "rm -f '$tar'" RETURN
  local start=$SECONDS
  # merged-usr hook: /usr merged by symlinks, without the usrmerge package (and its perl).
  mmdebstrap --quiet --variant=minbase --format=tar \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${excludes[@]}" "${aptopts[@]}" \
    "$RELEASE" "$tar" \
    "deb $MIRROR/debian $RELEASE main" "deb $MIRROR/debian $RELEASE-updates main" \
    "deb $MIRROR/debian-security $RELEASE-security main" >/dev/null
  "${ENGINE[@]}" import --change 'CMD ["bash"]' "$tar" "$tag" >/dev/null
  echo "$tag: made in $((SECONDS - start)) s"
}

# build DOCKERFILE TAG CONTEXT [ARGS...]
build() {
  local dockerfile=$1 tag=$2 context=$3
  shift 3
  local start=$SECONDS
  local opts=()
  if [[ ${ENGINE[0]} == podman ]]; then
    opts=(--format=docker)  # OCI images drop HEALTHCHECK
    # BuildKit finds <Dockerfile>.dockerignore by itself; podman is told.
    [[ -f $dockerfile.dockerignore ]] && opts+=(--ignorefile "$dockerfile.dockerignore")
  fi
  "${ENGINE[@]}" build "${opts[@]}" "${ULIMITS[@]}" --network=host -f "$dockerfile" -t "$tag" \
    "$@" "$context"
  echo "$tag: built in $((SECONDS - start)) s"
}

image() {  # image cpu|cuda
  local kind=$1 tag=$IMAGE:$VERSION-$1 args=()
  if [[ $kind == cuda ]]; then
    [[ $CUDA_SOURCE == apt ]] && args+=(--target=runtime-apt)
    [[ -s $PIP_CERT ]] && args+=(--secret "id=pip_cert,src=$PIP_CERT")
  fi
  base_image full
  base_image slim
  build "deploy/docker/Dockerfile.$kind" "$tag" . "${args[@]}"
  "${ENGINE[@]}" tag "$tag" "$IMAGE:$kind"
}

# prebuilt_cpu TAG SERVER CLI: the runtime stage of Dockerfile.cpu around the given binaries; the
# build context is a copy of just the two.
prebuilt_cpu() {
  local tag=$1 context
  base_image slim
  context=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$context'" RETURN
  install -m 0755 "$2" "$context/optstep_server"
  install -m 0755 "$3" "$context/optstep"
  build deploy/docker/Dockerfile.cpu "$tag" "$context" --target=prebuilt
}

# check TAG: every library the image's binaries link is in it (ldd inside it); only the driver's
# (libcuda, libnvidia-ml: mounted from the node at run time) may be missing.
check() {
  local out
  out=$("${ENGINE[@]}" run --rm "${ULIMITS[@]}" --network=none --entrypoint ldd "$1" \
        /usr/local/bin/optstep_server /usr/local/bin/optstep)
  echo "$out"
  if grep 'not found' <<<"$out" | grep -vE '^\s*(libcuda|libnvidia-ml)\.so'; then
    echo "$1: libraries missing (above)" >&2
    return 1
  fi
  echo "$1: every library present$(grep -q 'not found' <<<"$out" && echo ' but the driver')"
}

size() {
  "${ENGINE[@]}" image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'
}

(($#)) || set -- all
built=()
while (($#)); do
  case $1 in
    base) base_image full; base_image slim ;;
    base-slim) base_image slim ;;
    cpu | cuda) image "$1"; built+=("$IMAGE:$VERSION-$1") ;;
    all) image cpu; image cuda; built+=("$IMAGE:$VERSION-cpu" "$IMAGE:$VERSION-cuda") ;;
    check)
      (($# >= 2)) || { echo "usage: $0 check TAG" >&2; exit 64; }
      check "$2"; shift ;;
    prebuilt-cpu)
      (($# == 2 || $# == 4)) || { echo "usage: $0 prebuilt-cpu TAG [SERVER CLI]" >&2; exit 64; }
      prebuilt_cpu "$2" "${3:-bazel-bin/server/optstep_server}" "${4:-bazel-bin/client/cli/optstep}"
      built+=("$2"); shift $(($# - 1)) ;;
    *) sed -n '2,8s/^# \{0,1\}//p' "$0" >&2; exit 64 ;;
  esac
  shift
done
for tag in "${built[@]}"; do
  echo "$tag: $(size "$tag")"
done
