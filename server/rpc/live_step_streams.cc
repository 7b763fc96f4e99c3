#include "server/rpc/live_step_streams.h"

#include <vector>

namespace optstep {

std::optional<std::string> LiveStepStreams::Add(const std::shared_ptr<Stream>& stream) {
  absl::MutexLock lock(&mu_);
  if (ended_) return ended_;
  open_.insert_or_assign(stream.get(), stream);
  return std::nullopt;
}

void LiveStepStreams::Remove(const Stream* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

int LiveStepStreams::EndAll(absl::string_view why) {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = std::string(why);
    for (const auto& entry : open_) {
      if (std::shared_ptr<Stream> stream = entry.second.lock()) open.push_back(std::move(stream));
    }
  }
  // Without the registry's lock: a stream that ends removes itself.
  int ended = 0;
  for (const std::shared_ptr<Stream>& stream : open) ended += stream->EndUnavailable(why) ? 1 : 0;
  return ended;
}

}  // namespace optstep
