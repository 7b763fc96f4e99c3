#include "server/rpc/param_chunker.h"

#include <algorithm>
#include <numeric>

#include "server/rpc/convert.h"
#include "server/rpc/raw_step_codec.h"

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
  for (uint32_t id : ids_) {
    const size_t bytes = snapshot_->values[id].size();
    num_chunks_ += std::max<uint64_t>(1, (bytes + max_bytes_ - 1) / max_bytes_);
  }
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

bool ParamChunker::Next(v1::TensorChunk* chunk) {
  Range range;
  if (!NextRange(range)) return false;
  chunk->set_param_id(range.param_id);
  chunk->set_offset(range.byte_offset / DTypeSize(snapshot_->dtype));
  chunk->set_dtype(DTypeToProto(snapshot_->dtype));
  chunk->set_data(snapshot_->values[range.param_id].data() + range.byte_offset, range.bytes);
  return true;
}

bool ParamChunker::NextStepResponse(grpc::ByteBuffer* message, size_t* payload_bytes) {
  Range range;
  if (!NextRange(range)) return false;
  const std::string& bytes = snapshot_->values[range.param_id];
  *message = EncodeParameterChunk(
      range.param_id, range.byte_offset / DTypeSize(snapshot_->dtype),
      DTypeToProto(snapshot_->dtype),
      absl::string_view(bytes.data() + range.byte_offset, range.bytes), &ReleaseSnapshot,
      new std::shared_ptr<const ParamSnapshot>(snapshot_));
  *payload_bytes = range.bytes;
  return true;
}

}  // namespace optstep
