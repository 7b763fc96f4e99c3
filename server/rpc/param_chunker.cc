#include "server/rpc/param_chunker.h"

#include <algorithm>
#include <numeric>

#include "server/rpc/convert.h"

namespace optstep {

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

bool ParamChunker::Next(v1::TensorChunk* chunk) {
  if (index_ >= ids_.size()) return false;
  const uint32_t id = ids_[index_];
  const std::string& bytes = snapshot_->values[id];
  const size_t n = std::min(max_bytes_, bytes.size() - byte_offset_);
  chunk->set_param_id(id);
  chunk->set_offset(byte_offset_ / DTypeSize(snapshot_->dtype));
  chunk->set_dtype(DTypeToProto(snapshot_->dtype));
  chunk->set_data(bytes.data() + byte_offset_, n);
  byte_offset_ += n;
  if (byte_offset_ >= bytes.size()) {
    ++index_;
    byte_offset_ = 0;
  }
  return true;
}

}  // namespace optstep
