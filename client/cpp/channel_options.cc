#include "client/cpp/channel_options.h"

#include <grpc/grpc.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "wire/chunk.h"

namespace optstep {
namespace client_internal {
namespace {

constexpr int kMinFrameBytes = 16384;
constexpr int kMaxFrameBytes = (1 << 24) - 1;
// Room for the envelope of a chunk message (ids, offset, dtype, field tags).
constexpr size_t kChunkEnvelopeBytes = 1024;

}  // namespace

namespace {

absl::Status ValidateSecurity(const ClientOptions& options) {
  if (!options.tls) {
    if (!options.token.empty()) {
      return absl::InvalidArgumentError(
          "ClientOptions: a token needs tls (the server checks tokens only on TLS connections, "
          "and a token must not cross the network in clear)");
    }
    if (!options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
        !options.tls_key_file.empty() || !options.tls_server_name.empty()) {
      return absl::InvalidArgumentError("ClientOptions: TLS files or server name set without tls");
    }
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: a client certificate needs both tls_cert_file and tls_key_file; got '",
        options.tls_cert_file, "' and '", options.tls_key_file, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateClientOptions(const ClientOptions& options) {
  if (options.rank_targets.empty() && options.target.empty()) {
    return absl::InvalidArgumentError("ClientOptions: no target (expected \"host:port\")");
  }
  for (size_t r = 0; r < options.rank_targets.size(); ++r) {
    if (options.rank_targets[r].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ClientOptions: rank_targets[", r, "] is empty"));
    }
  }
  if (options.connect_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions: connect_timeout ",
                                                   absl::FormatDuration(options.connect_timeout),
                                                   " is negative"));
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.stream_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: rpc_timeout ", absl::FormatDuration(options.rpc_timeout),
        " and stream_timeout ", absl::FormatDuration(options.stream_timeout), " must be positive"));
  }
  if (options.max_frame_bytes < kMinFrameBytes || options.max_frame_bytes > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions: max_frame_bytes ", options.max_frame_bytes,
                     " is outside the HTTP/2 range [", kMinFrameBytes, ", ", kMaxFrameBytes, "]"));
  }
  if (options.stream_lookahead_bytes < 65535) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions: stream_lookahead_bytes ",
                                                   options.stream_lookahead_bytes,
                                                   " is below the HTTP/2 default window of 65535"));
  }
  if (options.max_chunk_bytes < 4 || options.max_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions: max_chunk_bytes ",
                                                   options.max_chunk_bytes, " is outside [4, ",
                                                   kMaxChunkBytes, "]"));
  }
  if (options.max_message_bytes < 0 || static_cast<size_t>(options.max_message_bytes) <
                                           options.max_chunk_bytes + kChunkEnvelopeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions: max_message_bytes ", options.max_message_bytes,
                     " cannot hold a chunk of max_chunk_bytes ", options.max_chunk_bytes, " plus ",
                     kChunkEnvelopeBytes, " bytes of envelope"));
  }
  return ValidateSecurity(options);
}

grpc::ChannelArguments MakeChannelArguments(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, options.bdp_probe ? 1 : 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_lookahead_bytes);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, options.max_frame_bytes);
  // One TCP connection per Client (and per rank) rather than one shared by every channel to the
  // same address in the process: trainers in one process should not share a pipe.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.recovery_timeout > absl::ZeroDuration()) {
    // A restarted rank is found again within a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  }
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return args;
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("ClientOptions: cannot read ", what, " '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options) {
  if (!options.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  const struct {
    const std::string& path;
    const char* what;
    std::string& pem;
  } files[] = {{options.tls_ca_file, "tls_ca_file", ssl.pem_root_certs},
               {options.tls_cert_file, "tls_cert_file", ssl.pem_cert_chain},
               {options.tls_key_file, "tls_key_file", ssl.pem_private_key}};
  for (const auto& file : files) {
    if (file.path.empty()) continue;
    absl::StatusOr<std::string> text = ReadFile(file.path, file.what);
    if (!text.ok()) return text.status();
    file.pem = *std::move(text);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (options.token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(credentials,
                                           grpc::AccessTokenCredentials(options.token));
}

}  // namespace client_internal
}  // namespace optstep
