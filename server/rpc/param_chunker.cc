#include "server/rpc/param_chunker.h"

#include <algorithm>
#include <numeric>

#include "base/status_macros.h"
#include "wire/proto_dtype.h"
#include "wire/raw_step_codec.h"

namespace optstep {
namespace {

// gRPC releases a payload slice by deleting the snapshot reference it held.
void ReleaseSnapshot(void* arg) { delete static_cast<std::shared_ptr<const ParamSnapshot>*>(arg); }

}  // namespace

ParamChunker::ParamChunker(std::shared_ptr<const ParamSnapshot> snapshot,
                           std::vector<uint32_t> param_ids, size_t max_bytes)
    : snapshot_(std::move(snapshot)), ids_(std::move(param_ids)) {
  const size_t element = DTypeSize(snapshot_->dtype);
  max_bytes_ = std::max(element, max_bytes / element * element);
  if (ids_.empty()) {
    ids_.resize(snapshot_->values.size());
    std::iota(ids_.begin(), ids_.end(), 0u);
  }
  wanted_.assign(snapshot_->values.size(), false);
  std::vector<uint32_t> once;  // an id asked for twice goes once
  for (uint32_t id : ids_) {
    if (wanted_[id]) continue;
    wanted_[id] = true;
    once.push_back(id);
    const size_t bytes = snapshot_->values[id].size();
    num_chunks_ += std::max<uint64_t>(1, (bytes + max_bytes_ - 1) / max_bytes_);
  }
  expected_ = once.size();
  ids_ = std::move(once);
  if (snapshot_->readiness != nullptr) ids_.clear();  // filled as parameters become ready
}

absl::StatusOr<bool> ParamChunker::Refill(std::function<void()> wake) {
  const size_t before = ids_.size();
  while (true) {
    absl::StatusOr<std::optional<int>> next = snapshot_->readiness->Get(ready_seen_, wake);
    if (!next.ok()) return next.status();
    if (!next->has_value()) break;
    ++ready_seen_;
    if (wanted_[**next]) ids_.push_back(static_cast<uint32_t>(**next));
  }
  return ids_.size() > before;
}

bool ParamChunker::NextRange(Range& range) {
  if (index_ >= ids_.size()) return false;
  range.param_id = ids_[index_];
  const size_t size = snapshot_->values[range.param_id].size();
  range.byte_offset = byte_offset_;
  range.bytes = std::min(max_bytes_, size - byte_offset_);
  byte_offset_ += range.bytes;
  if (byte_offset_ >= size) {
    ++index_;
    byte_offset_ = 0;
  }
  return true;
}

absl::Status ParamChunker::CheckHeld() const {
  return snapshot_->hold == nullptr ? absl::OkStatus() : snapshot_->hold->Check();
}

bool ParamChunker::Next(v1::TensorChunk* chunk) {
  // A cached snapshot that a step streamed is complete: its readiness lists every parameter.
  if (index_ >= ids_.size() && snapshot_->readiness != nullptr && ids_.size() < expected_) {
    absl::StatusOr<bool> more = Refill(nullptr);
    if (!more.ok() || !*more) return false;
  }
  Range range;
  if (!NextRange(range)) return false;
  chunk->set_param_id(range.param_id);
  chunk->set_offset(range.byte_offset / DTypeSize(snapshot_->dtype));
  chunk->set_dtype(DTypeToProto(snapshot_->dtype));
  chunk->set_data(snapshot_->values[range.param_id].data() + range.byte_offset, range.bytes);
  return true;
}

absl::StatusOr<ParamChunker::Progress> ParamChunker::NextStepResponse(grpc::ByteBuffer* message,
                                                                      size_t* payload_bytes,
                                                                      std::function<void()> wake) {
  OPTSTEP_RETURN_IF_ERROR(CheckHeld());
  if (index_ >= ids_.size() && snapshot_->readiness != nullptr && ids_.size() < expected_) {
    absl::StatusOr<bool> more = Refill(wake);
    if (!more.ok()) return more.status();
    if (!*more) return Progress::kWaiting;
  }
  Range range;
  if (!NextRange(range)) {
    // Every parameter is out; the stream ends once the step ended on this rank too
    // (ParamReadiness::End).
    if (snapshot_->readiness == nullptr) return Progress::kDone;
    absl::StatusOr<bool> ended = snapshot_->readiness->Ended(std::move(wake));
    if (!ended.ok()) return ended.status();
    return *ended ? Progress::kDone : Progress::kWaiting;
  }
  const std::string& bytes = snapshot_->values[range.param_id];
  *message =
      EncodeParameterChunk(range.param_id, range.byte_offset / DTypeSize(snapshot_->dtype),
                           DTypeToProto(snapshot_->dtype),
                           absl::string_view(bytes.data() + range.byte_offset, range.bytes),
                           &ReleaseSnapshot, new std::shared_ptr<const ParamSnapshot>(snapshot_));
  *payload_bytes = range.bytes;
  return Progress::kChunk;
}

}  // namespace optstep
