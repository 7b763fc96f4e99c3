#!/usr/bin/env bash
# The demo of `make demo`: starts one optimizer-server rank on the CPU (a free port), trains a
# small MLP through it with AdamW and then with SGD, and stops the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=bazel-bin
log=$(mktemp -t optstep-server.XXXXXX.log)
"$BIN/server/optstep_server" --port=0 --host=127.0.0.1 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  grep -q "listening on" "$log" && break
  kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
address=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$log")
echo "== optstep server at $address"
for optimizer in adam sgd; do
  echo "== training an MLP with $optimizer through the server"
  "$BIN/client/cpp/examples/train_mlp" --server="$address" --optimizer="$optimizer" --steps=200
done
