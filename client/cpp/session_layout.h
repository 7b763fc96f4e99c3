#ifndef OPTSTEP_CLIENT_CPP_SESSION_LAYOUT_H_
#define OPTSTEP_CLIENT_CPP_SESSION_LAYOUT_H_

// What the client needs to know about a session to route and check tensors: each parameter's
// name, element count and owner rank, and where the masters live. Built once from a SessionInfo,
// then immutable (and so safe to share between threads).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "optstep/v1/session.pb.h"

namespace optstep {
namespace client_internal {

class SessionLayout final {
 public:
  struct Param {
    std::string name;
    uint64_t num_elements = 0;
    uint32_t owner = 0;
  };

  // INTERNAL when `info` is inconsistent (it comes from the server): a zero dimension, an
  // element count that overflows, an owner list of the wrong length or an owner >= world size.
  // A layout with world_size 0 and no owners (a server that does not partition) means one rank.
  static absl::StatusOr<SessionLayout> FromSessionInfo(const v1::SessionInfo& info);

  // For tests: parameters given directly. REQUIRES: every owner < world_size.
  SessionLayout(std::string session_id, uint32_t world_size, std::vector<Param> params,
                bool owners_only = false, bool returns_owned = false);

  const std::string& session_id() const { return session_id_; }
  uint32_t world_size() const { return world_size_; }
  uint32_t num_params() const { return static_cast<uint32_t>(params_.size()); }
  // OWNERS storage: each rank holds (and returns) only the parameters it owns.
  bool owners_only() const { return owners_only_; }
  // The ranks honour StepHeader.return_owned (Layout.returns_owned).
  bool returns_owned() const { return returns_owned_; }
  // Whether rank `rank` streams parameters back to trainer `trainer_id`: every rank (its own
  // parameters) where the ranks honour return_owned or hold only their own (OWNERS); else the
  // trainer's home rank, trainer_id % world_size (all of them).
  bool ReturnsFrom(uint32_t rank, uint32_t trainer_id) const {
    return owners_only_ || returns_owned_ || rank == trainer_id % world_size_;
  }
  // The ranks that own any of `param_ids` (empty: every parameter), ascending.
  // REQUIRES: every id < num_params().
  std::vector<uint32_t> OwnersOf(absl::Span<const uint32_t> param_ids) const;
  // REQUIRES: param_id < num_params().
  const Param& param(uint32_t param_id) const { return params_[param_id]; }

  // NOT_FOUND, naming the session and its parameter count, unless param_id < num_params().
  absl::Status CheckParamId(uint32_t param_id) const;

 private:
  std::string session_id_;
  uint32_t world_size_;
  std::vector<Param> params_;
  bool owners_only_;
  bool returns_owned_;
};

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_SESSION_LAYOUT_H_
