// InitParameters, PullParameters, GetSession, ListSessions and CloseSession with bad input.

#include <limits>

#include "optstep/v1/optimizer_service.pb.h"
#include "tests/security/bad_input_calls.h"
#include "tests/security/bad_input_cases.h"

namespace optstep {
namespace testutil {
namespace {

using Code = grpc::StatusCode;

v1::InitParametersRequest Values(const std::string& session_id, uint32_t param_id, uint64_t offset,
                                 std::string data, v1::DType dtype = v1::DTYPE_FP32) {
  v1::InitParametersRequest request;
  request.set_session_id(session_id);
  request.mutable_values()->set_param_id(param_id);
  request.mutable_values()->set_offset(offset);
  request.mutable_values()->set_dtype(dtype);
  request.mutable_values()->set_data(std::move(data));
  return request;
}

// An InitParameters case of one message built from the fresh session's id.
BadInput Init(std::string name, std::function<v1::InitParametersRequest(const std::string&)> make,
              Code code, std::string message) {
  return {std::move(name), [make](const Target& t) { return CallInit(t.channel, {make(t.fresh)}); },
          code, std::move(message)};
}

BadInput Pull(std::string name, std::function<void(v1::PullParametersRequest&)> edit, Code code,
              std::string message) {
  return {std::move(name),
          [edit](const Target& t) {
            v1::PullParametersRequest request;
            request.set_session_id(t.stepped);
            edit(request);
            return CallPull(t.channel, request);
          },
          code, std::move(message)};
}

BadInput Unparsable(std::string name, std::string method) {
  return {std::move(name),
          [method](const Target& t) {
            return CallUnaryBytes(t.channel, "/optstep.v1.OptimizerService/" + method, "\x0a\xff");
          },
          Code::INVALID_ARGUMENT, "does not parse"};
}

grpc::Status Close(const Target& t, const std::string& id) {
  v1::CloseSessionRequest request;
  request.set_session_id(id);
  return CallUnary(t.channel, "/optstep.v1.OptimizerService/CloseSession", request);
}

}  // namespace

std::vector<BadInput> ParameterStreamCases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  return {
      Init(
          "init: unknown session",
          [](const std::string&) { return Values("s-none", 0, 0, Fp32Bytes({1})); },
          Code::NOT_FOUND, "session 's-none' not found"),
      Init(
          "init: no session id",
          [](const std::string&) { return Values("", 0, 0, Fp32Bytes({1})); }, Code::NOT_FOUND,
          "session '' not found"),
      Init(
          "init: unknown param_id",
          [](const std::string& id) { return Values(id, 2, 0, Fp32Bytes({1})); }, Code::NOT_FOUND,
          "param_id 2 not found"),
      Init(
          "init: values past the end",
          [](const std::string& id) {
            return Values(id, 1, 7, Fp32Bytes({1, 2}));
          },
          Code::INVALID_ARGUMENT, "values [7, 9) exceed 8 elements"),
      Init(
          "init: offset 2^63",
          [](const std::string& id) { return Values(id, 1, uint64_t{1} << 63, Fp32Bytes({1})); },
          Code::INVALID_ARGUMENT, "offset 9223372036854775808 out of range"),
      Init(
          "init: more values than the parameter",
          [](const std::string& id) { return Values(id, 1, 0, Fp32Bytes(std::vector<float>(9))); },
          Code::INVALID_ARGUMENT, "values [0, 9) exceed 8 elements"),
      Init(
          "init: bytes not a multiple of fp32",
          [](const std::string& id) { return Values(id, 1, 0, std::string(5, '\0')); },
          Code::INVALID_ARGUMENT, "5 bytes is not a multiple"),
      Init(
          "init: bytes not a multiple of bf16",
          [](const std::string& id) {
            return Values(id, 1, 0, std::string(3, '\0'), v1::DTYPE_BF16);
          },
          Code::INVALID_ARGUMENT, "3 bytes is not a multiple"),
      Init(
          "init: NaN value",
          [=](const std::string& id) {
            return Values(id, 0, 4, Fp32Bytes({1, 2, nan}));
          },
          Code::INVALID_ARGUMENT, "at element 6 is nan"),
      Init(
          "init: infinite value",
          [=](const std::string& id) { return Values(id, 1, 0, Fp32Bytes({-inf})); },
          Code::INVALID_ARGUMENT, "at element 0 is -inf"),
      Init(
          "init: unspecified dtype",
          [](const std::string& id) {
            return Values(id, 1, 0, Fp32Bytes({1}), v1::DTYPE_UNSPECIFIED);
          },
          Code::INVALID_ARGUMENT, "dtype"),
      Init(
          "init: int64 dtype",
          [](const std::string& id) {
            return Values(id, 1, 0, std::string(8, '\0'), v1::DTYPE_INT64);
          },
          Code::INVALID_ARGUMENT, "dtype"),
      Init(
          "init: unknown dtype",
          [](const std::string& id) {
            return Values(id, 1, 0, Fp32Bytes({1}), static_cast<v1::DType>(99));
          },
          Code::INVALID_ARGUMENT, "dtype"),
      {"init: a second session id in the stream",
       [](const Target& t) {
         v1::InitParametersRequest first;
         first.set_session_id(t.fresh);
         return CallInit(t.channel, {first, Values(t.stepped, 1, 0, Fp32Bytes({1}))});
       },
       Code::INVALID_ARGUMENT, "differs from the stream's session"},
      {"init: after the first step",
       [](const Target& t) {
         return CallInit(t.channel, {Values(t.stepped, 1, 0, Fp32Bytes({1}))});
       },
       Code::FAILED_PRECONDITION,
       "initial values can only be set before the first step (at step 2)"},
      // Streams that are no complete transaction: valid values, nothing written.
      {"init: no StreamEnd",
       [](const Target& t) {
         return CallInit(t.channel, {Values(t.fresh, 1, 0, Fp32Bytes({9}))}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "without its final message (StreamEnd)"},
      {"init: StreamEnd with another CRC-32",
       [](const Target& t) {
         v1::InitParametersRequest end;
         end.mutable_end()->set_chunks(1);
         end.mutable_end()->set_bytes(4);
         end.mutable_end()->set_tensors(1);
         end.mutable_end()->set_crc32(12345);
         return CallInit(t.channel, {Values(t.fresh, 1, 0, Fp32Bytes({9})), end}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "declares CRC-32 12345"},
      {"init: StreamEnd counting fewer chunks",
       [](const Target& t) {
         v1::InitParametersRequest end;
         end.mutable_end()->set_tensors(1);
         return CallInit(t.channel, {Values(t.fresh, 1, 0, Fp32Bytes({9})), end}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "the final message declares"},
      {"init: values after the StreamEnd",
       [](const Target& t) {
         v1::InitParametersRequest end;
         end.set_session_id(t.fresh);
         end.mutable_end();
         return CallInit(t.channel, {end, Values(t.fresh, 1, 0, Fp32Bytes({9}))}, Ending::kAsGiven);
       },
       Code::INVALID_ARGUMENT, "StreamEnd"},
      Pull(
          "pull: unknown session", [](v1::PullParametersRequest& r) { r.set_session_id("s-x"); },
          Code::NOT_FOUND, "session 's-x' not found"),
      Pull(
          "pull: unknown param_id", [](v1::PullParametersRequest& r) { r.add_param_ids(7); },
          Code::NOT_FOUND, "PullParameters: param_id 7 not found"),
      Pull(
          "pull: param_id listed twice",
          [](v1::PullParametersRequest& r) {
            for (uint32_t id : {1u, 1u}) r.add_param_ids(id);
          },
          Code::INVALID_ARGUMENT, "PullParameters: param_id 1 ('fc.bias') is listed twice"),
      Pull(
          "pull: fp16 dtype", [](v1::PullParametersRequest& r) { r.set_dtype(v1::DTYPE_FP16); },
          Code::INVALID_ARGUMENT, "PullParameters: dtype 3 must be fp32 or bf16"),
      Pull(
          "pull: unknown dtype",
          [](v1::PullParametersRequest& r) { r.set_dtype(static_cast<v1::DType>(1000)); },
          Code::INVALID_ARGUMENT, "PullParameters: dtype 1000"),
      Unparsable("pull: unparsable bytes", "PullParameters"),
      Unparsable("get: unparsable bytes", "GetSession"),
      Unparsable("list: unparsable bytes", "ListSessions"),
      Unparsable("close: unparsable bytes", "CloseSession"),
      {"get: unknown session",
       [](const Target& t) {
         v1::GetSessionRequest request;
         request.set_session_id("s-unknown");
         return CallUnary(t.channel, "/optstep.v1.OptimizerService/GetSession", request);
       },
       Code::NOT_FOUND, "session 's-unknown' not found"},
      {"get: 64 KiB session id",
       [](const Target& t) {
         v1::GetSessionRequest request;
         request.set_session_id(std::string(64 << 10, 'x'));
         return CallUnary(t.channel, "/optstep.v1.OptimizerService/GetSession", request);
       },
       Code::NOT_FOUND, "xxxxxxxx...(65536 bytes)' not found"},
      {"get: session id with control characters",
       [](const Target& t) {
         v1::GetSessionRequest request;
         request.set_session_id("s\x1b[2J\n");
         return CallUnary(t.channel, "/optstep.v1.OptimizerService/GetSession", request);
       },
       Code::NOT_FOUND, "session 's\\x1b[2J\\n' not found"},
      {"close: unknown session", [](const Target& t) { return Close(t, "s-gone"); },
       Code::NOT_FOUND, "session 's-gone' not found"},
      {"close: twice",
       [](const Target& t) {
         grpc::Status status = Close(t, t.closable);
         return status.ok() ? Close(t, t.closable) : status;
       },
       Code::NOT_FOUND, "not found"},
  };
}

}  // namespace testutil
}  // namespace optstep
