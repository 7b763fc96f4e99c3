// REPLICATED sums a parameter's gradient in trainer order (TrainerOrder): a chunk that comes
// before its turn waits, and the chunk that completes trainer t's part lets trainer t + 1's in,
// whose adding can let trainer t + 2's in, and so on. With the most trainers a session may
// declare (4096) all waiting, trainer 0's chunk lets in all the others. Before, each was added
// from within the adding of the one before it, 4095 calls deep: that overflowed a thread's stack
// (here 256 KiB; a smaller default stack, or the sanitizers' larger frames, the same) and killed
// the rank for every tenant.

#include <pthread.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BeginStep;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::SendGradient;

constexpr int kTrainers = 4096;

// Runs `call` on a thread of its own with a stack of `stack_bytes`; answers its status.
absl::Status RunOnStackOf(size_t stack_bytes, const std::function<absl::Status()>& call) {
  struct Run {
    const std::function<absl::Status()>* call;
    absl::Status status;
  } run{&call, absl::OkStatus()};
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, stack_bytes);
  pthread_t thread;
  const int created = pthread_create(
      &thread, &attributes,
      [](void* arg) -> void* {
        auto* r = static_cast<Run*>(arg);
        r->status = (*r->call)();
        return nullptr;
      },
      &run);
  pthread_attr_destroy(&attributes);
  if (created != 0) return absl::InternalError("pthread_create failed");
  pthread_join(thread, nullptr);
  return run.status;
}

TEST(ManyTrainersTest, TheWaitingChunksOfTheMostTrainersAreAddedOneAfterAnother) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine(/*num_threads=*/2);
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::AdamW(0.1, 0.0));
  config.params = {ParamInfo{"w", {4}}};
  config.num_trainers = kTrainers;
  config.mode = GradientMode::kReplicated;
  std::shared_ptr<Session> s = testutil::MakeSession(*engine, config);
  ASSERT_NE(s, nullptr);
  const std::vector<float> ones(4, 1.0f);
  std::vector<StepHandle> handles(kTrainers);
  for (int t = 1; t < kTrainers; ++t) {
    handles[t] = BeginStep(*s, 1, t);
    ASSERT_THAT(SendGradient(*s, handles[t], 0, 0, ones), IsOk());  // waits, copied
  }
  handles[0] = BeginStep(*s, 1, 0);
  ASSERT_THAT(RunOnStackOf(256 << 10, [&] { return SendGradient(*s, handles[0], 0, 0, ones); }),
              IsOk());
  std::vector<Outcome> outcomes(kTrainers);
  for (int t = 0; t < kTrainers; ++t) {
    ASSERT_THAT(s->Commit(handles[t], 4, outcomes[t].Callback()), IsOk()) << "trainer " << t;
  }
  for (int t = 0; t < kTrainers; ++t) {
    ASSERT_THAT(outcomes[t].Wait().status(), IsOk()) << "trainer " << t;
  }
  // Every trainer's ones were summed: their mean is 1 in each element.
  EXPECT_EQ(outcomes[0].Wait()->grad_norm, 2.0);
}

}  // namespace
}  // namespace optstep
