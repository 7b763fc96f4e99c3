#include "client/python/native/native_client.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/client_options.h"
#include "client/cpp/client_types.h"
#include "client/cpp/step_recovery.h"
#include "client/cpp/step_stream.h"
#include "kernels/dtype.h"

namespace optstep {
namespace {

// optstep.v1.DType values of the wire element types.
constexpr uint32_t kProtoF32 = 1;
constexpr uint32_t kProtoBF16 = 2;
constexpr uint32_t kProtoF16 = 3;

absl::Status DTypeOf(uint32_t proto, absl::string_view what, DType* dtype) {
  switch (proto) {
    case kProtoF32:
      *dtype = DType::kF32;
      return absl::OkStatus();
    case kProtoBF16:
      *dtype = DType::kBF16;
      return absl::OkStatus();
    case kProtoF16:
      *dtype = DType::kF16;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dtype ", proto, " is not one of fp32, bf16, fp16"));
  }
}

int32_t Fail(const absl::Status& status, char* error, size_t error_len) {
  if (error != nullptr && error_len > 0) {
    const std::string message(status.message());
    const size_t n = std::min(message.size(), error_len - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return static_cast<int32_t>(status.code());
}

std::string StringOrEmpty(const char* s) { return s == nullptr ? std::string() : std::string(s); }

absl::Duration Seconds(double s) { return absl::Seconds(s); }

ClientOptions ToClientOptions(const OptstepNativeOptions& o) {
  ClientOptions options;
  for (uint32_t r = 0; r < o.num_ranks; ++r) options.rank_targets.emplace_back(o.rank_targets[r]);
  options.connect_timeout = Seconds(o.connect_timeout_s);
  options.rpc_timeout = Seconds(o.rpc_timeout_s);
  options.stream_timeout = Seconds(o.stream_timeout_s);
  options.recovery_timeout = Seconds(o.recovery_timeout_s);
  options.wait_for_ready = o.wait_for_ready != 0;
  options.max_message_bytes = o.max_message_bytes;
  options.stream_lookahead_bytes = o.stream_lookahead_bytes;
  options.max_frame_bytes = o.max_frame_bytes;
  options.bdp_probe = o.bdp_probe != 0;
  options.max_chunk_bytes = o.max_chunk_bytes;
  options.tls = o.tls != 0;
  options.tls_ca_file = StringOrEmpty(o.tls_ca_file);
  options.tls_cert_file = StringOrEmpty(o.tls_cert_file);
  options.tls_key_file = StringOrEmpty(o.tls_key_file);
  options.tls_server_name = StringOrEmpty(o.tls_server_name);
  options.token = StringOrEmpty(o.token);
  return options;
}

// Copies the reply's parameters into the caller's buffers, after checking every one has its
// buffer of the right size and dtype.
absl::Status WriteParams(const HostParameterMap& params, DType dtype,
                         absl::Span<const OptstepNativeOut> outs) {
  absl::flat_hash_map<uint32_t, const OptstepNativeOut*> by_id;
  for (const OptstepNativeOut& out : outs) by_id[out.param_id] = &out;
  for (const auto& [id, param] : params) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no output buffer for returned param_id ", id));
    }
    const OptstepNativeOut& out = *it->second;
    DType out_dtype;
    if (!DTypeOf(out.dtype, "output buffer", &out_dtype).ok() || out_dtype != dtype ||
        out.count != param.size() || out.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("output buffer of param_id ", id, ": ", out.count, " elements of dtype ",
                       out.dtype, ", expected ", param.size(), " of ", DTypeName(dtype)));
    }
  }
  for (const auto& [id, param] : params) {
    void* dst = by_id[id]->data;
    if (param.dtype == DType::kF32) {
      std::memcpy(dst, param.f32.data(), param.f32.size() * sizeof(float));
    } else {
      std::memcpy(dst, param.bf16.data(), param.bf16.size() * sizeof(uint16_t));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GradientSlice>> ToGradients(
    absl::Span<const OptstepNativeSlice> slices) {
  std::vector<GradientSlice> gradients;
  gradients.reserve(slices.size());
  for (const OptstepNativeSlice& s : slices) {
    GradientSlice g;
    g.param_id = s.param_id;
    g.offset = s.offset;
    if (absl::Status status =
            DTypeOf(s.dtype, absl::StrCat("gradient of param_id ", s.param_id), &g.dtype);
        !status.ok()) {
      return status;
    }
    g.bytes =
        absl::MakeConstSpan(static_cast<const uint8_t*>(s.data), s.count * DTypeSize(g.dtype));
    gradients.push_back(g);
  }
  return gradients;
}

// The step's reply (or its error) into `result` and the caller's buffers.
absl::Status Answer(const absl::StatusOr<StepReply>& reply, DType return_dtype,
                    absl::Span<const OptstepNativeOut> outs, OptstepNativeResult* result) {
  if (!reply.ok()) {
    if (std::optional<uint64_t> restored = RewindStep(reply.status())) {
      result->rewind = 1;
      result->rewind_step = *restored;
    }
    return reply.status();
  }
  result->step = reply->step;
  result->skipped = reply->skipped ? 1 : 0;
  result->clipped = reply->clipped ? 1 : 0;
  result->grad_norm = reply->grad_norm;
  result->params_written = static_cast<uint32_t>(reply->params.size());
  return WriteParams(reply->params, return_dtype, outs);
}

// The outs of a streamed step become its destinations: written as their chunks arrive.
absl::Status SetDestinations(StepStream& stream, DType return_dtype,
                             absl::Span<const OptstepNativeOut> outs) {
  for (const OptstepNativeOut& out : outs) {
    DType dtype;
    OPTSTEP_RETURN_IF_ERROR(DTypeOf(out.dtype, "output buffer", &dtype));
    if (dtype != return_dtype || out.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("output buffer of param_id ", out.param_id,
                                                     ": dtype ", out.dtype, ", expected ",
                                                     DTypeName(return_dtype)));
    }
    OPTSTEP_RETURN_IF_ERROR(stream.WriteInto(
        out.param_id,
        absl::MakeSpan(static_cast<uint8_t*>(out.data), out.count * DTypeSize(dtype))));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOptions> MakeStepOptions(const char* session_id, uint64_t step,
                                            uint32_t trainer_id, const OptstepNativeGroup* groups,
                                            size_t num_groups, uint32_t return_dtype,
                                            const uint32_t* return_param_ids,
                                            size_t num_return_param_ids, int32_t skip_return) {
  StepOptions options;
  options.session_id = session_id;
  options.step = step;
  options.trainer_id = trainer_id;
  for (size_t i = 0; i < num_groups; ++i) {
    GroupSchedule group;
    group.group_id = groups[i].group_id;
    if (groups[i].has_lr) group.lr = groups[i].lr;
    if (groups[i].has_weight_decay) group.weight_decay = groups[i].weight_decay;
    options.groups.push_back(group);
  }
  if (absl::Status status = DTypeOf(return_dtype, "return dtype", &options.return_dtype);
      !status.ok()) {
    return status;
  }
  options.return_param_ids.assign(return_param_ids, return_param_ids + num_return_param_ids);
  options.skip_return = skip_return != 0;
  return options;
}

// An opened step and the dtype its parameters come back in.
struct NativeStream {
  std::unique_ptr<StepStream> stream;
  DType return_dtype;
};

}  // namespace
}  // namespace optstep

// The C interface's bodies.
using optstep::Answer;
using optstep::Client;
using optstep::Fail;
using optstep::GradientSlice;
using optstep::MakeStepOptions;
using optstep::NativeStream;
using optstep::SetDestinations;
using optstep::StepOptions;
using optstep::StepStream;
using optstep::ToGradients;

void* optstep_native_connect(const OptstepNativeOptions* options, int32_t* code, char* error,
                             size_t error_len) {
  absl::StatusOr<std::unique_ptr<optstep::Client>> client =
      optstep::Client::Connect(optstep::ToClientOptions(*options));
  if (!client.ok()) {
    *code = optstep::Fail(client.status(), error, error_len);
    return nullptr;
  }
  *code = 0;
  return client->release();
}

void optstep_native_close(void* client) { delete static_cast<optstep::Client*>(client); }

int32_t optstep_native_step(void* client, const char* session_id, uint64_t step,
                            uint32_t trainer_id, const OptstepNativeGroup* groups,
                            size_t num_groups, uint32_t return_dtype,
                            const uint32_t* return_param_ids, size_t num_return_param_ids,
                            int32_t skip_return, const OptstepNativeSlice* slices,
                            size_t num_slices, const OptstepNativeOut* outs, size_t num_outs,
                            OptstepNativeResult* result, char* error, size_t error_len) {
  *result = OptstepNativeResult{};
  absl::StatusOr<StepOptions> options =
      MakeStepOptions(session_id, step, trainer_id, groups, num_groups, return_dtype,
                      return_param_ids, num_return_param_ids, skip_return);
  if (!options.ok()) return Fail(options.status(), error, error_len);
  absl::StatusOr<std::vector<GradientSlice>> gradients =
      ToGradients(absl::MakeConstSpan(slices, num_slices));
  if (!gradients.ok()) return Fail(gradients.status(), error, error_len);
  const absl::Status status =
      Answer(static_cast<Client*>(client)->Step(*options, *gradients), options->return_dtype,
             absl::MakeConstSpan(outs, num_outs), result);
  return status.ok() ? 0 : Fail(status, error, error_len);
}

void* optstep_native_step_open(void* client, const char* session_id, uint64_t step,
                               uint32_t trainer_id, const OptstepNativeGroup* groups,
                               size_t num_groups, uint32_t return_dtype,
                               const uint32_t* return_param_ids, size_t num_return_param_ids,
                               int32_t skip_return, int32_t* code, char* error, size_t error_len) {
  absl::StatusOr<StepOptions> options =
      MakeStepOptions(session_id, step, trainer_id, groups, num_groups, return_dtype,
                      return_param_ids, num_return_param_ids, skip_return);
  absl::StatusOr<std::unique_ptr<StepStream>> stream =
      options.ok() ? static_cast<Client*>(client)->OpenStep(*options)
                   : absl::StatusOr<std::unique_ptr<StepStream>>(options.status());
  if (!stream.ok()) {
    *code = Fail(stream.status(), error, error_len);
    return nullptr;
  }
  *code = 0;
  return new NativeStream{*std::move(stream), options->return_dtype};
}

int32_t optstep_native_step_add(void* stream, const OptstepNativeSlice* slices, size_t num_slices,
                                char* error, size_t error_len) {
  absl::StatusOr<std::vector<GradientSlice>> gradients =
      ToGradients(absl::MakeConstSpan(slices, num_slices));
  const absl::Status status = gradients.ok()
                                  ? static_cast<NativeStream*>(stream)->stream->Add(*gradients)
                                  : gradients.status();
  return status.ok() ? 0 : Fail(status, error, error_len);
}

int32_t optstep_native_step_finish(void* stream, const OptstepNativeOut* outs, size_t num_outs,
                                   OptstepNativeReadyFn ready, OptstepNativeResult* result,
                                   char* error, size_t error_len) {
  *result = OptstepNativeResult{};
  auto* native = static_cast<NativeStream*>(stream);
  StepStream& step = *native->stream;
  if (absl::Status status =
          SetDestinations(step, native->return_dtype, absl::MakeConstSpan(outs, num_outs));
      !status.ok()) {
    return Fail(status, error, error_len);
  }
  if (ready != nullptr) step.OnParamReady([ready](uint32_t param_id) { ready(param_id); });
  // Every out is a destination: the reply's own parameters are those without one (none).
  const absl::Status status = Answer(step.Finish(), native->return_dtype, {}, result);
  result->params_written += step.destinations_filled();
  return status.ok() ? 0 : Fail(status, error, error_len);
}

void optstep_native_step_close(void* stream) { delete static_cast<optstep::NativeStream*>(stream); }
