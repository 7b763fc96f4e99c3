// RetryWhileAnswering: a call lost on the way is made again while the callee answers; an answer
// that is not a passing failure ends it, and so do a callee that stopped answering and the bound.

#include "server/rpc/retry_while_answering.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/log_lines.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::LogLines;
using ::optstep::testutil::StatusIs;

// Answers `statuses` in turn, then OK; counts the attempts.
struct Calls {
  std::vector<absl::Status> statuses;
  int made = 0;
  absl::Status operator()() {
    const int i = made++;
    return i < static_cast<int>(statuses.size()) ? statuses[i] : absl::OkStatus();
  }
};

const absl::Time kLater = absl::InfiniteFuture();
const absl::Duration kSilence = absl::ZeroDuration();

TEST(RetryWhileAnsweringTest, PassingFailuresAreMadeAgainUntilTaken) {
  Calls calls{{absl::UnavailableError("reset"), absl::DeadlineExceededError("late")}};
  EXPECT_THAT(RetryWhileAnswering(
                  "call=t", kLater, kSilence, [] { return true; }, std::ref(calls)),
              IsOk());
  EXPECT_EQ(calls.made, 3);
}

TEST(RetryWhileAnsweringTest, AnAnswerThatIsNoPassingFailureEndsIt) {
  Calls calls{{absl::UnavailableError("reset"), absl::FailedPreconditionError("runs no heal")}};
  EXPECT_THAT(RetryWhileAnswering(
                  "call=t", kLater, kSilence, [] { return true; }, std::ref(calls)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "runs no heal"));
  EXPECT_EQ(calls.made, 2);
}

TEST(RetryWhileAnsweringTest, ACalleeThatStoppedAnsweringOrTheBoundEndsIt) {
  Calls lost{{absl::UnavailableError("reset")}};
  EXPECT_THAT(RetryWhileAnswering(
                  "call=t", kLater, kSilence, [] { return false; }, std::ref(lost)),
              StatusIs(absl::StatusCode::kUnavailable, "reset"));
  EXPECT_EQ(lost.made, 1);
  Calls late{{absl::UnavailableError("reset")}};
  EXPECT_THAT(RetryWhileAnswering(
                  "call=t", absl::Now(), kSilence, [] { return true; }, std::ref(late)),
              StatusIs(absl::StatusCode::kUnavailable, "reset"));
  EXPECT_EQ(late.made, 1);
}

// A callee whose ping fails once (its channel reconnecting) but answers again within the silence
// bound is still alive: the call is made again until taken. Before, one failed ping ended the
// retries, and a heal's end that a live rank missed left it paused for good.
TEST(RetryWhileAnsweringTest, APingThatFailsOnceWithinTheSilenceBoundIsNoLostCallee) {
  Calls calls{{absl::UnavailableError("reset"), absl::UnavailableError("reset"),
               absl::UnavailableError("reset")}};
  int pings = 0;
  EXPECT_THAT(
      RetryWhileAnswering(
          "call=t", kLater, absl::Seconds(30), [&pings] { return pings++ != 0; }, std::ref(calls)),
      IsOk());
  EXPECT_EQ(calls.made, 4);
  Calls silent{{absl::UnavailableError("reset"), absl::UnavailableError("reset")}};
  EXPECT_THAT(RetryWhileAnswering(
                  "call=t", kLater, absl::Milliseconds(50), [] { return false; }, std::ref(silent)),
              StatusIs(absl::StatusCode::kUnavailable, "reset"));
  EXPECT_EQ(silent.made, 2);  // 100 ms apart: the second failure finds the callee silent
}

// A status message may carry a caller's text (a session's name: `"` is allowed in it): the retry's
// log line escapes it, so that it neither ends the quoted value nor forges a field or a line.
// Before, the message was logged as it was.
TEST(RetryWhileAnsweringTest, TheLoggedErrorIsEscaped) {
  LogLines logged;
  Calls calls{{absl::UnavailableError("session 'x\" event=rank_healed k=\"\nforged'")}};
  ASSERT_THAT(RetryWhileAnswering(
                  "call=t", kLater, kSilence, [] { return true; }, std::ref(calls)),
              IsOk());
  EXPECT_THAT(logged.lines(),
              testing::Contains(testing::EndsWith(
                  "error=\"session 'x\\\" event=rank_healed k=\\\"\\x0aforged'\"")));
}

}  // namespace
}  // namespace optstep
