#ifndef OPTSTEP_SERVER_RPC_OPEN_STREAMS_H_
#define OPTSTEP_SERVER_RPC_OPEN_STREAMS_H_

// How many streams of one kind each session has open on this rank, so that a caller cannot
// make a rank hold a copy of a session's data per stream it opens and leaves open (an
// InitParameters stream stages the values it is sent; an ExportStateDict stream holds the state
// it has yet to send), and how many of them each owner has in the rank's headroom.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/memory_budget.h"

namespace optstep {

class Session;

// The streams of one kind open on this rank, by session (the replicas, not the ids: ranks that
// share a process share the ids), and within a session by trainer where the kind counts per
// trainer. Thread-safe; outlives its slots.
class OpenStreams {
 public:
  using Key = std::pair<const Session*, int>;  // a session, and a trainer or kWholeSession

  // A stream counted open until destroyed (or moved from, or Released).
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : streams_(other.streams_), key_(other.key_) {
      other.streams_ = nullptr;
    }
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        streams_ = other.streams_;
        key_ = other.key_;
        other.streams_ = nullptr;
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }

    bool held() const { return streams_ != nullptr; }
    void Release() {
      if (streams_ != nullptr) streams_->Close(key_);
      streams_ = nullptr;
    }

   private:
    friend class OpenStreams;
    Slot(OpenStreams* streams, Key key) : streams_(streams), key_(key) {}

    OpenStreams* streams_ = nullptr;
    Key key_;
  };

  // Counts the streams of a whole session, for the kinds that do not count per trainer.
  static constexpr int kWholeSession = -1;

  // A slot for a stream of `session` (of its trainer `trainer`, or of the whole session), unless
  // `limit` are open (then one not held).
  Slot TryOpen(const Session* session, int limit, int trainer = kWholeSession) {
    const Key key(session, trainer);
    absl::MutexLock lock(&mu_);
    int& open = open_[key];
    if (open >= limit) return Slot();
    ++open;
    return Slot(this, key);
  }

 private:
  void Close(const Key& key) {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(key);
    if (it != open_.end() && --it->second == 0) open_.erase(it);
  }

  absl::Mutex mu_;
  absl::flat_hash_map<Key, int> open_ ABSL_GUARDED_BY(mu_);
};

// Places in the rank's headroom (its memory outside the budget, docs/security.md "Limits") for
// the streams of one kind that hold a copy of a session's data (an export's state, the values an
// InitParameters stream stages), counted by the sessions' owner: each owner has `per_owner` at
// once, whatever its number of sessions, while their bytes fit in what the rank's headroom has
// free (MemoryBudget::TryTakeHeadroom, shared by every kind); its other streams take what they
// hold from the budget, within the owner's share. Thread-safe; outlives its places.
class HeadroomPlaces {
 public:
  explicit HeadroomPlaces(int per_owner) : per_owner_(per_owner) {}

  using TakeBytes = std::function<std::optional<MemoryBudget::HeadroomBytes>()>;
  // A place, and the bytes `take_bytes` answers, until the returned handle goes; null when
  // `owner` has all its places or the bytes do not fit.
  std::shared_ptr<const void> TryTake(const std::string& owner, const TakeBytes& take_bytes) {
    struct Held {
      HeadroomPlaces* places;
      std::string owner;
      MemoryBudget::HeadroomBytes bytes;
      ~Held() {
        absl::MutexLock lock(&places->mu_);
        auto it = places->taken_.find(owner);
        if (--it->second == 0) places->taken_.erase(it);
      }
    };
    absl::MutexLock lock(&mu_);
    auto it = taken_.find(owner);
    if (it != taken_.end() && it->second >= per_owner_) return nullptr;
    std::optional<MemoryBudget::HeadroomBytes> bytes = take_bytes();
    if (!bytes.has_value()) return nullptr;
    ++taken_[owner];
    return std::shared_ptr<const void>(new Held{this, owner, *std::move(bytes)});
  }

 private:
  const int per_owner_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> taken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OPEN_STREAMS_H_
