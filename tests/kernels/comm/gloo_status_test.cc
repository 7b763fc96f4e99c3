// The translation of Gloo's exceptions into status codes.

#include "kernels/comm/gloo_status.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <stdexcept>

#include "gtest/gtest.h"
#include "kernels/comm/gloo_store.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace internal {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(GlooStatusTest, NothingThrownIsOk) {
  int calls = 0;
  EXPECT_THAT(CallGloo("op", [&] { ++calls; }), IsOk());
  EXPECT_EQ(calls, 1);
}

TEST(GlooStatusTest, TimeoutsAreDeadlineExceeded) {
  EXPECT_THAT(CallGloo("rank 0: all-reduce",
                       [] {
                         throw gloo::IoException(
                             "[pair.cc:1] Timed out waiting 1000ms for recv operation to "
                             "complete");
                       }),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "rank 0: all-reduce: timed out"));
  EXPECT_THAT(CallGloo("op", [] { throw gloo::IoException("Connect timeout [127.0.0.1]:5"); }),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(GlooStatusTest, LostPeersAreUnavailable) {
  EXPECT_THAT(CallGloo("op", [] { throw gloo::IoException("Connection closed by peer"); }),
              StatusIs(absl::StatusCode::kUnavailable, "op: peer lost: Connection closed"));
  // A pair that Gloo closed because another operation timed out is a lost peer here.
  EXPECT_THAT(
      CallGloo("op", [] { throw gloo::IoException("Application timeout caused pair closure"); }),
      StatusIs(absl::StatusCode::kUnavailable));
}

TEST(GlooStatusTest, StoreErrorsKeepTheirCode) {
  EXPECT_THAT(
      CallGloo("rendezvous",
               [] { throw GlooStoreError(absl::DeadlineExceededError("key 'k' not set")); }),
      StatusIs(absl::StatusCode::kDeadlineExceeded, "rendezvous: key 'k' not set"));
}

TEST(GlooStatusTest, OtherExceptionsAreInternal) {
  EXPECT_THAT(CallGloo("op", [] { GLOO_ENFORCE(1 + 1 == 3, "sizes differ"); }),
              StatusIs(absl::StatusCode::kInternal, "gloo check failed"));
  EXPECT_THAT(CallGloo("op", [] { throw std::runtime_error("boom"); }),
              StatusIs(absl::StatusCode::kInternal, "boom"));
  EXPECT_THAT(CallGloo("op", [] { throw 42; }),
              StatusIs(absl::StatusCode::kInternal, "unknown exception"));
}

}  // namespace
}  // namespace internal
}  // namespace optstep
