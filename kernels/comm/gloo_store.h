#ifndef OPTSTEP_KERNELS_COMM_GLOO_STORE_H_
#define OPTSTEP_KERNELS_COMM_GLOO_STORE_H_

// Gloo's rendezvous store interface over our KeyValueStore. Internal to GlooCommunicator.

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/comm/key_value_store.h"

namespace optstep {
namespace internal {

// What GlooStore throws when the KeyValueStore answers an error: gloo's Store interface has no
// other way to report one. Caught where GlooCommunicator calls into gloo (gloo_status.h).
class GlooStoreError : public std::runtime_error {
 public:
  explicit GlooStoreError(absl::Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// gloo::rendezvous::Store over `store`: gloo's key k becomes "<prefix>/gloo/<k>". Every wait
// ends by `deadline` (so that the keys of one rendezvous take no longer than the communicator's
// timeout however many gloo waits for); gloo's own timeout, its context's, bounds its
// connections only. Errors and timeouts are thrown as GlooStoreError (DEADLINE_EXCEEDED for a key
// that was not set in time). Thread-compatible: gloo uses it from the thread that connects the
// context.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<KeyValueStore> store, const std::string& prefix, absl::Time deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Blocks until every key of `keys` is set.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // The value of `key`, waiting until `deadline`; remembered, so that gloo's get() after its
  // wait() asks the store once.
  const std::string& Fetch(const std::string& key, absl::Time deadline);

  const std::shared_ptr<KeyValueStore> store_;
  const std::string prefix_;
  const absl::Time deadline_;
  absl::flat_hash_map<std::string, std::string> fetched_;
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_GLOO_STORE_H_
