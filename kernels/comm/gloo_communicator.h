#ifndef OPTSTEP_KERNELS_COMM_GLOO_COMMUNICATOR_H_
#define OPTSTEP_KERNELS_COMM_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/comm/communicator.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace optstep {

// Collectives over TCP between host-memory buffers, with Gloo (kind "gloo", world_size >= 2;
// CreateCommunicator answers a LocalCommunicator for world_size 1). Each communicator owns
// its own Gloo TCP device: one listening socket on options.hostname (ephemeral port), one
// connection to every other rank and one event-loop thread. No Gloo header or handle leaves
// this class, and nothing it calls throws out of it.
//
// Errors: every collective first validates its arguments (INVALID_ARGUMENT; nothing is sent
// and the communicator stays usable, but the other ranks then wait for this one until their
// timeout). A collective that does not complete within options.timeout answers
// DEADLINE_EXCEEDED; a lost or failed peer connection answers UNAVAILABLE. After either, the
// communicator is broken: it closes its connections (so that the other ranks fail promptly
// too, instead of waiting for their timeout) and every later call answers UNAVAILABLE at once.
// Create a new group (with a new store prefix) to recover.
//
// SIGPIPE: Gloo writes to its sockets without MSG_NOSIGNAL, so Create sets SIGPIPE
// to ignored for the whole process (unless the process installed a handler of its own);
// otherwise a peer that died mid-transfer would kill this process.
//
// Thread-compatible: one thread at a time (the engine's device worker). The communicator may
// be destroyed from any thread; destroying it closes its connections, which the other ranks
// see as a lost peer.
class GlooCommunicator final : public Communicator {
 public:
  // Rendezvous through options.store under "<options.prefix>/gloo/...", then connects to every
  // other rank; blocks until all world_size ranks have joined. The prefix must be new for each
  // group created (keys are never deleted: a group re-created under an old prefix would read
  // the previous group's addresses). Rendezvous and connection together take at most about
  // options.timeout. Codes: INVALID_ARGUMENT (options), DEADLINE_EXCEEDED (some rank did not
  // join in time), UNAVAILABLE (the TCP device cannot be opened on options.hostname, the store
  // failed, or a connection failed).
  // REQUIRES: options.world_size >= 2 (checked: INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const CommunicatorOptions& options);

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(int rank, int world_size, std::string prefix, std::chrono::milliseconds timeout,
                   std::shared_ptr<gloo::Context> context);

  // UNAVAILABLE once broken.
  absl::Status CheckUsable() const;
  // Runs `fn` (which calls Gloo) and translates what it throws; marks the communicator broken
  // on any error.
  absl::Status Run(absl::string_view op, absl::FunctionRef<void()> fn);
  // "gloo communicator 'prefix' rank 1 of 3"
  std::string Describe() const;

  const int rank_;
  const int world_size_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  // OK until the first communication error, then that error.
  absl::Status broken_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_GLOO_COMMUNICATOR_H_
