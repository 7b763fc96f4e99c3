#ifndef OPTSTEP_KERNELS_COMM_KEY_VALUE_STORE_H_
#define OPTSTEP_KERNELS_COMM_KEY_VALUE_STORE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace optstep {

// The rendezvous store through which communicators exchange their connection details (Gloo's
// store entries, the NCCL unique id). In a deployment it is the key-value RPC served by rank 0
// (server/rpc/rendezvous_*); tests use InMemoryKeyValueStore (threads) or FileKeyValueStore
// (processes). Implementations are thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Sets `key` (overwrites).
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set and answers its value. DEADLINE_EXCEEDED after `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

// A store shared by the threads of one process.
std::shared_ptr<KeyValueStore> NewInMemoryKeyValueStore();

// A store in a directory shared by processes on one machine (one file per key, written
// atomically by rename).
std::shared_ptr<KeyValueStore> NewFileKeyValueStore(const std::string& directory);

// `inner`, whose Get gives up before its timeout once `abandon` answers an error, and answers
// that error with the key named: a communicator's rendezvous waits for no rank known to be lost
// (RankGroup's liveness). `abandon` is asked every `poll` while a Get waits, never before the
// first look at the key; it must be thread-safe.
std::shared_ptr<KeyValueStore> NewAbandoningKeyValueStore(
    std::shared_ptr<KeyValueStore> inner, std::function<absl::Status()> abandon,
    absl::Duration poll = absl::Milliseconds(200));

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_KEY_VALUE_STORE_H_
