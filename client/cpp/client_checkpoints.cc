// The Client's checkpoint and state-dict calls (client.h): each goes to rank 0 where it is
// served now (Client::OnRankZero), as the session calls do.

#include <grpcpp/client_context.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/client_rank.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "wire/grpc_status.h"
#include "wire/stream_end.h"

namespace optstep {

namespace {

absl::StatusOr<v1::CheckpointProgress> DrainProgress(
    grpc::ClientContext& context, grpc::ClientReader<v1::CheckpointProgress>& reader,
    const Client::CheckpointProgressFn& progress) {
  v1::CheckpointProgress last;
  v1::CheckpointProgress report;
  while (reader.Read(&report)) {
    last = report;
    if (progress) progress(report);
  }
  OPTSTEP_RETURN_IF_ERROR(FromGrpcStatus(reader.Finish()));
  return last;
}

}  // namespace

template <typename Start>
absl::StatusOr<v1::CheckpointProgress> Client::OnRankZeroProgress(
    Start start, const CheckpointProgressFn& progress) {
  v1::CheckpointProgress last;
  OPTSTEP_RETURN_IF_ERROR(OnRankZero([&](Rank& rank) -> absl::Status {
    grpc::ClientContext context;
    Prepare(context, options_.stream_timeout, options_.wait_for_ready);
    auto stub = v1::CheckpointService::NewStub(rank.channel);
    auto reader = start(*stub, &context);
    OPTSTEP_ASSIGN_OR_RETURN(last, DrainProgress(context, *reader, progress));
    return absl::OkStatus();
  }));
  return last;
}

absl::StatusOr<v1::CheckpointProgress> Client::Save(absl::string_view session_id,
                                                    absl::string_view name,
                                                    const CheckpointProgressFn& progress) {
  v1::SaveRequest request;
  request.set_session_id(std::string(session_id));
  request.set_name(std::string(name));
  return OnRankZeroProgress(
      [&](v1::CheckpointService::Stub& stub, grpc::ClientContext* context) {
        return stub.Save(context, request);
      },
      progress);
}

absl::StatusOr<v1::CheckpointProgress> Client::Load(absl::string_view session_id,
                                                    absl::string_view name,
                                                    const CheckpointProgressFn& progress) {
  v1::LoadRequest request;
  request.set_session_id(std::string(session_id));
  request.set_name(std::string(name));
  OPTSTEP_ASSIGN_OR_RETURN(
      v1::CheckpointProgress last,
      OnRankZeroProgress([&](v1::CheckpointService::Stub& stub,
                             grpc::ClientContext* context) { return stub.Load(context, request); },
                         progress));
  StateReplaced(session_id, last.step());
  absl::MutexLock lock(&mu_);
  layouts_.erase(std::string(session_id));  // counters changed; the layout may be asked again
  return last;
}

absl::StatusOr<std::vector<Client::StateDictEntry>> Client::ExportStateDict(
    const v1::ExportStateDictRequest& request) {
  std::vector<StateDictEntry> entries;
  OPTSTEP_RETURN_IF_ERROR(
      OnRankZero([&](Rank& rank) { return ReadStateDict(rank, request, entries); }));
  return entries;
}

absl::Status Client::ReadStateDict(Rank& rank, const v1::ExportStateDictRequest& request,
                                   std::vector<StateDictEntry>& entries) {
  grpc::ClientContext context;
  Prepare(context, options_.stream_timeout, options_.wait_for_ready);
  auto reader = v1::CheckpointService::NewStub(rank.channel)->ExportStateDict(&context, request);
  entries.clear();
  v1::StateDictChunk chunk;
  while (reader->Read(&chunk)) {
    if (entries.empty() || entries.back().key != chunk.key() ||
        entries.back().chunk_key != chunk.chunk_key() ||
        entries.back().sub_optimizer != chunk.sub_optimizer()) {
      StateDictEntry entry;
      entry.sub_optimizer = chunk.sub_optimizer();
      entry.chunk_key = chunk.chunk_key();
      entry.key = chunk.key();
      entry.dtype = chunk.dtype();
      entry.shape.assign(chunk.shape().begin(), chunk.shape().end());
      entries.push_back(std::move(entry));
    }
    entries.back().bytes += chunk.data();  // chunks of a tensor arrive in order
  }
  return FromGrpcStatus(reader->Finish());
}

absl::Status Client::ImportStateDict(absl::string_view session_id,
                                     absl::Span<const StateDictEntry> entries) {
  v1::ImportStateDictResponse response;
  OPTSTEP_RETURN_IF_ERROR(
      OnRankZero([&](Rank& rank) { return WriteStateDict(rank, session_id, entries, &response); }));
  if (response.has_step()) {
    StateReplaced(session_id, response.step());
  } else {
    // A server of an earlier release. The import stands even if its step cannot be read now
    // (rank 0 away for a moment).
    const absl::StatusOr<v1::SessionInfo> info = GetSession(session_id);
    if (info.ok()) StateReplaced(session_id, info->step());
  }
  return absl::OkStatus();
}

absl::Status Client::WriteStateDict(Rank& rank, absl::string_view session_id,
                                    absl::Span<const StateDictEntry> entries,
                                    v1::ImportStateDictResponse* response) {
  grpc::ClientContext context;
  Prepare(context, options_.stream_timeout, options_.wait_for_ready);
  auto writer = v1::CheckpointService::NewStub(rank.channel)->ImportStateDict(&context, response);
  v1::StateDictChunk chunk;
  bool first = true;
  bool open = true;
  StreamTally tally;
  for (const StateDictEntry& entry : entries) {
    if (!open) break;
    const size_t element = entry.dtype == v1::DTYPE_INT64 ? 8 : 4;
    const size_t piece = options_.max_chunk_bytes / element * element;
    for (size_t offset = 0; offset == 0 || offset < entry.bytes.size(); offset += piece) {
      chunk.Clear();
      if (first) chunk.set_session_id(std::string(session_id));
      first = false;
      chunk.set_key(entry.key);
      chunk.set_chunk_key(entry.chunk_key);
      chunk.set_sub_optimizer(entry.sub_optimizer);
      for (uint64_t d : entry.shape) chunk.add_shape(d);
      chunk.set_offset(offset / element);
      chunk.set_dtype(entry.dtype);
      chunk.set_data(entry.bytes.substr(offset, piece));
      tally.Add(chunk.data());
      if (!(open = writer->Write(chunk))) break;  // Finish() tells why
    }
  }
  // The final message: the server applies the dict only once it arrived and agrees.
  if (open) {
    chunk.Clear();
    if (first) chunk.set_session_id(std::string(session_id));
    *chunk.mutable_end() = tally.End(entries.size());
    writer->Write(chunk);
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

}  // namespace optstep
