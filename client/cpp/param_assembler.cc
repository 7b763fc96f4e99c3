#include "client/cpp/param_assembler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace client_internal {

absl::Status ValidateParamIds(const SessionLayout& layout, absl::Span<const uint32_t> ids) {
  absl::flat_hash_set<uint32_t> seen;
  for (uint32_t id : ids) {
    OPTSTEP_RETURN_IF_ERROR(layout.CheckParamId(id));
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("param '", layout.param(id).name, "' (id ", id, ") is named twice"));
    }
  }
  return absl::OkStatus();
}

ParamAssembler::ParamAssembler(const SessionLayout& layout, DType dtype,
                               absl::Span<const uint32_t> expected)
    : layout_(layout), dtype_(dtype), expected_(expected.begin(), expected.end()) {}

absl::Status ParamAssembler::SetDestination(uint32_t param_id, absl::Span<uint8_t> bytes) {
  OPTSTEP_RETURN_IF_ERROR(layout_.CheckParamId(param_id));
  const SessionLayout::Param& param = layout_.param(param_id);
  if (!expected_.empty() && !expected_.contains(param_id)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "' (id ", param_id,
                                                   ") is not among the parameters returned"));
  }
  const uint64_t want = param.num_elements * DTypeSize(dtype_);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination of param '", param.name, "' has ", bytes.size(), " bytes, ", "expected ", want,
        " (", param.num_elements, " ", DTypeName(dtype_), " elements)"));
  }
  destinations_[param_id] = bytes;
  return absl::OkStatus();
}

absl::Status ParamAssembler::Add(uint32_t param_id, uint64_t offset, DType dtype,
                                 absl::string_view data) {
  return Add(param_id, offset, dtype, absl::MakeConstSpan(&data, 1));
}

absl::Status ParamAssembler::Add(uint32_t param_id, uint64_t offset, DType dtype,
                                 absl::Span<const absl::string_view> pieces) {
  size_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  if (param_id >= layout_.num_params()) {
    return absl::InternalError(absl::StrCat("server sent param_id ", param_id, " but session '",
                                            layout_.session_id(), "' has ", layout_.num_params(),
                                            " parameters"));
  }
  const SessionLayout::Param& param = layout_.param(param_id);
  if (!expected_.empty() && !expected_.contains(param_id)) {
    return absl::InternalError(
        absl::StrCat("server sent param '", param.name, "' (id ", param_id, "), not asked for"));
  }
  if (dtype != dtype_) {
    return absl::InternalError(absl::StrCat("server sent param '", param.name, "' as ",
                                            DTypeName(dtype), ", asked for ", DTypeName(dtype_)));
  }
  const size_t size = DTypeSize(dtype);
  const uint64_t count = bytes / size;
  if (bytes % size != 0 || offset > param.num_elements || count > param.num_elements - offset) {
    return absl::InternalError(absl::StrCat(
        "server sent param '", param.name, "' chunk of ", bytes, " bytes at element ", offset,
        ", which does not fit its ", param.num_elements, " ", DTypeName(dtype), " elements"));
  }
  Pending& pending = pending_[param_id];
  HostParameter& value = pending.value;
  if (pending.ranges.empty()) {
    auto destination = destinations_.find(param_id);
    if (destination != destinations_.end()) {
      pending.destination = destination->second;
    } else if (value.size() == 0) {
      value.param_id = param_id;
      value.dtype = dtype_;
      if (dtype_ == DType::kF32) {
        value.f32.resize(param.num_elements);
      } else {
        value.bf16.resize(param.num_elements);
      }
    }
  }
  char* base = !pending.destination.empty()
                   ? reinterpret_cast<char*>(pending.destination.data())
                   : (dtype_ == DType::kF32 ? reinterpret_cast<char*>(value.f32.data())
                                            : reinterpret_cast<char*>(value.bf16.data()));
  char* at = base + offset * size;
  for (absl::string_view piece : pieces) {
    if (piece.empty()) continue;
    std::memcpy(at, piece.data(), piece.size());
    at += piece.size();
  }
  pending.ranges.emplace_back(offset, offset + count);
  ++chunks_added_;
  const bool was_complete = pending.received >= param.num_elements;
  pending.received += count;
  if (!was_complete && pending.received >= param.num_elements && ready_) ready_(param_id);
  return absl::OkStatus();
}

absl::StatusOr<HostParameterMap> ParamAssembler::Finish() {
  if (expected_.empty()) {
    for (uint32_t id = 0; id < layout_.num_params(); ++id) expected_.insert(id);
  }
  for (uint32_t id : expected_) {
    if (pending_.count(id) == 0) {
      return absl::InternalError(
          absl::StrCat("server did not send param '", layout_.param(id).name, "' (id ", id, ")"));
    }
  }
  HostParameterMap result;
  for (auto& [id, pending] : pending_) {
    const SessionLayout::Param& param = layout_.param(id);
    auto& ranges = pending.ranges;
    std::sort(ranges.begin(), ranges.end());
    uint64_t covered = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin < covered) {
        return absl::InternalError(absl::StrCat("server sent param '", param.name, "' elements [",
                                                begin, ", ", covered, ") more than once"));
      }
      if (begin > covered) break;
      covered = end;
    }
    if (covered != param.num_elements) {
      return absl::InternalError(absl::StrCat("server sent param '", param.name,
                                              "' incomplete: elements from ", covered, " of ",
                                              param.num_elements, " are missing"));
    }
    if (pending.destination.empty()) {
      result.emplace(id, std::move(pending.value));
    } else {
      ++destinations_filled_;
    }
  }
  pending_.clear();
  return result;
}

}  // namespace client_internal
}  // namespace optstep
