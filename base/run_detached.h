#ifndef OPTSTEP_BASE_RUN_DETACHED_H_
#define OPTSTEP_BASE_RUN_DETACHED_H_

// The one way the project starts work that nobody waits for: blocking work (rendezvous, calls to
// other ranks, file IO) that must not run on the thread that asks for it, typically a gRPC
// reaction, which finishes its call from that work. One place, so that it can become a bounded
// pool later without touching its callers.

#include <functional>

namespace optstep {

// Runs `work` on a thread of its own that is never joined. `work` must own (or hold alive)
// everything it touches: the caller may return, and the object that asked may go away, before it
// runs. Thread-safe.
void RunDetached(std::function<void()> work);

}  // namespace optstep

#endif  // OPTSTEP_BASE_RUN_DETACHED_H_
