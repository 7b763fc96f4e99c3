#ifndef OPTSTEP_BENCH_IN_PROCESS_RANKS_H_
#define OPTSTEP_BENCH_IN_PROCESS_RANKS_H_

// The ranks of a group started in the benchmark's own process: each an Engine, its RankGroup and
// a gRPC Server on 127.0.0.1, joined and ready (step_bench, transport_bench). Several ranks talk
// over Gloo on loopback through `store`.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/comm/key_value_store.h"
#include "server/engine/engine.h"
#include "server/engine/step_observer.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/server.h"

namespace optstep {
namespace bench {

struct InProcessRank {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<RankGroup> group;
  std::unique_ptr<Server> server;
  std::string address;  // "127.0.0.1:<port>"
};

struct InProcessRankOptions {
  int world_size = 1;
  std::shared_ptr<StepObserver> observer;  // may be null
  bool state_redundancy = false;
  std::string checkpoint_root;  // RankGroupOptions::checkpoint_root
  int stream_window_bytes = 16 << 20;  // ServerOptions::stream_window_bytes
};

// Starts `options.world_size` ranks and joins them into one group; `store` is their rendezvous
// store (may be null for one rank). Members are declared so that the servers stop first.
absl::StatusOr<std::vector<InProcessRank>> StartInProcessRanks(
    const InProcessRankOptions& options, std::shared_ptr<KeyValueStore> store);

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_IN_PROCESS_RANKS_H_
