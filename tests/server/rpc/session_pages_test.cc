// CheckAnswerSize, the last guard of the session answers: an answer over the message size is
// RESOURCE_EXHAUSTED naming what, its bytes and the size; one that fits is OK.

#include "server/rpc/session_pages.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(CheckAnswerSizeTest, AnAnswerOverTheMessageSizeIsRefusedNamingItsBytes) {
  v1::CreateSessionResponse answer;
  answer.mutable_summary()->set_session_id(std::string(100, 's'));
  const size_t bytes = answer.ByteSizeLong();
  EXPECT_THAT(CheckAnswerSize(answer, bytes, "the answer"), IsOk());
  EXPECT_THAT(CheckAnswerSize(answer, bytes - 1, "the answer of 's'"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("the answer of 's' is ", bytes,
                                    " bytes, over the message size of ", bytes - 1)));
}

}  // namespace
}  // namespace optstep
