#include "kernels/comm/gloo_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstep {
namespace internal {

GlooStore::GlooStore(std::shared_ptr<KeyValueStore> store, const std::string& prefix,
                     absl::Time deadline)
    : store_(std::move(store)), prefix_(absl::StrCat(prefix, "/gloo/")), deadline_(deadline) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(prefix_ + key, std::string(data.begin(), data.end()));
  if (!status.ok()) throw GlooStoreError(std::move(status));
}

std::vector<char> GlooStore::get(const std::string& key) {
  const std::string& value = Fetch(key, deadline_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) Fetch(key, deadline_);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& /*timeout*/) {
  // Gloo passes its context's timeout, which bounds its connections (CommunicatorOptions::
  // connect_timeout): a key is waited for until the deadline.
  wait(keys);
}

const std::string& GlooStore::Fetch(const std::string& key, absl::Time deadline) {
  auto it = fetched_.find(key);
  if (it != fetched_.end()) return it->second;
  absl::StatusOr<std::string> value =
      store_->Get(prefix_ + key, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (!value.ok()) throw GlooStoreError(std::move(value).status());
  return fetched_.emplace(key, *std::move(value)).first->second;
}

}  // namespace internal
}  // namespace optstep
