#include "bench/in_process_ranks.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/comm/communicator.h"

namespace optstep {
namespace bench {

absl::StatusOr<std::vector<InProcessRank>> StartInProcessRanks(
    const InProcessRankOptions& options, std::shared_ptr<KeyValueStore> store) {
  const int world = options.world_size;
  std::vector<InProcessRank> ranks(world);
  for (int r = 0; r < world; ++r) {
    EngineOptions engine;
    engine.rank = r;
    engine.world_size = world;
    engine.max_params_per_session = 1 << 20;
    engine.step_observer = options.observer;
    engine.state_redundancy = options.state_redundancy;
    if (world > 1) {
      engine.make_communicator = [store, r, world](const std::string& session_id) {
        CommunicatorOptions comm;
        comm.kind = "gloo";
        comm.rank = r;
        comm.world_size = world;
        comm.prefix = session_id;
        comm.store = store;
        return CreateCommunicator(comm);
      };
    }
    absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(engine);
    if (!created.ok()) return created.status();
    ranks[r].engine = *std::move(created);
    RankGroupOptions group;
    group.rank = r;
    group.world_size = world;
    group.checkpoint_root = options.checkpoint_root;
    ranks[r].group = std::make_unique<RankGroup>(group, ranks[r].engine.get());
    ServerOptions server;
    server.host = "127.0.0.1";
    server.stream_window_bytes = options.stream_window_bytes;
    absl::StatusOr<std::unique_ptr<Server>> started =
        Server::Start(server, ranks[r].engine.get(), ranks[r].group.get());
    if (!started.ok()) return started.status();
    ranks[r].server = *std::move(started);
    ranks[r].address = absl::StrCat("127.0.0.1:", ranks[r].server->port());
  }
  std::vector<std::thread> joins;
  std::vector<absl::Status> joined(world);
  for (int r = 0; r < world; ++r) {
    joins.emplace_back([&, r] { joined[r] = ranks[r].group->Join(ranks[r].address, store); });
  }
  for (std::thread& t : joins) t.join();
  for (int r = 0; r < world; ++r) {
    if (!joined[r].ok()) return joined[r];
    ranks[r].server->SetReady(true);
  }
  return ranks;
}

}  // namespace bench
}  // namespace optstep
