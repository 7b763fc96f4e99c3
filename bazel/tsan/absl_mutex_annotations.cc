// ThreadSanitizer annotations for Debian's prebuilt Abseil (libabsl_synchronization.so).
//
// Abseil annotates absl::Mutex for TSan only when Abseil itself is compiled with
// -fsanitize=thread. The system library is not, so under --config=tsan every lock and unlock
// would be invisible to TSan and every ABSL_GUARDED_BY field would look racy. This file, linked
// into every binary of --config=tsan (.bazelrc: --custom_malloc), interposes the out-of-line
// members of absl::Mutex, absl::CondVar and absl::Notification (and Status's reference count): each
// one tells TSan what Abseil's own annotated build would (a lock, an unlock, a wait that releases
// and reacquires), then calls the real member found with dlsym(RTLD_NEXT). Conditions (LockWhen,
// Await) are evaluated by Abseil with the mutex held, possibly on the thread that unlocks it; they
// are wrapped so that their reads happen after an acquire of the mutex. gRPC's own mutexes are
// absl::Mutex too, so its locking is seen as well.
//
// Mode: CondVar::Wait and Await release the mutex in the mode it is held; the reader-mode
// holders of each thread are tracked here to annotate that mode.
//
// Thread-safety: every function is called concurrently; the only state is thread-local.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

// The real member `symbol` (its mangled name) of the next library, the system's Abseil.
template <typename Fn>
Fn Real(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_mutex_annotations: %s not found\n", symbol);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// The mutexes this thread holds in reader mode.
std::vector<const absl::Mutex*>& ReaderHeld() {
  thread_local std::vector<const absl::Mutex*> held;
  return held;
}

unsigned HeldMode(const absl::Mutex* mu) {
  const std::vector<const absl::Mutex*>& held = ReaderHeld();
  return std::find(held.begin(), held.end(), mu) != held.end() ? __tsan_mutex_read_lock : 0;
}

void NoteReader(const absl::Mutex* mu, bool held) {
  std::vector<const absl::Mutex*>& readers = ReaderHeld();
  if (held) {
    readers.push_back(mu);
  } else {
    auto it = std::find(readers.begin(), readers.end(), mu);
    if (it != readers.end()) readers.erase(it);
  }
}

// True while this thread is inside an interposed member: Abseil implements some members with
// others (AwaitWithTimeout calls AwaitWithDeadline, CondVar::WaitWithTimeout calls
// WaitWithDeadline), and the outer call has already told TSan.
bool& Inside() {
  thread_local bool inside = false;
  return inside;
}

// Calls `real` unannotated when nested in another interposed member; otherwise `annotated`
// (which calls `real` itself).
template <typename Real, typename Annotated>
auto Interpose(Real real, Annotated annotated) {
  if (Inside()) return real();
  Inside() = true;
  auto result = annotated();
  Inside() = false;
  return result;
}

// A condition evaluated by Abseil with `mu` held, possibly on another thread.
struct AnnotatedCondition {
  absl::Mutex* mu;
  const absl::Condition* condition;

  static bool Eval(AnnotatedCondition* self) {
    __tsan_acquire(self->mu);
    const bool result = self->condition->Eval();
    __tsan_release(self->mu);
    return result;
  }
};

// Runs `wait` (which releases `mu` and holds it again when it returns) as TSan sees it.
template <typename Wait>
auto AnnotatedWait(absl::Mutex* mu, Wait wait) {
  return Interpose(wait, [&] {
    const unsigned mode = HeldMode(mu);
    __tsan_mutex_pre_unlock(mu, mode);
    __tsan_mutex_post_unlock(mu, mode);
    auto result = wait();
    __tsan_mutex_pre_lock(mu, mode);
    __tsan_mutex_post_lock(mu, mode, 0);
    return result;
  });
}

// Runs `lock` (which acquires `mu` in `mode`, maybe waiting for a condition) as TSan sees it.
template <typename Lock>
auto AnnotatedLock(absl::Mutex* mu, unsigned mode, Lock lock) {
  return Interpose(lock, [&] {
    __tsan_mutex_pre_lock(mu, mode);
    auto result = lock();
    __tsan_mutex_post_lock(mu, mode, 0);
    if (mode & __tsan_mutex_read_lock) NoteReader(mu, true);
    return result;
  });
}

// Runs `unlock` (which releases `mu` held in `mode`) as TSan sees it.
void AnnotatedUnlock(absl::Mutex* mu, unsigned mode, void (*unlock)(absl::Mutex*)) {
  auto call = [&] { return unlock(mu), 0; };
  Interpose(call, [&] {
    if (mode & __tsan_mutex_read_lock) NoteReader(mu, false);
    __tsan_mutex_pre_unlock(mu, mode);
    call();
    __tsan_mutex_post_unlock(mu, mode);
    return 0;
  });
}

// Runs `try_lock` (which acquires `mu` in `mode` if it is free) as TSan sees it.
bool AnnotatedTryLock(absl::Mutex* mu, unsigned mode, bool (*try_lock)(absl::Mutex*)) {
  auto call = [&] { return try_lock(mu); };
  return Interpose(call, [&] {
    mode |= __tsan_mutex_try_lock;
    __tsan_mutex_pre_lock(mu, mode);
    const bool locked = call();
    __tsan_mutex_post_lock(mu, mode | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
    if (locked && (mode & __tsan_mutex_read_lock)) NoteReader(mu, true);
    return locked;
  });
}

using Member = void (*)(absl::Mutex*);
using TryMember = bool (*)(absl::Mutex*);
using CondMember = bool (*)(absl::Mutex*, const absl::Condition&);
using CondTimeoutMember = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using CondDeadlineMember = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CvWaitMember = void (*)(absl::CondVar*, absl::Mutex*);
using CvTimeoutMember = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CvDeadlineMember = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);

// The symbols of Abseil 20220623 as Debian builds it (inline namespace debian3).
#define OPTSTEP_ABSL_MUTEX "_ZN4absl7debian35Mutex"
#define OPTSTEP_ABSL_CONDVAR "_ZN4absl7debian37CondVar"
#define OPTSTEP_CONDITION "RKNS0_9ConditionE"

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const Member real = Real<Member>(OPTSTEP_ABSL_MUTEX "4LockEv");
  AnnotatedLock(this, 0, [&] { return real(this), 0; });
}

void Mutex::ReaderLock() {
  static const Member real = Real<Member>(OPTSTEP_ABSL_MUTEX "10ReaderLockEv");
  AnnotatedLock(this, __tsan_mutex_read_lock, [&] { return real(this), 0; });
}

bool Mutex::TryLock() {
  static const TryMember real = Real<TryMember>(OPTSTEP_ABSL_MUTEX "7TryLockEv");
  return AnnotatedTryLock(this, 0, real);
}

bool Mutex::ReaderTryLock() {
  static const TryMember real = Real<TryMember>(OPTSTEP_ABSL_MUTEX "13ReaderTryLockEv");
  return AnnotatedTryLock(this, __tsan_mutex_read_lock, real);
}

void Mutex::Unlock() {
  static const Member real = Real<Member>(OPTSTEP_ABSL_MUTEX "6UnlockEv");
  AnnotatedUnlock(this, 0, real);
}

void Mutex::ReaderUnlock() {
  static const Member real = Real<Member>(OPTSTEP_ABSL_MUTEX "12ReaderUnlockEv");
  AnnotatedUnlock(this, __tsan_mutex_read_lock, real);
}

void Mutex::LockWhen(const Condition& cond) {
  static const CondMember real =
      Real<CondMember>(OPTSTEP_ABSL_MUTEX "8LockWhenE" OPTSTEP_CONDITION);
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  AnnotatedLock(this, 0, [&] { return real(this, wrapped); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const CondMember real =
      Real<CondMember>(OPTSTEP_ABSL_MUTEX "14ReaderLockWhenE" OPTSTEP_CONDITION);
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  AnnotatedLock(this, __tsan_mutex_read_lock, [&] { return real(this, wrapped); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const CondTimeoutMember real = Real<CondTimeoutMember>(
      OPTSTEP_ABSL_MUTEX "19LockWhenWithTimeoutE" OPTSTEP_CONDITION "NS0_8DurationE");
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  return AnnotatedLock(this, 0, [&] { return real(this, wrapped, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const CondDeadlineMember real = Real<CondDeadlineMember>(
      OPTSTEP_ABSL_MUTEX "20LockWhenWithDeadlineE" OPTSTEP_CONDITION "NS0_4TimeE");
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  return AnnotatedLock(this, 0, [&] { return real(this, wrapped, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static const CondMember real = Real<CondMember>(OPTSTEP_ABSL_MUTEX "5AwaitE" OPTSTEP_CONDITION);
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  AnnotatedWait(this, [&] { return real(this, wrapped); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const CondTimeoutMember real = Real<CondTimeoutMember>(
      OPTSTEP_ABSL_MUTEX "16AwaitWithTimeoutE" OPTSTEP_CONDITION "NS0_8DurationE");
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  return AnnotatedWait(this, [&] { return real(this, wrapped, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const CondDeadlineMember real = Real<CondDeadlineMember>(
      OPTSTEP_ABSL_MUTEX "17AwaitWithDeadlineE" OPTSTEP_CONDITION "NS0_4TimeE");
  AnnotatedCondition annotated{this, &cond};
  const Condition wrapped(&AnnotatedCondition::Eval, &annotated);
  return AnnotatedWait(this, [&] { return real(this, wrapped, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static const CvWaitMember real = Real<CvWaitMember>(OPTSTEP_ABSL_CONDVAR "4WaitEPNS0_5MutexE");
  AnnotatedWait(mu, [&] { return real(this, mu), 0; });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const CvTimeoutMember real =
      Real<CvTimeoutMember>(OPTSTEP_ABSL_CONDVAR "15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return AnnotatedWait(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const CvDeadlineMember real =
      Real<CvDeadlineMember>(OPTSTEP_ABSL_CONDVAR "16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return AnnotatedWait(mu, [&] { return real(this, mu, deadline); });
}

// Notification: Notify() publishes with an atomic store inside the library; it is told to TSan as
// a release of the flag, and a wait that saw it as an acquire, so what the notifier wrote is
// ordered before what the waiter reads. HasBeenNotified() is inline: a thread that polls it
// instead of waiting is not ordered (none of our code does so before reading results).
static_assert(sizeof(Notification) == 2 * sizeof(Mutex), "Notification is {Mutex, atomic<bool>}");

namespace {
void* NotifiedFlag(const Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n) + sizeof(Mutex));
}
}  // namespace

void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(NotifiedFlag(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, Time)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(NotifiedFlag(this));
  return notified;
}

// Status: a copy takes a reference with an atomic increment in our (instrumented) code, the last
// release frees the representation inside the library. Each release is told to TSan as a release
// and an acquire of the representation, as the library's acq_rel decrement is, so the thread that
// frees it is ordered after every thread that held it.
void Status::UnrefNonInlined(uintptr_t rep) {
  static const auto real = Real<void (*)(uintptr_t)>("_ZN4absl7debian36Status15UnrefNonInlinedEm");
  __tsan_release(reinterpret_cast<void*>(rep));
  __tsan_acquire(reinterpret_cast<void*>(rep));
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
