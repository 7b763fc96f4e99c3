#include "client/cpp/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/random_bytes.h"
#include "base/status_macros.h"
#include "client/cpp/channel_options.h"
#include "client/cpp/chunking.h"
#include "client/cpp/client_rank.h"
#include "client/cpp/param_assembler.h"
#include "client/cpp/session_layout.h"
#include "client/cpp/session_pages.h"
#include "client/cpp/step_call.h"
#include "client/cpp/step_stream.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "optstep/v1/admin_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "wire/grpc_status.h"
#include "wire/proto_dtype.h"
#include "wire/stream_end.h"

namespace optstep {

using client_internal::ParamAssembler;
using client_internal::RankContribution;
using client_internal::SessionLayout;
using client_internal::StepCall;

namespace {

absl::Status CheckReturnDType(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters can be returned as fp32 or bf16, not ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(client_internal::ValidateClientOptions(options));
  std::vector<std::string> targets = options.rank_targets;
  if (targets.empty()) targets.push_back(options.target);

  const grpc::ChannelArguments args = client_internal::MakeChannelArguments(options);
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                           client_internal::MakeChannelCredentials(options));
  RankOpener open_rank = [credentials, args](const std::string& target) {
    auto rank = std::make_shared<Rank>();
    rank->target = target;
    rank->channel = grpc::CreateCustomChannel(target, credentials, args);
    rank->service = v1::OptimizerService::NewStub(rank->channel);
    rank->health = grpc::health::v1::Health::NewStub(rank->channel);
    return rank;
  };
  std::vector<std::shared_ptr<Rank>> ranks;
  for (const std::string& target : targets) ranks.push_back(open_rank(target));
  std::unique_ptr<Client> client(new Client(options, std::move(ranks), std::move(open_rank)));
  if (options.connect_timeout > absl::ZeroDuration()) OPTSTEP_RETURN_IF_ERROR(client->AwaitRanks());
  return client;
}

Client::Client(ClientOptions options, std::vector<std::shared_ptr<Rank>> ranks,
               RankOpener open_rank)
    : options_(std::move(options)),
      ranks_(std::move(ranks)),
      open_rank_(std::move(open_rank)),
      recovery_(options_.recovery_timeout) {}

Client::~Client() = default;

absl::StatusOr<v1::SessionInfo> Client::CreateSession(const v1::SessionSpec& spec, bool* attached) {
  v1::CreateSessionRequest request;
  *request.mutable_spec() = spec;
  // One id for the call and its retry where rank 0 is served now: a retry after a lost answer
  // gets the session the first attempt made.
  request.set_request_id(RandomHex(16));
  v1::CreateSessionResponse response;
  OPTSTEP_RETURN_IF_ERROR(OnRankZero([&](Rank& rank) {
    grpc::ClientContext context;
    Prepare(context, options_.rpc_timeout, options_.wait_for_ready);
    return FromGrpcStatus(rank.service->CreateSession(&context, request, &response));
  }));
  if (attached != nullptr) *attached = response.attached();
  // The answer is a summary: the layout comes in GetSession's pages.
  return GetSession(response.summary().session_id());
}

absl::StatusOr<v1::SessionInfo> Client::GetSession(absl::string_view session_id) {
  return GetSessionBy(session_id, absl::InfiniteFuture());
}

absl::StatusOr<v1::SessionInfo> Client::GetSessionBy(absl::string_view session_id,
                                                     absl::Time deadline) {
  OPTSTEP_ASSIGN_OR_RETURN(
      v1::SessionInfo info,
      client_internal::ReadSession(
          session_id,
          [this, deadline](const v1::GetSessionRequest& request, v1::SessionInfo* page) {
            return OnRankZero(
                [&](Rank& rank) {
                  grpc::ClientContext context;
                  Prepare(context, TimeoutBy(deadline), options_.wait_for_ready);
                  return FromGrpcStatus(rank.service->GetSession(&context, request, page));
                },
                deadline);
          }));
  OPTSTEP_RETURN_IF_ERROR(Remember(info).status());
  return info;
}

absl::Duration Client::TimeoutBy(absl::Time deadline) const {
  // (Not std::clamp: rpc_timeout may be under 1 ms.)
  return std::min(std::max(deadline - absl::Now(), absl::Milliseconds(1)), options_.rpc_timeout);
}

absl::StatusOr<std::vector<v1::SessionSummary>> Client::ListSessions(uint32_t page_size) {
  return client_internal::ListAllSessions(
      page_size, [this](const v1::ListSessionsRequest& request, v1::ListSessionsResponse* page) {
        return ListSessionsPage(request, page);
      });
}

absl::Status Client::ListSessionsPage(const v1::ListSessionsRequest& request,
                                      v1::ListSessionsResponse* page) {
  return OnRankZero([&](Rank& rank) {
    grpc::ClientContext context;
    Prepare(context, options_.rpc_timeout, options_.wait_for_ready);
    return FromGrpcStatus(rank.service->ListSessions(&context, request, page));
  });
}

absl::Status Client::Shutdown(int rank, absl::string_view reason) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is not one of the ", ranks_.size(), " ranks of this client"));
  }
  // Not made again elsewhere (OnRank): a shutdown whose answer was lost would stop a second
  // process, the rank's stand-in or its own.
  grpc::ClientContext context;
  Prepare(context, options_.rpc_timeout, options_.wait_for_ready);
  v1::ShutdownRequest request;
  request.set_reason(std::string(reason));
  v1::ShutdownResponse response;
  return FromGrpcStatus(
      v1::AdminService::NewStub(Reach(rank)->channel)->Shutdown(&context, request, &response));
}

absl::Status Client::CloseSession(absl::string_view session_id) {
  v1::CloseSessionRequest request;
  request.set_session_id(std::string(session_id));
  v1::CloseSessionResponse response;
  int attempts = 0;
  absl::Status closed = OnRankZero([&](Rank& rank) {
    ++attempts;
    grpc::ClientContext context;
    Prepare(context, options_.rpc_timeout, options_.wait_for_ready);
    return FromGrpcStatus(rank.service->CloseSession(&context, request, &response));
  });
  // Made once more where rank 0 is served now after an attempt that got no answer: that attempt
  // may have closed the session before its answer was lost, so NOT_FOUND then means closed.
  if (absl::IsNotFound(closed) && attempts > 1) closed = absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(closed);
  absl::MutexLock lock(&mu_);
  layouts_.erase(std::string(session_id));
  return absl::OkStatus();
}

absl::StatusOr<Client::LayoutPtr> Client::Remember(const v1::SessionInfo& info) {
  OPTSTEP_ASSIGN_OR_RETURN(SessionLayout layout, SessionLayout::FromSessionInfo(info));
  FollowStandIns(info.layout().rank_targets(), info.layout().stood_in_ranks());
  auto shared = std::make_shared<const SessionLayout>(std::move(layout));
  absl::MutexLock lock(&mu_);
  layouts_[info.session_id()] = shared;
  return shared;
}

absl::StatusOr<Client::LayoutPtr> Client::Layout(absl::string_view session_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = layouts_.find(session_id);
    if (it != layouts_.end()) return it->second;
  }
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, GetSession(session_id));
  return Remember(info);
}

absl::Status Client::InitParameters(absl::string_view session_id, uint32_t param_id,
                                    absl::Span<const float> values) {
  OPTSTEP_ASSIGN_OR_RETURN(LayoutPtr layout, Layout(session_id));
  OPTSTEP_RETURN_IF_ERROR(layout->CheckParamId(param_id));
  const SessionLayout::Param& param = layout->param(param_id);
  if (values.size() != param.num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': ", values.size(),
                                                   " initial values, expected ",
                                                   param.num_elements));
  }
  // REPLICATED storage: every rank holds every master (the ranks all-gather them after each
  // step), so every rank gets the initial values; OWNERS: the owner alone.
  const size_t world = layout->world_size();
  if (world > ranks_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session '", session_id, "' spans ", world, " ranks but this client knows ",
                     ranks_.size(), " rank(s) (ClientOptions.rank_targets)"));
  }
  GradientSlice whole;
  whole.param_id = param_id;
  whole.dtype = DType::kF32;
  whole.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                          values.size() * sizeof(float));
  const std::vector<GradientSlice> pieces =
      client_internal::SplitIntoChunks({whole}, options_.max_chunk_bytes);
  // One rank's values; sent again in whole where a rank away is served elsewhere now (OnRank).
  const auto write = [&](Rank& reached, size_t rank) -> absl::Status {
    grpc::ClientContext context;
    Prepare(context, options_.stream_timeout, options_.wait_for_ready);
    v1::InitParametersResponse response;
    auto writer = reached.service->InitParameters(&context, &response);
    v1::InitParametersRequest request;
    request.set_session_id(std::string(session_id));
    v1::TensorChunk* chunk = request.mutable_values();
    StreamTally tally;
    bool open = true;
    for (const GradientSlice& piece : pieces) {
      chunk->set_param_id(piece.param_id);
      chunk->set_offset(piece.offset);
      chunk->set_dtype(v1::DTYPE_FP32);
      chunk->mutable_data()->assign(reinterpret_cast<const char*>(piece.bytes.data()),
                                    piece.bytes.size());
      tally.Add(chunk->data());
      if (!(open = writer->Write(request))) break;  // Finish() tells why
    }
    // The final message: the server writes the values only once it arrived and agrees.
    if (open) {
      request.Clear();
      *request.mutable_end() = tally.End(/*tensors=*/1);
      writer->Write(request);
    }
    writer->WritesDone();
    OPTSTEP_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
    if (response.elements() != values.size()) {
      return absl::InternalError(absl::StrCat("param '", param.name, "': rank ", rank, " wrote ",
                                              response.elements(), " of ", values.size(),
                                              " initial values"));
    }
    return absl::OkStatus();
  };
  // A group that heals refuses initial values meanwhile (UNAVAILABLE, nothing written): they
  // are sent again, to every rank, once it serves, as a step is redone.
  return recovery_.RunWhileUnavailable([&]() -> absl::Status {
    for (size_t rank = 0; rank < world; ++rank) {
      if (layout->owners_only() && rank != param.owner) continue;
      OPTSTEP_RETURN_IF_ERROR(OnRank(rank, [&](Rank& reached) { return write(reached, rank); }));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Parameters> Client::PullParameters(absl::string_view session_id, DType dtype,
                                                  absl::Span<const uint32_t> param_ids) {
  return PullParameters(session_id, dtype, param_ids, ParamDestinations());
}

absl::StatusOr<Parameters> Client::PullParameters(absl::string_view session_id, DType dtype,
                                                  absl::Span<const uint32_t> param_ids,
                                                  const ParamDestinations& into, absl::Time by) {
  OPTSTEP_RETURN_IF_ERROR(CheckReturnDType(dtype));
  OPTSTEP_ASSIGN_OR_RETURN(LayoutPtr layout, Layout(session_id));
  OPTSTEP_RETURN_IF_ERROR(client_internal::ValidateParamIds(*layout, param_ids));
  // REPLICATED storage: rank 0 holds every parameter; OWNERS: each owner answers its own, one
  // rank after the other.
  const std::vector<uint32_t> ranks =
      layout->owners_only() ? layout->OwnersOf(param_ids) : std::vector<uint32_t>{0};
  // Any one rank answers every parameter under REPLICATED storage (a client of one target too).
  if (layout->owners_only() && layout->world_size() > ranks_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", session_id, "' is laid out over ", layout->world_size(),
        " ranks but this client knows ", ranks_.size(), " (ClientOptions.rank_targets)"));
  }
  v1::PullParametersRequest request;
  request.set_session_id(std::string(session_id));
  request.set_dtype(DTypeToProto(dtype));
  for (uint32_t id : param_ids) request.add_param_ids(id);

  Parameters result;
  std::optional<ParamAssembler> assembler;
  const auto begin = [&]() -> absl::Status {
    assembler.emplace(*layout, dtype, param_ids);
    for (const auto& [id, bytes] : into) {
      OPTSTEP_RETURN_IF_ERROR(assembler->SetDestination(id, bytes));
    }
    return absl::OkStatus();
  };
  // The answer of `rank`, the i-th of `ranks`, into the assembler.
  const auto read = [&](Rank& rank, size_t i) -> absl::Status {
    grpc::ClientContext context;
    Prepare(context, std::min(options_.stream_timeout, by - absl::Now()), options_.wait_for_ready);
    auto reader = rank.service->PullParameters(&context, request);
    absl::Status error;
    v1::PullParametersResponse response;
    for (bool first = true; reader->Read(&response); first = false) {
      if (first && i == 0) result.step = response.step();
      if (first && i > 0 && response.step() != result.step && error.ok()) {
        error = absl::AbortedError(absl::StrCat(
            "PullParameters: rank ", ranks[i], " answered step ", response.step(), ", rank ",
            ranks[0], " step ", result.step, " (a step ran during the pull); pull again"));
      }
      if (!error.ok() || !response.has_parameter()) {
        if (!error.ok()) context.TryCancel();
        continue;
      }
      v1::TensorChunk* chunk = response.mutable_parameter();
      absl::StatusOr<DType> chunk_dtype = DTypeFromProto(
          chunk->dtype(), absl::StrCat("PullParameters: chunk of param_id ", chunk->param_id()));
      error = chunk_dtype.ok()
                  ? assembler->Add(chunk->param_id(), chunk->offset(), *chunk_dtype, chunk->data())
                  : absl::InternalError(chunk_dtype.status().message());
      if (!error.ok()) context.TryCancel();
    }
    absl::Status status = FromGrpcStatus(reader->Finish());
    OPTSTEP_RETURN_IF_ERROR(error);
    return status;
  };
  if (!layout->owners_only()) {
    // Rank 0 where it is served now, each try into a fresh assembler.
    OPTSTEP_RETURN_IF_ERROR(OnRankZero(
        [&](Rank& rank) -> absl::Status {
          OPTSTEP_RETURN_IF_ERROR(begin());
          return read(rank, 0);
        },
        by));
  } else {
    // Each owner where it is served now; a pull cut by an owner away is begun again in whole
    // (into a fresh assembler) where it moved.
    OPTSTEP_RETURN_IF_ERROR(OnRanks(
        std::vector<size_t>(ranks.begin(), ranks.end()),
        [&] {
          OPTSTEP_RETURN_IF_ERROR(begin());
          for (size_t i = 0; i < ranks.size(); ++i) {
            OPTSTEP_RETURN_IF_ERROR(read(*Reach(ranks[i]), i));
          }
          return absl::OkStatus();
        },
        by));
  }
  OPTSTEP_ASSIGN_OR_RETURN(result.params, assembler->Finish());
  result.destinations_filled = assembler->destinations_filled();
  return result;
}

absl::StatusOr<StepReply> Client::Step(const StepOptions& options,
                                       absl::Span<const GradientSlice> gradients) {
  return Step(options, gradients, ParamDestinations());
}

absl::StatusOr<StepReply> Client::Step(const StepOptions& options,
                                       absl::Span<const GradientSlice> gradients,
                                       const ParamDestinations& into) {
  // The destinations are checked once, before any attempt sends the step (each attempt's
  // WriteInto checks the same, once the step is applied): here, or, when the session's layout
  // cannot be read now (the group is away, or restores the session), in the first attempt.
  bool checked = into.empty();
  const auto check_into = [&](const SessionLayout& layout) -> absl::Status {
    OPTSTEP_RETURN_IF_ERROR(CheckStep(options, layout));
    client_internal::ParamAssembler check(layout, options.return_dtype, options.return_param_ids);
    for (const auto& [id, bytes] : into) OPTSTEP_RETURN_IF_ERROR(check.SetDestination(id, bytes));
    checked = true;
    return absl::OkStatus();
  };
  if (!checked) {
    absl::StatusOr<LayoutPtr> layout = Layout(options.session_id);
    if (layout.ok()) OPTSTEP_RETURN_IF_ERROR(check_into(**layout));
  }
  client_internal::GroupProbe probe{
      [this](absl::Time deadline) { return CheckHealthBy("", deadline); },
      [this](absl::string_view id,
             absl::Time deadline) -> absl::StatusOr<client_internal::SessionStep> {
        OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, GetSessionBy(id, deadline));
        return client_internal::SessionStep{info.step(), info.step_running()};
      }};
  // Each attempt lays the same gradients out on the session's current layout.
  return recovery_.Run(
      options.session_id, options.trainer_id, options.step, probe,
      [&]() -> absl::StatusOr<StepReply> {
        OPTSTEP_ASSIGN_OR_RETURN(LayoutPtr layout, Layout(options.session_id));
        if (!checked) OPTSTEP_RETURN_IF_ERROR(check_into(*layout));
        return StepWithLayout(options, std::move(layout), gradients, into);
      },
      [&](absl::Time by) { return AppliedStep(options, into, by); });
}

absl::StatusOr<StepReply> Client::AppliedStep(const StepOptions& options,
                                              const ParamDestinations& into, absl::Time by) {
  StepReply reply;
  reply.step = options.step;
  reply.grad_norm = std::numeric_limits<double>::quiet_NaN();  // not kept by a checkpoint
  if (options.skip_return) return reply;
  // The pulled values go where the step's would have gone.
  OPTSTEP_ASSIGN_OR_RETURN(
      Parameters pulled,
      PullParameters(options.session_id, options.return_dtype, options.return_param_ids, into, by));
  reply.step = pulled.step;  // below options.step: the group rolled back (StepRecovery rewinds)
  reply.params = std::move(pulled.params);
  reply.destinations_filled = pulled.destinations_filled;
  return reply;
}

absl::StatusOr<StepReply> Client::Step(const StepOptions& options,
                                       absl::Span<const FullGradient> gradients) {
  OPTSTEP_ASSIGN_OR_RETURN(LayoutPtr layout, Layout(options.session_id));
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<GradientSlice> slices,
                           client_internal::FullGradientsToSlices(*layout, gradients));
  return Step(options, absl::Span<const GradientSlice>(slices));
}

absl::Status Client::CheckStep(const StepOptions& options, const SessionLayout& layout) const {
  if (options.step == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session '", options.session_id, "': step 0 is not a step; steps are numbered from 1"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckReturnDType(options.return_dtype));
  OPTSTEP_RETURN_IF_ERROR(client_internal::ValidateParamIds(layout, options.return_param_ids));
  if (layout.world_size() > ranks_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", options.session_id, "' is laid out over ", layout.world_size(),
        " ranks but this client knows ", ranks_.size(), " (ClientOptions.rank_targets)"));
  }
  return absl::OkStatus();
}

std::unique_ptr<StepStream> Client::OpenStepCalls(const StepOptions& options, LayoutPtr layout) {
  v1::StepHeader header;
  header.set_session_id(options.session_id);
  header.set_step(options.step);
  header.set_trainer_id(options.trainer_id);
  for (const GroupSchedule& group : options.groups) {
    v1::GroupHyperparameters* g = header.add_groups();
    g->set_group_id(group.group_id);
    if (group.lr.has_value()) g->set_lr(*group.lr);
    if (group.weight_decay.has_value()) g->set_weight_decay(*group.weight_decay);
  }
  header.set_return_dtype(DTypeToProto(options.return_dtype));
  for (uint32_t id : options.return_param_ids) header.add_return_param_ids(id);
  // Every rank streams back the parameters it owns, as they are stepped (REPLICATED storage too,
  // where the ranks honour return_owned: not after the all-gather, nor all from one rank); else
  // the trainer's home rank streams back every parameter.
  header.set_return_owned(layout->returns_owned());
  const uint32_t world_size = layout->world_size();
  const absl::Time deadline = absl::Now() + options_.stream_timeout;
  auto arrivals = std::make_shared<client_internal::Arrivals>();
  std::vector<std::unique_ptr<StepCall>> calls;
  for (uint32_t r = 0; r < world_size; ++r) {
    calls.push_back(
        std::make_unique<StepCall>(Reach(r)->channel, deadline, options_.wait_for_ready, arrivals));
    header.set_skip_return(options.skip_return || !layout->ReturnsFrom(r, options.trainer_id));
    // A stream that broke while sending reports its status from ReceiveAvailable().
    calls.back()->Open(header);
  }
  return std::make_unique<StepStream>(std::move(layout), std::move(calls), std::move(arrivals),
                                      options, options_.max_chunk_bytes);
}

absl::StatusOr<std::unique_ptr<StepStream>> Client::OpenStep(const StepOptions& options) {
  OPTSTEP_ASSIGN_OR_RETURN(LayoutPtr layout, Layout(options.session_id));
  OPTSTEP_RETURN_IF_ERROR(CheckStep(options, *layout));
  std::unique_ptr<StepStream> stream = OpenStepCalls(options, std::move(layout));
  // A step applied through the stream is one this client saw (StepRecovery::Note).
  stream->OnApplied([this, id = options.session_id, trainer = options.trainer_id](uint64_t step) {
    recovery_.Note(id, trainer, step);
  });
  return stream;
}

absl::StatusOr<StepReply> Client::StepWithLayout(const StepOptions& options, LayoutPtr layout,
                                                 absl::Span<const GradientSlice> gradients,
                                                 const ParamDestinations& into) {
  OPTSTEP_RETURN_IF_ERROR(CheckStep(options, *layout));
  // Every gradient is checked before anything is sent.
  OPTSTEP_ASSIGN_OR_RETURN(
      std::vector<RankContribution> plan,
      client_internal::PlanContributions(*layout, gradients, options_.max_chunk_bytes));
  std::unique_ptr<StepStream> stream = OpenStepCalls(options, std::move(layout));
  // A refused destination cancels the streams, which carry the header alone so far.
  for (const auto& [id, bytes] : into) OPTSTEP_RETURN_IF_ERROR(stream->WriteInto(id, bytes));
  OPTSTEP_RETURN_IF_ERROR(stream->Queue(plan));
  return stream->Finish();
}

absl::StatusOr<bool> Client::CheckHealth(absl::string_view service) {
  return CheckHealthBy(service, absl::InfiniteFuture());
}

absl::StatusOr<bool> Client::CheckHealthBy(absl::string_view service, absl::Time deadline) {
  grpc::ClientContext context;
  Prepare(context, TimeoutBy(deadline), /*wait_for_ready=*/false);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  grpc::health::v1::HealthCheckResponse response;
  absl::Status checked = FromGrpcStatus(Reach(0)->health->Check(&context, request, &response));
  if (!checked.ok() || response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    // Rank 0 may be served elsewhere now (a stand-in), or back at its own address: the other
    // ranks say which.
    if (!LookUpRankZero(deadline).ok()) {
      OPTSTEP_RETURN_IF_ERROR(checked);
      return false;
    }
    grpc::ClientContext again;
    Prepare(again, TimeoutBy(deadline), /*wait_for_ready=*/false);
    OPTSTEP_RETURN_IF_ERROR(FromGrpcStatus(Reach(0)->health->Check(&again, request, &response)));
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace optstep
