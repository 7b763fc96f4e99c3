#include "client/cpp/channel_options.h"

#include <string>

#include <grpc/grpc.h>

#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

ClientOptions Valid() {
  ClientOptions options;
  options.target = "localhost:50051";
  return options;
}

// The integer value of `key` in `args`, or -1.
int IntArg(const grpc::ChannelArguments& args, absl::string_view key) {
  grpc_channel_args c_args = args.c_channel_args();
  for (size_t i = 0; i < c_args.num_args; ++i) {
    if (key == c_args.args[i].key && c_args.args[i].type == GRPC_ARG_INTEGER) {
      return c_args.args[i].value.integer;
    }
  }
  return -1;
}

TEST(ChannelOptionsTest, DefaultsAreValidAndTuned) {
  const ClientOptions options = Valid();
  ASSERT_THAT(ValidateClientOptions(options), IsOk());
  const grpc::ChannelArguments args = MakeChannelArguments(options);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_BDP_PROBE), 0);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES), 16 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_MAX_FRAME_SIZE), (16 << 20) - 1);
  EXPECT_EQ(IntArg(args, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH), 8 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH), 8 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL), 1);
}

TEST(ChannelOptionsTest, RejectsBadOptions) {
  ClientOptions options = Valid();
  options.target.clear();
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "no target"));

  options = Valid();
  options.rank_targets = {"a:1", ""};
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "rank_targets[1] is empty"));

  options = Valid();
  options.max_frame_bytes = 16 << 20;  // one above the HTTP/2 maximum
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_frame_bytes 16777216"));

  options = Valid();
  options.max_chunk_bytes = (4 << 20) + 1;
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_chunk_bytes 4194305"));

  options = Valid();
  options.max_message_bytes = 4 << 20;
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot hold a chunk"));

  options = Valid();
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be positive"));

  options = Valid();
  options.connect_timeout = -absl::Seconds(1);
  EXPECT_THAT(ValidateClientOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "connect_timeout"));
}

TEST(ChannelOptionsTest, RankTargetsReplaceTarget) {
  ClientOptions options;
  options.rank_targets = {"r0:1", "r1:1"};
  EXPECT_THAT(ValidateClientOptions(options), IsOk());
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
