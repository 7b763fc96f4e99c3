#include "server/rpc/stream_charges.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::shared_ptr<const void>> HoldCopy(Engine& engine, HeadroomPlaces& places,
                                                     const std::string& owner, int64_t bytes,
                                                     absl::string_view asker,
                                                     absl::string_view detail) {
  std::shared_ptr<const void> place =
      places.TryTake(owner, [&] { return engine.TryTakeHeadroom(bytes, owner); });
  if (place != nullptr) return place;
  OPTSTEP_ASSIGN_OR_RETURN(MemoryBudget::Reservation reserved,
                           engine.ReserveMemory(bytes, asker, detail, owner));
  return std::shared_ptr<const void>(
      std::make_shared<MemoryBudget::Reservation>(std::move(reserved)));
}

StagingCharge::StagingCharge(Engine& engine, HeadroomPlaces& places, std::string owner,
                             uint64_t most, std::string what, std::string detail)
    : engine_(&engine),
      owner_(std::move(owner)),
      what_(std::move(what)),
      detail_(std::move(detail)) {
  const auto bytes = static_cast<int64_t>(std::min<uint64_t>(most, INT64_MAX));
  place_ = places.TryTake(owner_, [&] { return engine.TryTakeHeadroom(bytes, owner_); });
  charged_ = place_ == nullptr;
}

absl::Status StagingCharge::Grow(uint64_t bytes) {
  if (!charged_) return absl::OkStatus();
  staged_ += static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX - staged_));
  const int64_t short_by = staged_ - reserved_;
  if (short_by <= 0) return absl::OkStatus();
  const int64_t block = std::max(short_by, kBlock);
  OPTSTEP_ASSIGN_OR_RETURN(MemoryBudget::Reservation reserved,
                           engine_->ReserveMemory(block, what_, detail_, owner_));
  reserved_ += block;
  reservations_.push_back(std::move(reserved));
  return absl::OkStatus();
}

void StagingCharge::Release() {
  reservations_.clear();
  place_.reset();
  charged_ = false;
  staged_ = reserved_ = 0;
}

}  // namespace optstep
