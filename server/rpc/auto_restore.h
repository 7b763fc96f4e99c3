#ifndef OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_
#define OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// A session recreated from its automatic checkpoints.
struct RestoredSession {
  std::string session_id;
  uint64_t step = 0;
  std::string from;  // the checkpoint's name, "auto/<session id>/step-<N>"
};

// Rank 0, once the group formed and before it serves (docs/checkpoints.md, "Automatic
// restore"): every session with automatic checkpoints under `checkpoint_root` is recreated on
// every rank with its id, name, owner and definition, and loaded from its newest complete
// automatic checkpoint that loads (newest: of the highest step, "step-<N>", whatever the times
// of its files; an older one when the newest is damaged), also onto another number of ranks.
// First the temporaries of interrupted automatic saves in which nothing changed for
// `temp_max_age` are removed (zero: none are). A session that cannot be restored is logged
// (event=session_restore_failed) and left out; its checkpoints stay. Each session restored is
// logged as event=session_restored. Blocks; answers the sessions restored. A rank lost meanwhile
// (a restore or load failed for a passing reason, and a peer no longer answers) ends the restore
// with UNAVAILABLE naming it, before older checkpoints are tried or sessions left out: the group
// must restart and restore every session again, for a rank healed into a group without them
// would never get them.
// `before_load` (testing only; may be null) is called with each session's id once it is recreated
// on every rank, before its checkpoint loads.
absl::StatusOr<std::vector<RestoredSession>> RestoreAutoCheckpoints(
    const std::string& checkpoint_root, absl::Duration temp_max_age, RankGroup* group,
    const std::function<void(const std::string& session_id)>& before_load = nullptr);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_
