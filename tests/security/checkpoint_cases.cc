// Save, Load, ExportStateDict and ImportStateDict with bad input, and the rank-to-rank and
// admin services with requests no peer sends.

#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "optstep/v1/admin_service.pb.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "optstep/v1/internal.pb.h"
#include "tests/security/bad_input_calls.h"
#include "tests/security/bad_input_cases.h"

namespace optstep {
namespace testutil {
namespace {

using Code = grpc::StatusCode;

BadInput Save(std::string name, std::string checkpoint, Code code, std::string message) {
  return {std::move(name),
          [checkpoint](const Target& t) {
            v1::SaveRequest request;
            request.set_session_id(t.stepped);
            request.set_name(checkpoint);
            return CallSave(t.channel, request);
          },
          code, std::move(message)};
}

BadInput Load(std::string name, std::string checkpoint, Code code, std::string message) {
  return {std::move(name),
          [checkpoint](const Target& t) {
            v1::LoadRequest request;
            request.set_session_id(t.stepped);
            request.set_name(checkpoint);
            return CallLoad(t.channel, request);
          },
          code, std::move(message)};
}

BadInput Export(std::string name, std::function<void(v1::ExportStateDictRequest&)> edit, Code code,
                std::string message) {
  return {std::move(name),
          [edit](const Target& t) {
            v1::ExportStateDictRequest request;
            request.set_session_id(t.stepped);
            edit(request);
            return CallExport(t.channel, request);
          },
          code, std::move(message)};
}

v1::StateDictChunk Tensor(std::string key, std::vector<uint64_t> shape, uint64_t offset,
                          std::string data, v1::DType dtype = v1::DTYPE_FP32) {
  v1::StateDictChunk chunk;
  chunk.set_key(std::move(key));
  for (uint64_t d : shape) chunk.add_shape(d);
  chunk.set_offset(offset);
  chunk.set_dtype(dtype);
  chunk.set_data(std::move(data));
  return chunk;
}

// The bytes of one fp32 NaN.
std::string NotFinite() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return std::string(reinterpret_cast<const char*>(&nan), sizeof(nan));
}

// The 0-d int64 counter `key` of `value`.
v1::StateDictChunk Counter(std::string key, int64_t value) {
  return Tensor(std::move(key), {}, 0,
                std::string(reinterpret_cast<const char*>(&value), sizeof(value)), v1::DTYPE_INT64);
}

// An ImportStateDict case into the fresh session: `chunks`, the first one naming the session.
BadInput Import(std::string name, std::vector<v1::StateDictChunk> chunks, Code code,
                std::string message) {
  return {std::move(name),
          [chunks](const Target& t) {
            std::vector<v1::StateDictChunk> messages = chunks;
            if (!messages.empty() && messages[0].session_id().empty()) {
              messages[0].set_session_id(t.fresh);
            }
            return CallImport(t.channel, messages);
          },
          code, std::move(message)};
}

// A unary call of `method` with `request`, which no peer sends.
template <typename Request>
BadInput Peer(std::string name, std::string method, Request request, Code code,
              std::string message) {
  return {std::move(name),
          [method, request](const Target& t) { return CallUnary(t.channel, method, request); },
          code, std::move(message)};
}

v1::HeldSessionRequest Held(std::string session_id, uint64_t token) {
  v1::HeldSessionRequest request;
  request.set_session_id(std::move(session_id));
  request.set_token(token);
  return request;
}

}  // namespace

std::vector<BadInput> CheckpointCases() {
  const std::string bias = Fp32Bytes(std::vector<float>(8, 0.5f));
  v1::StateDictChunk elsewhere = Tensor("param/fc.bias", {8}, 0, bias);
  elsewhere.set_session_id("s-elsewhere");
  v1::StateDictChunk unknown_sub = Tensor("param/fc.bias", {8}, 0, bias);
  unknown_sub.set_chunk_key("model");
  unknown_sub.set_sub_optimizer("no-such-sub");
  v1::CreateReplicaRequest replica;
  replica.set_session_id("s-replica");
  return {
      Save("save: '..'", "..", Code::INVALID_ARGUMENT, "'..'"),
      Save("save: a path with '/'", "a/b", Code::INVALID_ARGUMENT, "a/b"),
      Save("save: an absolute path", "/tmp", Code::INVALID_ARGUMENT, "/tmp"),
      Save("save: a hidden name", ".x", Code::INVALID_ARGUMENT, ".x"),
      Save("save: a control character", "bad\x01name", Code::INVALID_ARGUMENT, "'\\x01' at byte 3"),
      Save("save: a NUL byte", std::string("a\0b", 3), Code::INVALID_ARGUMENT, "'\\x00' at byte 1"),
      Save("save: an empty name", "", Code::INVALID_ARGUMENT, "name"),
      Save("save: 234 bytes", std::string(234, 'n'), Code::INVALID_ARGUMENT, "at most 233"),
      {"save: unknown session",
       [](const Target& t) {
         v1::SaveRequest request;
         request.set_session_id("s-unknown");
         request.set_name("ok-name");
         return CallSave(t.channel, request);
       },
       Code::NOT_FOUND, "session 's-unknown' not found"},
      Load("load: '..'", "..", Code::INVALID_ARGUMENT, "'..'"),
      Load("load: a hidden temporary", ".tmp-x", Code::INVALID_ARGUMENT, ".tmp-x"),
      Load("load: a missing checkpoint", "never-saved", Code::NOT_FOUND, "never-saved"),
      {"load: a corrupt manifest",
       [](const Target& t) {
         const std::string dir = t.checkpoint_root + "/corrupt";
         mkdir(dir.c_str(), 0755);
         std::ofstream(dir + "/manifest.json") << "{\"format\": 1, \"step\": \"x\"";
         v1::LoadRequest request;
         request.set_session_id(t.stepped);
         request.set_name("corrupt");
         return CallLoad(t.channel, request);
       },
       Code::DATA_LOSS, "manifest"},
      Export(
          "export: unknown session", [](v1::ExportStateDictRequest& r) { r.set_session_id("s-q"); },
          Code::NOT_FOUND, "session 's-q' not found"),
      Export(
          "export: unknown layout",
          [](v1::ExportStateDictRequest& r) { r.set_layout(static_cast<v1::StateDictLayout>(7)); },
          Code::INVALID_ARGUMENT, "layout 7 is not a StateDictLayout"),
      Export(
          "export: unknown chunk_prefix",
          [](v1::ExportStateDictRequest& r) {
            r.set_layout(v1::STATE_DICT_LAYOUT_BY_MODEL_CHUNK);
            r.set_chunk_prefix("../x");
          },
          Code::INVALID_ARGUMENT, "chunk_prefix '../x' must be 'model' or 'model_'"),
      Export(
          "export: unknown model chunk",
          [](v1::ExportStateDictRequest& r) { r.add_model_chunks(7); }, Code::NOT_FOUND,
          "model chunk 7 not found: session '"),
      Import("import: unknown session", {elsewhere}, Code::NOT_FOUND, "s-elsewhere"),
      Import("import: unknown key", {Tensor("param/no.such", {8}, 0, bias)}, Code::INVALID_ARGUMENT,
             "no.such"),
      Import("import: wrong shape", {Tensor("param/fc.bias", {9}, 0, bias + bias.substr(0, 4))},
             Code::INVALID_ARGUMENT, "fc.bias"),
      Import("import: bf16 tensor",
             {Tensor("param/fc.bias", {8}, 0, bias.substr(0, 16), v1::DTYPE_BF16)},
             Code::INVALID_ARGUMENT, "dtype 2 is not fp32 or int64"),
      Import("import: zero dimension", {Tensor("param/fc.bias", {0}, 0, "")},
             Code::INVALID_ARGUMENT, "dimension 0 out of range"),
      Import("import: chunk past the tensor", {Tensor("param/fc.bias", {8}, 6, bias)},
             Code::INVALID_ARGUMENT, "chunk at element 6 of 32 bytes exceeds 32 bytes"),
      Import("import: chunks disagree on the shape",
             {Tensor("param/fc.bias", {8}, 0, bias.substr(0, 16)),
              Tensor("param/fc.bias", {2, 4}, 4, bias.substr(0, 16))},
             Code::INVALID_ARGUMENT, "chunks disagree on dtype or shape"),
      Import("import: elements twice",
             {Tensor("param/fc.bias", {8}, 0, bias),
              Tensor("param/fc.bias", {8}, 2, bias.substr(0, 8))},
             Code::INVALID_ARGUMENT, "chunk at element 2 brings the data to 40 bytes, over the 32"),
      Import("import: elements missing", {Tensor("param/fc.bias", {8}, 0, bias.substr(0, 16))},
             Code::INVALID_ARGUMENT, "elements [4, 8) never arrived"),
      Import("import: unknown sub-optimizer", {unknown_sub}, Code::INVALID_ARGUMENT,
             "no sub-optimizer named 'no-such-sub'"),
      Import("import: a 2^40-element tensor",
             {Tensor("param/fc.bias", {uint64_t{1} << 40}, 0, bias)}, Code::RESOURCE_EXHAUSTED,
             "shape [1099511627776] is over the"),
      Import("import: a shape whose size wraps around",
             {Tensor("param/fc.bias", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, bias)},
             Code::RESOURCE_EXHAUSTED, "shape [4294967296, 4294967296] is over the"),
      Import("import: a chunk without data", {Tensor("param/fc.bias", {8}, 0, "")},
             Code::INVALID_ARGUMENT, "a chunk without data"),
      Import("import: a value that is not finite",
             {Tensor("param/fc.bias", {8}, 0, bias.substr(0, 28) + NotFinite())},
             Code::INVALID_ARGUMENT, "state dict key 'param/fc.bias': value at element 7 is nan"),
      Import("import: a negative step counter", {Counter("meta/step", -1)}, Code::INVALID_ARGUMENT,
             "a counter must not be negative"),
      {"import: no StreamEnd",
       [bias](const Target& t) {
         v1::StateDictChunk chunk = Tensor("param/fc.bias", {8}, 0, bias);
         chunk.set_session_id(t.fresh);
         return CallImport(t.channel, {chunk}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "without its final message (StreamEnd)"},
      {"import: StreamEnd with another byte count",
       [bias](const Target& t) {
         v1::StateDictChunk chunk = Tensor("param/fc.bias", {8}, 0, bias);
         chunk.set_session_id(t.fresh);
         v1::StateDictChunk end;
         end.mutable_end()->set_chunks(1);
         end.mutable_end()->set_bytes(31);
         end.mutable_end()->set_tensors(1);
         return CallImport(t.channel, {chunk, end}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "the final message declares"},
      Peer(
          "peer: CloseReplica of an unknown session", "/optstep.v1.PeerService/CloseReplica",
          [] {
            v1::CloseReplicaRequest r;
            r.set_session_id("s-nobody");
            return r;
          }(),
          Code::NOT_FOUND, "s-nobody"),
      Peer("peer: CreateReplica without a spec", "/optstep.v1.PeerService/CreateReplica", replica,
           Code::INVALID_ARGUMENT, "declares no parameters"),
      Peer("peer: HoldSession of an unknown session", "/optstep.v1.PeerService/HoldSession",
           Held("s-void", 1), Code::NOT_FOUND, "s-void"),
      Peer("peer: ApplyHeldState without a hold", "/optstep.v1.PeerService/ApplyHeldState",
           Held("s-void", 77), Code::NOT_FOUND, "s-void"),
      Peer("peer: SettleSession of an unknown session", "/optstep.v1.PeerService/SettleSession",
           Held("s-unsettled", 5), Code::NOT_FOUND, "s-unsettled"),
      {"admin: Shutdown with unparsable bytes",
       [](const Target& t) {
         return CallUnaryBytes(t.channel, "/optstep.v1.AdminService/Shutdown",
                               "\x0a\x05"
                               "ab");
       },
       Code::INVALID_ARGUMENT, "does not parse as optstep.v1.ShutdownRequest"},
  };
}

}  // namespace testutil
}  // namespace optstep
