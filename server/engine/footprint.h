#ifndef OPTSTEP_SERVER_ENGINE_FOOTPRINT_H_
#define OPTSTEP_SERVER_ENGINE_FOOTPRINT_H_

// What a session's replica costs one rank in memory, computed from its definition before anything
// is allocated: what admission control (memory_budget.h) counts.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "server/engine/session_config.h"

namespace optstep {

// Host bytes a replica holds per parameter beside its tensors' contents: the definition and its
// copies, the tensor objects and their allocations' alignment, the per-parameter records of
// steps, contributions and readiness. Measured (about 1,200 bytes per tiny parameter:
// tests/server/engine/footprint_test.cc, docs/security.md "Limits") and rounded up.
inline constexpr int64_t kParamOverheadBytes = 1536;
// Copies of a parameter's name a replica keeps (the definition, its key, the names of the state
// dict): a long name costs this many times its length.
inline constexpr int64_t kParamNameCopies = 4;
// Host bytes of what one trainer sent of one owned parameter in a step, kept per trainer when
// several trainers each send the whole gradient (REPLICATED; StepContributions): the range map
// and its slot. Measured (tests/server/engine/footprint_test.cc) and rounded up.
inline constexpr int64_t kTrainerParamRecordBytes = 256;
// Host bytes of one session whatever its size: its threads' stacks in use, its records, its
// communicator.
inline constexpr int64_t kSessionOverheadBytes = 256 << 10;

// The bytes of one replica on one rank, by kind (docs/security.md "Limits").
struct SessionFootprint {
  // The fp32 masters the rank holds: every parameter's (REPLICATED storage) or its owned ones'
  // (OWNERS).
  int64_t masters = 0;
  int64_t state = 0;      // the optimizer state of the parameters this rank owns
  int64_t gradients = 0;  // one fp32 gradient buffer per owned parameter
  int64_t overhead = 0;   // per-parameter and per-session host bytes; the ranks' vote buffer
  int64_t workspace = 0;  // the optimizers' scratch, sized by the largest matrix of each group
  // State redundancy (shadow_state.h): the shadow of the predecessor rank's owned masters, their
  // optimizer state and gradient buffers; 0 without it.
  int64_t shadow = 0;

  int64_t total() const;
  // The part allocated on the device: every field but the host bytes of `overhead`.
  int64_t device_bytes() const { return total() - host_bytes; }
  int64_t host_bytes = 0;  // the host part of `overhead`
  // "masters M, optimizer state S, gradients G, overhead O, workspace W" (", shadow H" when H
  // is not 0).
  std::string Breakdown() const;
};

// The footprint of `config`'s replica on `rank` under `layout`: what the replica holds at most
// once every step has run (every branch of every optimizer). Sums saturate at 2^62.
// INVALID_ARGUMENT as the replica's creation for invalid chains or parameters. With
// `state_redundancy` and several ranks, the shadow of the predecessor's owned part too.
absl::StatusOr<SessionFootprint> ComputeFootprint(const SessionConfig& config, const Layout& layout,
                                                  int rank, bool state_redundancy = false);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_FOOTPRINT_H_
