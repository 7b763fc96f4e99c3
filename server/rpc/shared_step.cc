#include "server/rpc/shared_step.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "wire/chunk.h"

namespace optstep {

absl::StatusOr<bool> SharedStepIo::AddGradients(Session& session, const StepHandle& c,
                                                std::function<void(absl::Status)> added,
                                                const std::function<absl::Status()>& before_wait) {
  constexpr int64_t kChunkElements = kMaxChunkBytes / 4;
  const SharedSegment& s = *segment_;
  while (next_entry_ < s.params.size()) {
    const int64_t numel = s.numels[next_entry_];
    const int64_t offset = next_offset_;
    const int64_t count = std::min(kChunkElements, numel - offset);
    const absl::string_view piece(s.gradient(next_entry_) + offset * 4,
                                  static_cast<size_t>(count) * 4);
    const int param = s.params[next_entry_];
    if (before_wait && session.WouldWait(c, param)) {
      const absl::Status ready = before_wait();
      if (!ready.ok()) return ready;
    }
    next_offset_ += count;
    if (next_offset_ == numel) {
      ++next_entry_;
      next_offset_ = 0;
    }
    auto fate = session.AddGradient(c, param, offset, DType::kF32, absl::MakeConstSpan(&piece, 1),
                                    segment_, added);
    if (!fate.ok()) return fate.status();
    if (*fate == Session::ChunkFate::kWaiting) return false;
  }
  return true;
}

absl::StatusOr<bool> SharedStepIo::WriteParams(const ParamSnapshot& params,
                                               const std::vector<uint32_t>& ids,
                                               std::function<void()> wake) {
  const std::vector<int>& owned = segment_->params;
  if (!writing_) {
    writing_ = true;
    to_write_.assign(owned.size(), false);
    for (uint32_t id : ids) {
      auto it = std::lower_bound(owned.begin(), owned.end(), static_cast<int>(id));
      if (it == owned.end() || *it != static_cast<int>(id)) {
        return absl::InternalError(
            absl::StrCat("param_id ", id, " is not in shared_memory_segment ", segment_->id));
      }
      const size_t entry = static_cast<size_t>(it - owned.begin());
      if (!to_write_[entry]) ++left_to_write_;
      to_write_[entry] = true;
    }
  }
  if (params.readiness == nullptr) {  // every value is there
    for (size_t e = 0; e < owned.size() && left_to_write_ > 0; ++e) {
      if (to_write_[e]) OPTSTEP_RETURN_IF_ERROR(WriteOne(params, owned[e]));
    }
    return true;
  }
  while (left_to_write_ > 0) {
    absl::StatusOr<std::optional<int>> ready = params.readiness->Get(next_ready_, wake);
    if (!ready.ok()) return ready.status();
    if (!ready->has_value()) return false;
    ++next_ready_;
    OPTSTEP_RETURN_IF_ERROR(WriteOne(params, **ready));
  }
  // The result goes out once the step ended on this rank too (ParamReadiness::End).
  return params.readiness->Ended(std::move(wake));
}

absl::Status SharedStepIo::WriteOne(const ParamSnapshot& params, int id) {
  const std::vector<int>& owned = segment_->params;
  auto it = std::lower_bound(owned.begin(), owned.end(), id);
  if (it == owned.end() || *it != id) return absl::OkStatus();  // gathered, not this rank's
  const size_t entry = static_cast<size_t>(it - owned.begin());
  if (!to_write_[entry]) return absl::OkStatus();
  const std::string& value = params.values[id];
  if (value.size() != static_cast<size_t>(segment_->numels[entry]) * 4) {
    return absl::InternalError(absl::StrCat("no fp32 value of param_id ", id,
                                            " for shared_memory_segment ", segment_->id));
  }
  std::memcpy(segment_->value(entry), value.data(), value.size());
  bytes_written_ += static_cast<int64_t>(value.size());
  to_write_[entry] = false;
  --left_to_write_;
  return absl::OkStatus();
}

}  // namespace optstep
