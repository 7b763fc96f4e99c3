#ifndef OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_
#define OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_

// The Step streams open on one server, so that a shutdown can end those still open after its
// grace period with UNAVAILABLE. gRPC's own shutdown would cancel them, and a trainer cannot tell
// a CANCELLED its server sent from its own cancel; UNAVAILABLE is what a trainer's recovery
// redoes once the group serves (a stand-in that gives way, a rank drained by SIGTERM).

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
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

  LiveStepStreams() = default;
  LiveStepStreams(const LiveStepStreams&) = delete;
  LiveStepStreams& operator=(const LiveStepStreams&) = delete;

  // `stream` is open until Remove(stream.get()); the registry keeps it weakly. Once EndAll ran it
  // is not kept: answers EndAll's `why`, with which the stream is to end at once.
  std::optional<std::string> Add(const std::shared_ptr<Stream>& stream);
  void Remove(const Stream* stream);
  // Ends every stream open now (Stream::EndUnavailable) and refuses later ones (Add); answers
  // how many it ended.
  int EndAll(absl::string_view why);

 private:
  absl::Mutex mu_;
  std::map<const Stream*, std::weak_ptr<Stream>> open_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> ended_ ABSL_GUARDED_BY(mu_);  // EndAll's why, once it ran
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_LIVE_STEP_STREAMS_H_
