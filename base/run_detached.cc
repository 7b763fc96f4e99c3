#include "base/run_detached.h"

#include <thread>
#include <utility>

namespace optstep {

void RunDetached(std::function<void()> work) { std::thread(std::move(work)).detach(); }

}  // namespace optstep
