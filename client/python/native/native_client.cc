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
#include "base/status_payload.h"
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

// The step's reply (or its error) into `result`; its parameters went into the outs
// (ToDestinations), and a returned parameter left in the reply had none: INVALID_ARGUMENT.
absl::Status Answer(const absl::StatusOr<StepReply>& reply, OptstepNativeResult* result) {
  if (!reply.ok()) {
    if (std::optional<uint64_t> restored = RewindStep(reply.status())) {
      result->rewind = 1;
      result->rewind_step = *restored;
    }
    result->expected_step =
        PayloadNumber(reply.status(), absl::StatusCode::kFailedPrecondition, kExpectedStepPayload)
            .value_or(0);
    return reply.status();
  }
  result->step = reply->step;
  result->skipped = reply->skipped ? 1 : 0;
  result->clipped = reply->clipped ? 1 : 0;
  result->grad_norm = reply->grad_norm;
  result->params_written = reply->destinations_filled;
  if (!reply->params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no output buffer for returned param_id ", reply->params.begin()->first));
  }
  return absl::OkStatus();
}

// The outs as the step's destinations: each returned parameter is written into its out as its
// chunks arrive. INVALID_ARGUMENT for an out of another dtype than the step returns.
absl::StatusOr<ParamDestinations> ToDestinations(DType return_dtype,
                                                 absl::Span<const OptstepNativeOut> outs) {
  ParamDestinations destinations;
  for (const OptstepNativeOut& out : outs) {
    DType dtype;
    OPTSTEP_RETURN_IF_ERROR(DTypeOf(out.dtype, "output buffer", &dtype));
    if (dtype != return_dtype) {
      return absl::InvalidArgumentError(absl::StrCat("output buffer of param_id ", out.param_id,
                                                     ": dtype ", out.dtype, ", expected ",
                                                     DTypeName(return_dtype)));
    }
    if (out.data == nullptr && out.count > 0) {
      return absl::InvalidArgumentError(absl::StrCat("output buffer of param_id ", out.param_id,
                                                     ": null pointer for ", out.count,
                                                     " elements"));
    }
    destinations[out.param_id] =
        absl::MakeSpan(static_cast<uint8_t*>(out.data), out.count * DTypeSize(dtype));
  }
  return destinations;
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
using optstep::ParamDestinations;
using optstep::StepOptions;
using optstep::StepStream;
using optstep::ToDestinations;
using optstep::ToGradients;

size_t optstep_native_result_bytes(void) { return sizeof(OptstepNativeResult); }

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

void optstep_native_state_replaced(void* client, const char* session_id, uint64_t step,
                                   int64_t trainer_id) {
  static_cast<optstep::Client*>(client)->StateReplaced(
      session_id, step,
      trainer_id < 0 ? std::nullopt : std::optional<uint32_t>(static_cast<uint32_t>(trainer_id)));
}

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
  absl::StatusOr<ParamDestinations> into =
      ToDestinations(options->return_dtype, absl::MakeConstSpan(outs, num_outs));
  if (!into.ok()) return Fail(into.status(), error, error_len);
  const absl::Status status =
      Answer(static_cast<Client*>(client)->Step(*options, *gradients, *into), result);
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
  absl::StatusOr<ParamDestinations> into =
      ToDestinations(native->return_dtype, absl::MakeConstSpan(outs, num_outs));
  if (!into.ok()) return Fail(into.status(), error, error_len);
  for (const auto& [id, bytes] : *into) {
    if (absl::Status status = step.WriteInto(id, bytes); !status.ok()) {
      return Fail(status, error, error_len);
    }
  }
  if (ready != nullptr) step.OnParamReady([ready](uint32_t param_id) { ready(param_id); });
  const absl::Status status = Answer(step.Finish(), result);
  return status.ok() ? 0 : Fail(status, error, error_len);
}

void optstep_native_step_close(void* stream) { delete static_cast<optstep::NativeStream*>(stream); }
