#include "server/rpc/live_step_streams.h"

#include <vector>

namespace optstep {

void LiveStepStreams::Add(const std::shared_ptr<Stream>& stream) {
  absl::MutexLock lock(&mu_);
  open_.insert_or_assign(stream.get(), stream);
}

void LiveStepStreams::Remove(const Stream* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

int LiveStepStreams::EndAll(absl::string_view why) {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& entry : open_) {
      if (std::shared_ptr<Stream> stream = entry.second.lock()) open.push_back(std::move(stream));
    }
  }
  // Without the registry's lock: a stream that ends removes itself.
  for (const std::shared_ptr<Stream>& stream : open) stream->EndUnavailable(why);
  return static_cast<int>(open.size());
}

}  // namespace optstep
