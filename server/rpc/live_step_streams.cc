#include "server/rpc/live_step_streams.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optstep {

absl::Status LiveStepStreams::Add(const std::shared_ptr<Stream>& stream, std::string caller) {
  absl::MutexLock lock(&mu_);
  if (ended_) return absl::UnavailableError(*ended_);
  auto counted = headerless_.find(caller);
  const int headerless = counted == headerless_.end() ? 0 : counted->second;
  if (headerless >= max_headerless_per_caller_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "step stream: ", caller, " has ", headerless,
        " Step streams open on this rank that sent no StepHeader yet, the most one caller may "
        "(--max_headerless_step_streams); send the header first"));
  }
  ++headerless_[caller];
  open_.insert_or_assign(stream.get(), Open{stream, std::move(caller)});
  return absl::OkStatus();
}

void LiveStepStreams::NamedLocked(Open& open) {
  if (open.headerless_caller.empty()) return;
  auto it = headerless_.find(open.headerless_caller);
  if (--it->second == 0) headerless_.erase(it);
  open.headerless_caller.clear();
}

void LiveStepStreams::Named(const Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(stream);
  if (it != open_.end()) NamedLocked(it->second);
}

void LiveStepStreams::Remove(const Stream* stream) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(stream);
  if (it == open_.end()) return;
  NamedLocked(it->second);
  open_.erase(it);
}

int LiveStepStreams::headerless(absl::string_view caller) const {
  absl::MutexLock lock(&mu_);
  auto it = headerless_.find(caller);
  return it == headerless_.end() ? 0 : it->second;
}

int LiveStepStreams::EndAll(absl::string_view why) {
  std::vector<std::shared_ptr<Stream>> open;
  {
    absl::MutexLock lock(&mu_);
    ended_ = std::string(why);
    for (const auto& entry : open_) {
      if (std::shared_ptr<Stream> stream = entry.second.stream.lock()) {
        open.push_back(std::move(stream));
      }
    }
  }
  // Without the registry's lock: a stream that ends removes itself.
  int ended = 0;
  for (const std::shared_ptr<Stream>& stream : open) ended += stream->EndUnavailable(why) ? 1 : 0;
  return ended;
}

}  // namespace optstep
