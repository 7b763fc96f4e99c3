#ifndef OPTSTEP_SERVER_ENGINE_SESSION_CONFIG_H_
#define OPTSTEP_SERVER_ENGINE_SESSION_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"

namespace optstep {

// How gradients of one step arrive (docs/design.md §3).
enum class GradientMode {
  kSharded,     // every element exactly once per step, from any trainer; used as sent
  kReplicated,  // every trainer sends everything; averaged in trainer order
};

// Which fp32 masters each rank keeps (docs/design.md §4, "Parameter storage").
enum class ParameterStorage {
  kReplicated,  // every master on every rank, all-gathered after each step
  kOwners,      // each rank only the masters it owns; trainers get each from its owner
};

// A validated session definition (server/rpc converts and validates the proto).
struct SessionConfig {
  // The identity that created the session (docs/security.md): only it (and admins) may see or
  // use the session.
  std::string owner;
  // Optional; CreateSession attaches to the owner's existing session of this name (names are
  // scoped per owner).
  std::string name;
  // Optional; CreateSessionRequest.request_id of the call that created the session: a retry of
  // that call (same owner and request_id) answers this session instead of creating another.
  std::string request_id;
  // Canonical serialisation of the definition: two CreateSession calls with the same name attach
  // only when these are equal.
  std::string definition_key;
  std::vector<ParamInfo> params;
  ChainConfig chain;
  int num_trainers = 1;
  GradientMode mode = GradientMode::kSharded;
  ParameterStorage storage = ParameterStorage::kReplicated;
  absl::Duration step_deadline = absl::ZeroDuration();  // zero: the engine's default
};

// REPLICATED with several trainers: each parameter's gradients are summed into one buffer in
// trainer order (TrainerOrder), then divided by the number of trainers.
inline bool SumsInTrainerOrder(const SessionConfig& config) {
  return config.mode == GradientMode::kReplicated && config.num_trainers > 1;
}

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SESSION_CONFIG_H_
