#ifndef OPTSTEP_SERVER_RPC_STREAM_CHARGES_H_
#define OPTSTEP_SERVER_RPC_STREAM_CHARGES_H_

// What a stream holds of a session's data outside the session's footprint, held as the session
// owner's, so that an owner of many sessions or trainers, each with its streams open, cannot take
// the rank past its memory: a copy of a known size (HoldCopy: an export's state, a pull's
// message, a waiting Step stream's window) or what an upload stages until its final message
// (StagingCharge: an InitParameters stream's values, an ImportStateDict stream's tensors).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/engine.h"
#include "server/engine/memory_budget.h"
#include "server/rpc/open_streams.h"

namespace optstep {

// A place of `owner`'s (a session's owner) in the rank's headroom (`places`) while it has
// one there and `bytes` fit (MemoryBudget::TryTakeHeadroom), else the bytes from the rank's
// budget, within the owner's share; held until the last copy of the handle goes.
// RESOURCE_EXHAUSTED (Engine::ReserveMemory's, naming `asker` and `detail`) when neither holds
// them.
absl::StatusOr<std::shared_ptr<const void>> HoldCopy(Engine& engine, HeadroomPlaces& places,
                                                     const std::string& owner, int64_t bytes,
                                                     absl::string_view asker,
                                                     absl::string_view detail);

// A place of `owner`'s in the rank's headroom for the most the stream may stage
// (HeadroomPlaces), while it has one there and those bytes fit; else what it stages from the
// rank's budget, within the owner's share, taken in blocks of at least kBlock as it grows.
// Thread-compatible (one stream's reads use it). Holds nothing once released or destroyed.
class StagingCharge {
 public:
  static constexpr int64_t kBlock = int64_t{1} << 20;

  StagingCharge() = default;  // charges nothing
  // `most`: the most the stream may stage; `what` (the stream) and `detail` (what it stages)
  // name it in the budget's errors. `engine` must outlive this.
  StagingCharge(Engine& engine, HeadroomPlaces& places, std::string owner, uint64_t most,
                std::string what, std::string detail);

  StagingCharge(StagingCharge&&) = default;
  StagingCharge& operator=(StagingCharge&&) = default;

  // `bytes` more staged: OK while they fit; RESOURCE_EXHAUSTED (Engine::ReserveMemory's,
  // naming the stream) when they do not, and nothing more is taken.
  absl::Status Grow(uint64_t bytes);
  // Gives the place and the bytes back.
  void Release();

 private:
  Engine* engine_ = nullptr;
  std::string owner_;
  std::string what_;
  std::string detail_;
  std::shared_ptr<const void> place_;  // the owner's place in the headroom, if it has one
  bool charged_ = false;               // no place: the budget's
  int64_t staged_ = 0;
  int64_t reserved_ = 0;
  std::vector<MemoryBudget::Reservation> reservations_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STREAM_CHARGES_H_
