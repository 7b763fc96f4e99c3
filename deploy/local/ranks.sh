#!/usr/bin/env bash
# Runs a group of optstep ranks on this machine, the way the Kubernetes StatefulSet runs them:
# rank 0 serves the rendezvous, ranks 1..N-1 find it through --rendezvous, each rank's ordinal
# comes from a pod-like name (POD_NAME=optstep-R), every rank on a free port.
#
#   deploy/local/ranks.sh start N [DIR] [-- extra server flags]   starts N ranks; prints their addresses
#   deploy/local/ranks.sh stop [DIR]                              stops them
#
# DIR (default for start: a fresh temporary directory; for stop: the one of the last start) holds
# the logs (rank-R.log), the pids and `targets`, one host:port a line in rank order, for clients.
#
# Each rank runs under a supervisor, as a pod under its kubelet: a rank that exits with a non-zero
# status (75: it lost a peer; or killed) is started again on the same port, so the targets and the
# rendezvous stay valid and the group re-forms (docs/deploy.md, "Failure handling"). A rank that
# exits 0 (it was shut down) is not. At most OPTSTEP_MAX_RESTARTS (5) restarts a minute per rank,
# OPTSTEP_RESTART_DELAY (1) seconds apart; past that the supervisor gives up and logs why.
set -euo pipefail
here=$PWD  # a relative DIR is the caller's
cd "$(dirname "$0")/../.."
SERVER=${OPTSTEP_SERVER:-bazel-bin/server/optstep_server}
LAST=${TMPDIR:-/tmp}/optstep-ranks-$(id -u).last  # DIR of the last start, for a plain `stop`
USAGE="usage: ranks.sh start N [DIR] [-- flags] | ranks.sh stop [DIR]"

wait_listening() {  # LOG -> host:port
  for _ in $(seq 300); do
    if grep -q "^listening on" "$1"; then
      sed -n 's/^listening on \([^ ]*\).*/\1/p' "$1" | head -1
      return 0
    fi
    sleep 0.1
  done
  echo "no 'listening on' in $1:" >&2
  cat "$1" >&2
  return 1
}

supervise() {  # R LOG SERVER-ARGS... : runs rank R, restarting it as the header says; its
  # output (and the rank's) goes to LOG
  local r=$1 log=$2 child="" rc stopping="" port
  shift 2
  local -a args=("$@") starts=()
  trap 'stopping=1; [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null' TERM INT
  while true; do
    POD_NAME=optstep-$r "$SERVER" "${args[@]}" &
    child=$!
    rc=0
    wait "$child" || rc=$?
    # A signal to the supervisor ends `wait` early: wait for the rank itself.
    while kill -0 "$child" 2>/dev/null; do
      rc=0
      wait "$child" || rc=$?
    done
    if [[ -n "$stopping" || $rc -eq 0 ]]; then exit 0; fi
    now=$(date +%s)
    starts=("${starts[@]+"${starts[@]}"}" "$now")
    recent=0
    for t in "${starts[@]}"; do
      if ((now - t < 60)); then recent=$((recent + 1)); fi
    done
    if ((recent > ${OPTSTEP_MAX_RESTARTS:-5})); then
      echo "ranks.sh: rank $r exited with status $rc; $recent restarts within a minute: giving up"
      exit 1
    fi
    echo "ranks.sh: rank $r exited with status $rc; restarting it"
    # The same port as before: the targets and the rendezvous stay valid.
    port=$(sed -n 's/^listening on [^ ]*:\([0-9]*\).*/\1/p' "$log" | tail -1)
    if [[ -n "$port" ]]; then args=("${args[@]/#--port=*/--port=$port}"); fi
    sleep "${OPTSTEP_RESTART_DELAY:-1}"
    if [[ -n "$stopping" ]]; then exit 0; fi
  done
}

case "${1:-}" in
  start)
    n=${2:-}
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "$USAGE" >&2; exit 64; }
    shift 2
    dir=""
    if [[ $# -gt 0 && "$1" != "--" ]]; then dir=$1; shift; fi
    if [[ "${1:-}" == "--" ]]; then shift; fi
    dir=${dir:-$(mktemp -d -t optstep-ranks.XXXXXX)}
    [[ "$dir" == /* ]] || dir=$here/$dir
    mkdir -p "$dir"
    echo "$dir" >"$LAST"
    : >"$dir/pids"
    : >"$dir/rank-0.log"
    supervise 0 "$dir/rank-0.log" --host=127.0.0.1 --port=0 --world_size="$n" "$@" \
      >>"$dir/rank-0.log" 2>&1 </dev/null &
    echo $! >>"$dir/pids"
    rendezvous=$(wait_listening "$dir/rank-0.log")
    echo "$rendezvous" >"$dir/targets"
    for ((r = 1; r < n; r++)); do
      : >"$dir/rank-$r.log"
      supervise "$r" "$dir/rank-$r.log" --host=127.0.0.1 --port=0 --world_size="$n" \
        --rendezvous="$rendezvous" "$@" >>"$dir/rank-$r.log" 2>&1 </dev/null &
      echo $! >>"$dir/pids"
    done
    for ((r = 1; r < n; r++)); do wait_listening "$dir/rank-$r.log" >>"$dir/targets"; done
    echo "$dir"
    cat "$dir/targets"
    ;;
  stop)
    dir=${2:-$(cat "$LAST" 2>/dev/null || true)}
    [[ -z "$dir" || "$dir" == /* ]] || dir=$here/$dir
    [[ -n "$dir" ]] || { echo "ranks.sh stop: no DIR and no earlier start" >&2; exit 64; }
    [[ -f "$dir/pids" ]] || exit 0
    while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$dir/pids"
    while read -r pid; do
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done <"$dir/pids"
    rm -f "$dir/pids"
    ;;
  *)
    sed -n '2,10p' "$0"
    exit 64
    ;;
esac
