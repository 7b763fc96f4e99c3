#ifndef OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_
#define OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_

// The Step streams open on one server, so that a shutdown can end those still open after its
// grace period with UNAVAILABLE. gRPC's own shutdown would cancel them, and a trainer cannot tell
// a CANCELLED its server sent from its own cancel; UNAVAILABLE is what a trainer's recovery
// redoes once the group serves (a stand-in that gives way, a rank drained by SIGTERM). It also
// bounds the streams each caller has open before their header: those name no session, so no
// session's bound counts them, and each may make the rank hold its window and one message.

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// Thread-safe.
class LiveStepStreams {
 public:
  // One open stream, as the registry sees it.
  class Stream {
   public:
    // Ends the stream with UNAVAILABLE naming `why`; false (nothing done) if it ended already.
    // Must not block.
    virtual bool EndUnavailable(absl::string_view why) = 0;

   protected:
    ~Stream() = default;
  };

  static constexpr int kDefaultMaxHeaderlessPerCaller = 64;

  // Each caller (CallerKey) has at most `max_headerless_per_caller` streams open that have not
  // sent their header.
  explicit LiveStepStreams(int max_headerless_per_caller = kDefaultMaxHeaderlessPerCaller)
      : max_headerless_per_caller_(max_headerless_per_caller) {}
  LiveStepStreams(const LiveStepStreams&) = delete;
  LiveStepStreams& operator=(const LiveStepStreams&) = delete;

  // `stream`, of `caller` (CallerKey), is open until Remove(stream.get()), and counted among the
  // caller's streams without a header until Named(stream.get()); the registry keeps it weakly.
  // Once EndAll ran it is not kept: UNAVAILABLE with EndAll's `why`; nor when the caller has as
  // many without a header open already: RESOURCE_EXHAUSTED naming the caller and the limit. The
  // stream is to end at once with the status.
  absl::Status Add(const std::shared_ptr<Stream>& stream, std::string caller);
  // `stream` sent its header: it counts no longer against its caller's bound.
  void Named(const Stream* stream);
  void Remove(const Stream* stream);
  // How many streams of `caller` have not sent their header.
  int headerless(absl::string_view caller) const;
  // Ends every stream open now (Stream::EndUnavailable) and refuses later ones (Add); answers
  // how many it ended.
  int EndAll(absl::string_view why);

 private:
  struct Open {
    std::weak_ptr<Stream> stream;
    std::string headerless_caller;  // empty once it sent its header
  };
  // Counts `open` no longer among its caller's streams without a header.
  void NamedLocked(Open& open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_headerless_per_caller_;
  mutable absl::Mutex mu_;
  std::map<const Stream*, Open> open_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> headerless_ ABSL_GUARDED_BY(mu_);  // by caller
  std::optional<std::string> ended_ ABSL_GUARDED_BY(mu_);  // EndAll's why, once it ran
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_
