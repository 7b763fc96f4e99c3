#include "server/engine/memory_budget.h"

#include <malloc.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

// cgroup v1 answers about 2^63 rounded to pages for "no limit".
constexpr int64_t kNoCgroupLimit = int64_t{1} << 60;

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int64_t ParseCgroupMemoryLimit(absl::string_view contents) {
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(contents), &bytes)) return 0;
  if (bytes <= 0 || bytes >= kNoCgroupLimit) return 0;
  return bytes;
}

MemoryLimit HostMemoryLimit() {
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "cgroup memory.max"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "cgroup memory.limit_in_bytes"},
  };
  for (const auto& [path, source] : cgroups) {
    const int64_t bytes = ParseCgroupMemoryLimit(ReadFile(path));
    if (bytes > 0) return {bytes, source};
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return {0, "none"};
  return {static_cast<int64_t>(pages) * page_size, "physical memory"};
}

MemoryLimit ResolveMemoryBudget(int64_t configured, int64_t device_capacity) {
  if (configured > 0) return {configured, "--memory_budget"};
  MemoryLimit limit =
      device_capacity > 0 ? MemoryLimit{device_capacity, "device memory"} : HostMemoryLimit();
  if (limit.bytes <= 0) return limit;
  limit.bytes =
      static_cast<int64_t>(static_cast<double>(limit.bytes) * kDefaultMemoryBudgetFraction);
  limit.source = absl::StrCat(kDefaultMemoryBudgetFraction, " of ", limit.source);
  return limit;
}

int64_t DefaultStreamHeadroom(int64_t budget_on_host) {
  const MemoryLimit limit = HostMemoryLimit();
  return limit.bytes > budget_on_host ? limit.bytes - budget_on_host : 0;
}

// Under ASan and TSan the sanitizer's allocator serves malloc, and glibc's own arenas may never
// have been set up: trimming them then reads a null arena (a SEGV in malloc_trim, or a broken
// arena count when a thread exits). There is nothing of glibc's to give back either.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OPTSTEP_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OPTSTEP_SANITIZER_ALLOCATOR 1
#endif
#endif

void ReturnFreedMemoryToSystem() {
#ifndef OPTSTEP_SANITIZER_ALLOCATOR
  malloc_trim(0);
#endif
}

absl::StatusOr<int64_t> ParseByteCount(absl::string_view flag, absl::string_view text) {
  absl::string_view digits = absl::StripAsciiWhitespace(text);
  int shift = 0;
  if (!digits.empty() && std::isalpha(static_cast<unsigned char>(digits.back()))) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        shift = -1;
    }
    digits.remove_suffix(1);
  }
  int64_t value = 0;
  if (shift < 0 || !absl::SimpleAtoi(digits, &value) || value < 0 ||
      value > (std::numeric_limits<int64_t>::max() >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", text, "' is not a byte count (bytes, or a number with K, M, G or T)"));
  }
  return value << shift;
}

MemoryBudget::MemoryBudget(int64_t budget_bytes, int rank)
    : budget_(budget_bytes),
      rank_(rank),
      host_rank_(-1),
      ledger_(std::make_shared<Reservation::Ledger>()) {}

MemoryBudget::MemoryBudget(const MemoryBudget& host, int rank)
    : budget_(host.budget_), rank_(rank), host_rank_(host.rank_), ledger_(host.ledger_) {}

MemoryBudget::MemoryBudget(int64_t budget_bytes, int rank, int host_rank,
                           std::shared_ptr<Reservation::Ledger> ledger)
    : budget_(budget_bytes), rank_(rank), host_rank_(host_rank), ledger_(std::move(ledger)) {}

std::shared_ptr<MemoryBudget> MemoryBudget::Alias() const {
  return std::shared_ptr<MemoryBudget>(new MemoryBudget(budget_, rank_, host_rank_, ledger_));
}

int64_t MemoryBudget::admitted() const {
  absl::MutexLock lock(&ledger_->mu);
  return ledger_->admitted;
}

absl::Status MemoryBudget::Fits(int64_t bytes, int64_t admitted, absl::string_view asker,
                                absl::string_view detail) const {
  if (bytes <= budget_ - admitted) return absl::OkStatus();
  // Not how many bytes are free: that would tell a tenant what the others hold (the operator
  // reads it from optstep_memory_admitted_bytes).
  return absl::ResourceExhaustedError(absl::StrCat(
      asker, " needs ", bytes, " bytes on rank ", rank_, " (", detail,
      "), more than the rank's budget of ", budget_, " bytes has free",
      host_rank_ < 0
          ? ""
          : absl::StrCat(" (shared with rank ", host_rank_, ", which it stands in beside)")));
}

absl::Status MemoryBudget::CheckFits(int64_t bytes, absl::string_view asker,
                                     absl::string_view detail) const {
  absl::MutexLock lock(&ledger_->mu);
  return Fits(bytes, ledger_->admitted, asker, detail);
}

int64_t MemoryBudget::HeldBy(absl::string_view owner) const {
  absl::MutexLock lock(&ledger_->mu);
  auto it = ledger_->by_owner.find(owner);
  return it == ledger_->by_owner.end() ? 0 : it->second;
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::TryReserve(
    int64_t bytes, absl::string_view asker, absl::string_view detail,
    std::optional<absl::string_view> owner, const OwnerCheck& within_share) {
  absl::MutexLock lock(&ledger_->mu);
  if (owner.has_value() && within_share) {
    const auto held = ledger_->by_owner.find(*owner);
    absl::Status within = within_share(held == ledger_->by_owner.end() ? 0 : held->second);
    if (!within.ok()) return within;
  }
  absl::Status fits = Fits(bytes, ledger_->admitted, asker, detail);
  if (!fits.ok()) return fits;
  ledger_->admitted += bytes;
  if (!owner.has_value() || bytes == 0) return Reservation(ledger_, bytes, std::nullopt);
  ledger_->by_owner[*owner] += bytes;
  return Reservation(ledger_, bytes, std::string(*owner));
}

void MemoryBudget::set_headroom(int64_t bytes) {
  absl::MutexLock lock(&ledger_->mu);
  ledger_->headroom = bytes;
}

int64_t MemoryBudget::headroom() const {
  absl::MutexLock lock(&ledger_->mu);
  return ledger_->headroom;
}

std::optional<MemoryBudget::HeadroomBytes> MemoryBudget::TryTakeHeadroom(int64_t bytes,
                                                                         const std::string& owner,
                                                                         int64_t owner_most) {
  absl::MutexLock lock(&ledger_->mu);
  if (bytes > ledger_->headroom - ledger_->in_headroom) return std::nullopt;
  const auto held = ledger_->headroom_by_owner.find(owner);
  const int64_t owner_holds = held == ledger_->headroom_by_owner.end() ? 0 : held->second;
  if (bytes > owner_most - owner_holds) return std::nullopt;
  ledger_->in_headroom += bytes;
  if (bytes > 0) ledger_->headroom_by_owner[owner] += bytes;
  return HeadroomBytes(ledger_, bytes, owner);
}

MemoryBudget::HeadroomBytes::~HeadroomBytes() {
  if (ledger_ == nullptr) return;
  absl::MutexLock lock(&ledger_->mu);
  ledger_->in_headroom -= bytes_;
  if (bytes_ == 0) return;
  auto it = ledger_->headroom_by_owner.find(owner_);  // there while this holds bytes
  if ((it->second -= bytes_) == 0) ledger_->headroom_by_owner.erase(it);
}

MemoryBudget::Reservation::Reservation(Reservation&& other) noexcept
    : ledger_(std::move(other.ledger_)),
      bytes_(std::exchange(other.bytes_, 0)),
      owner_(std::move(other.owner_)) {}

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    ledger_ = std::move(other.ledger_);
    bytes_ = std::exchange(other.bytes_, 0);
    owner_ = std::move(other.owner_);
  }
  return *this;
}

void MemoryBudget::Reservation::Release() {
  if (ledger_ != nullptr) {
    absl::MutexLock lock(&ledger_->mu);
    ledger_->admitted -= bytes_;
    if (owner_.has_value()) {
      auto it = ledger_->by_owner.find(*owner_);  // there while this reservation holds bytes
      if ((it->second -= bytes_) == 0) ledger_->by_owner.erase(it);
    }
  }
  ledger_ = nullptr;
  bytes_ = 0;
  owner_.reset();
}

}  // namespace optstep
