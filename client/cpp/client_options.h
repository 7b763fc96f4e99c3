#ifndef OPTSTEP_CLIENT_CPP_CLIENT_OPTIONS_H_
#define OPTSTEP_CLIENT_CPP_CLIENT_OPTIONS_H_

// Options of optstep::Client: where the ranks are, deadlines and transport tuning. Plain data;
// filled from flags by a main.cc (or by hand) and passed to Client::Connect.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace optstep {

struct ClientOptions {
  // gRPC target of rank 0, e.g. "localhost:50051" (any gRPC target string is accepted, such as
  // "dns:///optstep-0.optstep:50051" or "unix:/tmp/optstep.sock").
  std::string target;
  // Target of every rank, indexed by rank, for sessions laid out over several ranks. Empty means
  // one rank at `target`. When set, `target` is ignored.
  std::vector<std::string> rank_targets;

  // Connect() waits this long for every channel to become ready; UNAVAILABLE otherwise. The
  // first rank to answer says where a rank stood in for is served (its stand-in), which is
  // waited for instead of the rank's own address. Zero: connect lazily on the first call.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Deadline of unary calls (sessions, health).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of streaming calls (Step, InitParameters, PullParameters). A Step waits for every
  // trainer's contribution, so this bounds the slowest trainer too.
  absl::Duration stream_timeout = absl::Minutes(10);
  // true: calls wait (until their deadline) for a channel that is not ready instead of failing
  // at once with UNAVAILABLE.
  bool wait_for_ready = false;
  // A Step that meets a recovering group (a rank lost; the group restarting and restoring its
  // sessions from their automatic checkpoints) waits this long for it with backoff, then redoes
  // itself with the same gradients, or answers ABORTED carrying the restored step (RewindStep,
  // step_recovery.h) when the session came back older. Zero: a Step fails at once, as any call.
  absl::Duration recovery_timeout = absl::Minutes(5);

  // Security (docs/security.md). With `tls`, the channels use TLS and verify the server's
  // certificate against `tls_ca_file` (PEM; empty: the system's roots); with `tls_cert_file` and
  // `tls_key_file` they also present a client certificate (mutual TLS). Files are read by
  // Connect().
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Name checked against the server's certificate instead of the target's host; empty: the host.
  std::string tls_server_name;
  // Sent with every call as "authorization: Bearer <token>"; needs `tls`.
  std::string token;

  // Transport tuning (docs/design.md §4). Defaults are the measured throughput settings.
  // Largest message sent or received: a 4 MiB chunk plus its envelope fits easily.
  int max_message_bytes = 8 << 20;
  // HTTP/2 per-stream flow-control window of what this client receives: the most a rank sends
  // on a stream (parameters returned or pulled) ahead of what the client has read. What a
  // rank receives (the gradients) follows the server's own window.
  int stream_lookahead_bytes = 16 << 20;
  // HTTP/2 SETTINGS_MAX_FRAME_SIZE; 16 MiB - 1 is the protocol's largest value (gRPC ignores
  // anything above it with an error log).
  int max_frame_bytes = (16 << 20) - 1;
  // Bandwidth-delay-product probing; off, since the window above is already large.
  bool bdp_probe = false;
  // Largest raw tensor payload of one chunk (gradients, initial values). Between 4 bytes and
  // 4 MiB (the server's limit); smaller values exist for tests: a rank takes a step's gradients
  // in one piece a parameter, one per 16 KiB and 1024 more (docs/security.md).
  size_t max_chunk_bytes = 4 << 20;
};

}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CLIENT_OPTIONS_H_
