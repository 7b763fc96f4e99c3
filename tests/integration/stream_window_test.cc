// What a Step stream that the rank no longer reads can make it hold: a trainer that committed
// its part of a step, which waits for the step's other trainer, and goes on sending. Each write
// completes only once the rank's HTTP/2 window for the stream takes it, so the bytes of the
// writes that complete are what the rank buffers for the stream: its window (--stream_window_bytes,
// 16 MiB). Before, the window was 256 MiB, and 64 writes of 4 MiB completed.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/test_session.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

constexpr int kElements = 1 << 20;  // 4 MiB of fp32 values per chunk

TEST(StreamWindowTest, AStreamNotReadHoldsAtMostItsWindow) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::ConnectedServer c, testutil::StartConnected({}));
  v1::SessionSpec spec;
  spec.set_name("waits");
  auto* p = spec.add_parameters();
  p->set_name("wide.weight");
  p->add_shape(kElements);
  spec.set_num_trainers(2);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("adam");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  v1::StepRequest request;
  request.mutable_header()->set_session_id(info.session_id());
  request.mutable_header()->set_step(1);
  request.mutable_header()->set_trainer_id(0);
  ASSERT_TRUE(stream->Write(request));
  request.Clear();
  request.mutable_commit()->set_num_elements(0);
  ASSERT_TRUE(stream->Write(request));
  // The step waits for trainer 1; the rank reads nothing more of this stream.
  request.Clear();
  v1::TensorChunk* gradient = request.mutable_gradient();
  gradient->set_param_id(0);
  gradient->set_dtype(v1::DTYPE_FP32);
  gradient->mutable_data()->assign(size_t{kElements} * 4, '\0');
  std::atomic<int> written{0};
  std::thread writer([&] {
    while (stream->Write(request)) ++written;
  });
  // A window of 256 MiB fills within a second on loopback; a write beyond the window never
  // completes, however long the test waits.
  absl::SleepFor(absl::Seconds(3));
  const int taken = written.load();
  context.TryCancel();
  writer.join();
  // The window, and the message the transport is parsing.
  EXPECT_LE(taken, 5) << "the rank took " << taken * 4 << " MiB of a stream it does not read";
  EXPECT_GE(taken, 1);
}

}  // namespace
}  // namespace optstep
