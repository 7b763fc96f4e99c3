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
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// Places counted by a key (an owner, a caller): each key has `per_key` at once. Thread-safe;
// outlives its places.
class KeyedPlaces {
 public:
  explicit KeyedPlaces(int per_key) : per_key_(per_key) {}

  // A place of `key` until the returned handle goes; null when `key` has all its places.
  std::shared_ptr<const void> TryTake(const std::string& key) {
    return TryTakeWith<bool>(key, [] { return std::optional<bool>(true); });
  }
  // The same, with what `also` answers (called under the lock), which the place keeps until it
  // goes; null, no place taken, when `also` answers none.
  template <typename T>
  std::shared_ptr<const void> TryTakeWith(const std::string& key,
                                          const std::function<std::optional<T>()>& also) {
    struct Held {
      KeyedPlaces* places;
      std::string key;
      T kept;
      ~Held() { places->Give(key); }
    };
    absl::MutexLock lock(&mu_);
    auto it = taken_.find(key);
    if (it != taken_.end() && it->second >= per_key_) return nullptr;
    std::optional<T> kept = also();
    if (!kept.has_value()) return nullptr;
    ++taken_[key];
    return std::shared_ptr<const void>(new Held{this, key, *std::move(kept)});
  }

 private:
  void Give(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = taken_.find(key);
    if (--it->second == 0) taken_.erase(it);
  }

  const int per_key_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> taken_ ABSL_GUARDED_BY(mu_);
};

// Places in the rank's headroom (its memory outside the budget, docs/security.md "Limits") for
// the streams of one kind that hold a copy of a session's data (an export's state, the values an
// InitParameters stream stages), counted by the sessions' owner: each owner has `per_owner` at
// once, whatever its number of sessions, while their bytes fit in what the rank's headroom has
// free (MemoryBudget::TryTakeHeadroom, shared by every kind); its other streams take what they
// hold from the budget, within the owner's share. Thread-safe; outlives its places.
class HeadroomPlaces {
 public:
  explicit HeadroomPlaces(int per_owner) : places_(per_owner) {}

  using TakeBytes = std::function<std::optional<MemoryBudget::HeadroomBytes>()>;
  // A place, and the bytes `take_bytes` answers, until the returned handle goes; null when
  // `owner` has all its places or the bytes do not fit.
  std::shared_ptr<const void> TryTake(const std::string& owner, const TakeBytes& take_bytes) {
    return places_.TryTakeWith<MemoryBudget::HeadroomBytes>(owner, take_bytes);
  }

 private:
  KeyedPlaces places_;
};

// The upload streams (InitParameters, ImportStateDict) each caller (CallerKey) has open on this
// rank that have sent no message yet: they name no session, so no session's bound counts them,
// and each may make the rank hold its window and a message (as --max_headerless_step_streams
// bounds Step streams).
inline constexpr int kMaxSilentUploadsPerCaller = 64;
inline KeyedPlaces& SilentUploads() {
  static KeyedPlaces* const places = new KeyedPlaces(kMaxSilentUploadsPerCaller);
  return *places;
}
// A place of `caller`'s (CallerKey) in SilentUploads for a stream of `what` (a method's name);
// RESOURCE_EXHAUSTED naming the caller and the bound when it has none left.
inline absl::StatusOr<std::shared_ptr<const void>> TakeSilentUploadPlace(
    absl::string_view what, const std::string& caller) {
  std::shared_ptr<const void> place = SilentUploads().TryTake(caller);
  if (place != nullptr) return place;
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": ", caller, " has ", kMaxSilentUploadsPerCaller,
      " upload streams open on this rank that sent no message yet; send on them (or cancel "
      "them) first; nothing was applied"));
}

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OPEN_STREAMS_H_
