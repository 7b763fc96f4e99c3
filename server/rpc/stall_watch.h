#ifndef OPTSTEP_SERVER_RPC_STALL_WATCH_H_
#define OPTSTEP_SERVER_RPC_STALL_WATCH_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace optstep {

// Cancels a call to a peer once it stops making progress. A peer that hangs, rather
// than dies, keeps its connection up (a stopped process's kernel still acknowledges, a stuck one
// still answers HTTP/2 pings), so without this its caller would wait for ever: a heal's fetch
// would hold the heal, a Save's export the Save. A deadline on the whole call would instead bound
// how much a call may move; this bounds only the pause between two messages.
//
// The caller marks each message read or written (Progressed), or ProgressWhileAnswering marks
// each ping the peer answered; once `limit` passes without one, the call is cancelled
// (ClientContext::TryCancel), so that it fails, and Explain turns its error into one that says so.
// Thread-safe. The context must outlive the watch.
class StallWatch {
 public:
  StallWatch(grpc::ClientContext* context, absl::Duration limit);
  ~StallWatch();  // stops watching
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // A message went out or came in: the limit counts from now.
  void Progressed();
  // Whether the call was cancelled for want of progress.
  bool stalled() const;
  // `status` unless the call stalled and `status` is its cancellation; then DEADLINE_EXCEEDED
  // naming the peer `rank`, what the call was doing (`what`, as "fetching ...") and the limit.
  // (A call that failed by itself as it stalled keeps its own error.)
  absl::Status Explain(absl::Status status, int rank, absl::string_view what) const;

 private:
  void Watch();

  grpc::ClientContext* const context_;
  const absl::Duration limit_;
  mutable absl::Mutex mu_;
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is set
};

// Marks `watch` as progressing while a peer answers: asks `answers(context)` (a ping on a fresh
// context, with a deadline of its own) every `interval` on a thread of its own until destroyed.
// For a call whose progress the caller cannot see, such as a heal's phase that moves state on the
// peer: it may take as long as it needs while the peer answers, and is cancelled once the peer
// has not answered for the watch's limit. Thread-safe. The watch must outlive this.
class ProgressWhileAnswering {
 public:
  using Ping = std::function<bool(grpc::ClientContext* context)>;
  ProgressWhileAnswering(StallWatch* watch, Ping answers, absl::Duration interval);
  // Stops asking: cancels a ping under way, so that the caller is not held for its deadline.
  ~ProgressWhileAnswering();
  ProgressWhileAnswering(const ProgressWhileAnswering&) = delete;
  ProgressWhileAnswering& operator=(const ProgressWhileAnswering&) = delete;

 private:
  void Ask();

  StallWatch* const watch_;
  const Ping answers_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ping_ ABSL_GUARDED_BY(mu_) = nullptr;  // the ping under way, if any
  std::thread thread_;                                        // last: started once the rest is set
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STALL_WATCH_H_
