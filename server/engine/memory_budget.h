#ifndef OPTSTEP_SERVER_ENGINE_MEMORY_BUDGET_H_
#define OPTSTEP_SERVER_ENGINE_MEMORY_BUDGET_H_

// A rank's memory budget: how it is found, and the ledger of what is admitted against it
// (docs/security.md "Limits").

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// The share of the memory limit that a rank admits sessions into by default: the rest is the
// server's own (gRPC, streams in flight, checkpoints being written, the allocator's slack).
inline constexpr double kDefaultMemoryBudgetFraction = 0.8;

// A budget and where it came from, for the start-up log ("cgroup memory.max", ...).
struct MemoryLimit {
  int64_t bytes = 0;  // 0: none found
  std::string source;
};

// The limit of a cgroup memory file's contents (v2 memory.max, v1 memory.limit_in_bytes): the
// bytes, or 0 for "max", a value of 2^60 or more (v1's "no limit") or anything unparsable.
int64_t ParseCgroupMemoryLimit(absl::string_view contents);

// This process's memory limit: its cgroup's when one is set (v2 /sys/fs/cgroup/memory.max, then
// v1 /sys/fs/cgroup/memory/memory.limit_in_bytes), else the host's physical memory.
MemoryLimit HostMemoryLimit();

// The rank's budget: `configured` when > 0 ("--memory_budget"); else kDefaultMemoryBudgetFraction
// of `device_capacity` when > 0 (a device with memory of its own, Device::memory_capacity()),
// else of HostMemoryLimit().
MemoryLimit ResolveMemoryBudget(int64_t configured, int64_t device_capacity);

// The default headroom (MemoryBudget::set_headroom) of a rank whose budget takes `budget_on_host`
// bytes of the host's memory (0 for a device with memory of its own): what HostMemoryLimit()
// leaves beyond them (gRPC's own buffers come on top, as before the headroom was sized); 0 when
// it leaves nothing or none is found.
int64_t DefaultStreamHeadroom(int64_t budget_on_host);

// Hands the heap's free memory back to the system (glibc's malloc_trim), as after a session
// closes: its tensors and records are freed, but the allocator would otherwise keep the pages.
void ReturnFreedMemoryToSystem();

// Parses a byte count with an optional binary suffix: "3G", "512M", "64K", "1T" or plain bytes.
// INVALID_ARGUMENT naming `flag` and the text otherwise (negative, overflow, unknown suffix).
absl::StatusOr<int64_t> ParseByteCount(absl::string_view flag, absl::string_view text);

// The ledger of one rank's budget: sessions reserve their footprint before anything is allocated
// and release it when they close. Thread-safe; a Reservation may outlive its MemoryBudget.
class MemoryBudget {
 public:
  // REQUIRES: budget_bytes > 0.
  MemoryBudget(int64_t budget_bytes, int rank);
  // Rank `rank`'s budget that shares `host`'s bytes and what it admitted, both ways: a stand-in
  // in its host's process (the two ranks' memory is the one machine's). `host` may go first.
  MemoryBudget(const MemoryBudget& host, int rank);
  // Another handle on this budget (the same rank, bytes and ledger), which may outlive it: for a
  // session's later reservations (a session may outlive the engine).
  std::shared_ptr<MemoryBudget> Alias() const;

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes held against the budget until destroyed (or moved from). Thread-compatible.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }

    int64_t bytes() const { return bytes_; }
    void Release();

   private:
    friend class MemoryBudget;
    struct Ledger;
    Reservation(std::shared_ptr<Ledger> ledger, int64_t bytes, std::optional<std::string> owner)
        : ledger_(std::move(ledger)), bytes_(bytes), owner_(std::move(owner)) {}

    std::shared_ptr<Ledger> ledger_;
    int64_t bytes_ = 0;
    std::optional<std::string> owner_;  // none: counted as no owner's
  };

  // Reserves `bytes` when they fit beside what is admitted; otherwise RESOURCE_EXHAUSTED:
  // "<asker> needs N bytes on rank R (<detail>), more than the rank's budget of B bytes has free"
  // (not how many: that would tell a tenant what the others hold). An
  // `owner` (a session's owner, the empty name too) has the bytes counted as its own
  // (HeldBy) until they are released; `within_share` (optional, with an owner) is asked first,
  // with what the owner holds, under the lock that reserves: reservations made at once cannot
  // pass an owner's share together. It must not call this budget's ledger (HeldBy, admitted,
  // CheckFits, TryReserve, a release): its lock is held.
  using OwnerCheck = std::function<absl::Status(int64_t owner_holds)>;
  absl::StatusOr<Reservation> TryReserve(int64_t bytes, absl::string_view asker,
                                         absl::string_view detail,
                                         std::optional<absl::string_view> owner = std::nullopt,
                                         const OwnerCheck& within_share = nullptr);
  // TryReserve's answer, reserving nothing.
  absl::Status CheckFits(int64_t bytes, absl::string_view asker, absl::string_view detail) const;

  // The rank's headroom (its memory outside the budget, docs/security.md "Limits"): the bytes
  // that the copies streams hold in their owners' places there (HeadroomPlaces) may take
  // together, shared with a stand-in's budget. 0, the default: none (a copy of no bytes fits).
  void set_headroom(int64_t bytes);
  int64_t headroom() const;
  // Bytes of the headroom held until destroyed (or moved from). Thread-compatible.
  class HeadroomBytes {
   public:
    HeadroomBytes(HeadroomBytes&& other) noexcept = default;  // `other` holds none after
    HeadroomBytes& operator=(HeadroomBytes&&) = delete;
    HeadroomBytes(const HeadroomBytes&) = delete;
    HeadroomBytes& operator=(const HeadroomBytes&) = delete;
    ~HeadroomBytes();

   private:
    friend class MemoryBudget;
    HeadroomBytes(std::shared_ptr<Reservation::Ledger> ledger, int64_t bytes, std::string owner)
        : ledger_(std::move(ledger)), bytes_(bytes), owner_(std::move(owner)) {}

    std::shared_ptr<Reservation::Ledger> ledger_;  // null once moved from
    int64_t bytes_ = 0;
    std::string owner_;
  };
  // `bytes` of the headroom for `owner`'s stream when they fit beside what is held there, and
  // `owner` holds no more than `owner_most` there with them (so that one tenant's copies cannot
  // take the headroom from the others); nullopt when they do not.
  std::optional<HeadroomBytes> TryTakeHeadroom(int64_t bytes, const std::string& owner,
                                               int64_t owner_most);

  int64_t budget() const { return budget_; }
  int64_t admitted() const;
  // The bytes reserved for `owner` and not yet released, by this budget and every one sharing
  // its ledger (a stand-in's and its host's): a session closed while a call still holds it keeps
  // its reservation, and counts, until it is destroyed.
  int64_t HeldBy(absl::string_view owner) const;
  // The rank whose budget this one shares (the second constructor); -1 for a budget of its own.
  int host_rank() const { return host_rank_; }

 private:
  MemoryBudget(int64_t budget_bytes, int rank, int host_rank,
               std::shared_ptr<Reservation::Ledger> ledger);
  // OK when `bytes` fit beside `admitted`; else RESOURCE_EXHAUSTED as TryReserve says.
  absl::Status Fits(int64_t bytes, int64_t admitted, absl::string_view asker,
                    absl::string_view detail) const;

  const int64_t budget_;
  const int rank_;
  const int host_rank_;  // the rank whose budget this one shares; -1: its own
  const std::shared_ptr<Reservation::Ledger> ledger_;
};

struct MemoryBudget::Reservation::Ledger {
  mutable absl::Mutex mu;
  int64_t admitted ABSL_GUARDED_BY(mu) = 0;
  // The part of `admitted` reserved for each owner (none at 0).
  absl::flat_hash_map<std::string, int64_t> by_owner ABSL_GUARDED_BY(mu);
  int64_t headroom ABSL_GUARDED_BY(mu) = 0;     // MemoryBudget::set_headroom
  int64_t in_headroom ABSL_GUARDED_BY(mu) = 0;  // held by HeadroomBytes
  // The part of `in_headroom` each owner's streams hold (none at 0).
  absl::flat_hash_map<std::string, int64_t> headroom_by_owner ABSL_GUARDED_BY(mu);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_MEMORY_BUDGET_H_
