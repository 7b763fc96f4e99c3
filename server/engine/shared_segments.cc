#include "server/engine/shared_segments.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/random_bytes.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + SharedSegment::kAlignment - 1) / SharedSegment::kAlignment *
         SharedSegment::kAlignment;
}

std::string RandomToken() {
  std::string token(SharedSegment::kTokenBytes, '\0');
  FillRandomBytes(token.data(), token.size());
  return token;
}

// Segment ids are random, not counted: an id a client kept from a rank's earlier process never
// names a segment of the process that replaced it.
uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) FillRandomBytes(&id, sizeof(id));
  return id;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SharedSegment>> SharedSegments::Attach(
    const std::string& session_id, int trainer, const std::vector<ParamInfo>& params,
    const Layout& layout, std::optional<absl::string_view> owner) {
  {
    // The trainer's last segment goes first: its bytes come back once no step maps it.
    std::shared_ptr<const SharedSegment> last;
    absl::MutexLock lock(&mu_);
    auto it = segments_.find({session_id, trainer});
    if (it != segments_.end()) {
      last = std::move(it->second);
      RetireLocked(it->first, last);
      segments_.erase(it);
    }
  }
  auto segment = std::make_shared<SharedSegment>();
  segment->session_id = session_id;
  segment->trainer = trainer;
  int64_t span = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    if (layout.owner[p] != rank_) continue;
    segment->params.push_back(static_cast<int>(p));
    segment->numels.push_back(params[p].numel());
    segment->offsets.push_back(span);
    span += Aligned(params[p].numel() * 4);
  }
  segment->parameters_offset = segment->gradients_offset + span;
  const int64_t bytes = segment->parameters_offset + span;
  OPTSTEP_ASSIGN_OR_RETURN(
      segment->reservation,
      budget_->TryReserve(bytes, absl::StrCat("shared memory of trainer ", trainer),
                          absl::StrCat("session '", session_id, "': the gradients and values of ",
                                       segment->params.size(), " parameters"),
                          owner));
  OPTSTEP_ASSIGN_OR_RETURN(
      segment->memory,
      SharedMemory::Create(static_cast<size_t>(bytes),
                           absl::StrCat("optstep-", session_id, "-trainer-", trainer)));
  segment->token = RandomToken();
  std::memcpy(segment->memory->data(), segment->token.data(), segment->token.size());
  absl::MutexLock lock(&mu_);
  const int shared = static_cast<int>(segments_.size()) + RetiredLocked("", -1);
  if (shared >= max_segments_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", rank_, " shares ", shared, " memory segments with trainers, the most it ",
        "shares at once (--max_shared_segments); trainer ", trainer, " of session '", session_id,
        "' steps through its stream"));
  }
  segment->id = RandomId();
  std::shared_ptr<const SharedSegment> attached = std::move(segment);
  segments_[{session_id, trainer}] = attached;
  return attached;
}

absl::StatusOr<std::shared_ptr<const SharedSegment>> SharedSegments::Find(
    const std::string& session_id, int trainer, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = segments_.find({session_id, trainer});
  if (it == segments_.end() || it->second->id != id) {
    return absl::NotFoundError(absl::StrCat(
        "shared_memory_segment ", id, " is not the segment of trainer ", trainer, " of session '",
        session_id, "' on this rank (replaced, dropped, or never attached): attach again"));
  }
  return it->second;
}

void SharedSegments::DropSession(const std::string& session_id) {
  std::vector<std::shared_ptr<const SharedSegment>> dropped;  // released without the lock
  absl::MutexLock lock(&mu_);
  for (auto it = segments_.lower_bound({session_id, 0});
       it != segments_.end() && it->first.first == session_id;) {
    RetireLocked(it->first, it->second);
    dropped.push_back(std::move(it->second));
    it = segments_.erase(it);
  }
}

void SharedSegments::Drop(const std::string& session_id, int trainer) {
  std::shared_ptr<const SharedSegment> dropped;  // released without the lock
  absl::MutexLock lock(&mu_);
  auto it = segments_.find({session_id, trainer});
  if (it == segments_.end()) return;
  RetireLocked(it->first, it->second);
  dropped = std::move(it->second);
  segments_.erase(it);
}

void SharedSegments::RetireLocked(const Key& key,
                                  const std::shared_ptr<const SharedSegment>& segment) {
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [](const Retired& r) { return r.segment.expired(); }),
                 retired_.end());
  retired_.push_back(Retired{key, segment});
}

int SharedSegments::RetiredLocked(absl::string_view session_id, int trainer) const {
  int alive = 0;
  for (const Retired& r : retired_) {
    if (r.segment.expired()) continue;
    if (!session_id.empty() && r.key.first != session_id) continue;
    if (trainer >= 0 && r.key.second != trainer) continue;
    ++alive;
  }
  return alive;
}

int64_t SharedSegments::bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& entry : segments_) total += entry.second->reservation.bytes();
  return total;
}

int64_t SharedSegments::bytes(const std::string& session_id, int trainer) const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (auto it = segments_.lower_bound({session_id, 0});
       it != segments_.end() && it->first.first == session_id; ++it) {
    if (trainer < 0 || it->first.second == trainer) total += it->second->reservation.bytes();
  }
  return total;
}

int SharedSegments::count(const std::string& session_id, int trainer) const {
  absl::MutexLock lock(&mu_);
  int held = RetiredLocked(session_id, trainer);
  for (auto it = segments_.lower_bound({session_id, 0});
       it != segments_.end() && it->first.first == session_id; ++it) {
    if (trainer < 0 || it->first.second == trainer) ++held;
  }
  return held;
}

int SharedSegments::current(const std::string& session_id, int trainer) const {
  absl::MutexLock lock(&mu_);
  return segments_.count({session_id, trainer}) > 0 ? 1 : 0;
}

int64_t SharedSegments::BytesFor(const std::vector<ParamInfo>& params, const Layout& layout,
                                 int rank) {
  int64_t span = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    if (layout.owner[p] == rank) span += Aligned(params[p].numel() * 4);
  }
  return SharedSegment::kAlignment + 2 * span;  // gradients_offset, the gradients, the values
}

}  // namespace optstep
