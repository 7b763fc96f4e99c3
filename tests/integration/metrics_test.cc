// The Prometheus endpoint of a real server, scraped over plain HTTP before and after a few
// steps: the step phase histograms, bytes in and out, the sessions and device memory gauges, the
// active streams gauge and the error counter all move as the work says they should.

#include <grpcpp/create_channel.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::HttpGet;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::OpenStep;
using ::optstep::testutil::ScrapeMetrics;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StepSmall;
using ::testing::HasSubstr;

constexpr char kBytesIn[] = "optstep_gradient_bytes_received_total";
constexpr char kBytesOut[] = "optstep_parameter_bytes_sent_total";

std::string PhaseCount(const std::string& phase) {
  return absl::StrCat("optstep_step_phase_seconds_count{phase=\"", phase, "\"}");
}

TEST(MetricsTest, ValuesFollowTheWork) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server,
                               ServerProcess::Start({"--metrics_port=-1", "--memory_budget=1G"}));
  ASSERT_GT(server->metrics_port(), 0);
  const int port = server->metrics_port();
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));

  auto before = ScrapeMetrics(port);
  ASSERT_FALSE(before.empty()) << "no answer from /metrics";
  EXPECT_EQ(before["optstep_sessions"], 0);
  EXPECT_EQ(before["optstep_device_memory_bytes"], 0);
  ASSERT_EQ(before.count("optstep_device_stalled"), 1u);
  EXPECT_EQ(before["optstep_device_stalled"], 0);
  ASSERT_EQ(before.count("optstep_device_task_seconds"), 1u);
  EXPECT_EQ(before["optstep_device_task_seconds"], 0);
  EXPECT_EQ(before[kBytesIn], 0);
  EXPECT_EQ(before[kBytesOut], 0);
  EXPECT_EQ(before[PhaseCount("step")], 0);
  EXPECT_EQ(before["optstep_active_streams"], 0);
  EXPECT_EQ(before["optstep_memory_budget_bytes"], 1 << 30);
  EXPECT_EQ(before["optstep_memory_admitted_bytes"], 0);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("m")));
  constexpr int kSteps = 3;
  for (int step = 1; step <= kSteps; ++step) {
    ASSERT_THAT(StepSmall(*client, info.session_id(), step).status(), IsOk());
  }
  EXPECT_THAT(client->GetSession("no-such-session").status(),
              testutil::StatusIs(absl::StatusCode::kNotFound));

  auto after = ScrapeMetrics(port);
  ASSERT_FALSE(after.empty());
  const double step_bytes = testutil::kSmallElements * sizeof(float);
  EXPECT_EQ(after["optstep_sessions"], 1);
  // Masters, Adam's two moments and the gradient buffer: at least four copies of the model.
  EXPECT_GE(after["optstep_device_memory_bytes"], 4 * step_bytes);
  // The admitted footprint covers what the session holds (and its overhead and workspace).
  EXPECT_GE(after["optstep_memory_admitted_bytes"], after["optstep_device_memory_bytes"]);
  EXPECT_EQ(after["optstep_memory_budget_bytes"], 1 << 30);
  EXPECT_EQ(after[kBytesIn], kSteps * step_bytes);
  EXPECT_EQ(after[kBytesOut], kSteps * step_bytes);  // every parameter back, in fp32
  for (const char* phase : {"ingest", "step", "egress"}) {
    EXPECT_EQ(after[PhaseCount(phase)], kSteps) << phase;
  }
  EXPECT_EQ(after[PhaseCount("all_gather")], 0);  // one rank: nothing to gather
  EXPECT_GT(after["optstep_step_phase_seconds_sum{phase=\"step\"}"], 0);
  EXPECT_EQ(after["optstep_steps_total{result=\"applied\"}"], kSteps);
  EXPECT_EQ(after["optstep_rpc_errors_total{code=\"NOT_FOUND\",method=\"/optstep.v1."
                  "OptimizerService/GetSession\"}"],
            1);

  // A Step stream held open shows in the active streams gauge, and leaves it when it ends.
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto open, OpenStep::Begin(channel, info.session_id(), kSteps + 1));
  EXPECT_THAT(testutil::AwaitMetric(port, "optstep_active_streams", 1), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(uint64_t applied, open->Commit());
  EXPECT_EQ(applied, kSteps + 1u);
  open.reset();
  // The server ends the call just after the client does.
  EXPECT_THAT(testutil::AwaitMetric(port, "optstep_active_streams", 0), IsOk());

  ASSERT_THAT(client->CloseSession(info.session_id()), IsOk());
  auto closed = ScrapeMetrics(port);
  ASSERT_FALSE(closed.empty());
  EXPECT_EQ(closed["optstep_sessions"], 0);
  EXPECT_EQ(closed["optstep_device_memory_bytes"], 0);
  // The reservation goes with the session, as soon as a task or stream that was ending lets go.
  EXPECT_THAT(testutil::AwaitMetric(port, "optstep_memory_admitted_bytes", 0), IsOk());

  EXPECT_THAT(HttpGet(port, "/other"), HasSubstr("404"));
}

TEST(MetricsTest, OffByDefault) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  EXPECT_EQ(server->metrics_port(), 0);
}

TEST(MetricsTest, PortFileNamesTheBoundPort) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string file = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/metrics_port");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      auto server, ServerProcess::Start({"--metrics_port=-1", "--metrics_port_file=" + file}));
  std::ifstream in(file);
  int port = 0;
  in >> port;
  EXPECT_EQ(port, server->metrics_port());
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("optstep_sessions 0"));
}

// The server reports the variant of its CPU element-wise kernels and the library of its medium
// GEMMs; OPTSTEP_CPU_ISA and OPTSTEP_CPU_GEMM (inherited by the server process) force the baseline
// and OpenBLAS.
TEST(MetricsTest, ReportsTheCpuKernelVariantAndGemmBackend) {
  ASSERT_EQ(setenv("OPTSTEP_CPU_ISA", "baseline", 1), 0);
  ASSERT_EQ(setenv("OPTSTEP_CPU_GEMM", "openblas", 1), 0);
  auto server = ServerProcess::Start({"--metrics_port=-1"});
  unsetenv("OPTSTEP_CPU_ISA");
  unsetenv("OPTSTEP_CPU_GEMM");
  ASSERT_THAT(server.status(), IsOk());
  auto metrics = ScrapeMetrics((*server)->metrics_port());
  EXPECT_EQ(metrics["optstep_cpu_isa{variant=\"baseline\"}"], 1);
  for (const char* wider : {"avx2", "avx512"}) {
    EXPECT_EQ(metrics.count(absl::StrCat("optstep_cpu_isa{variant=\"", wider, "\"}")), 0u);
  }
  EXPECT_EQ(metrics["optstep_gemm_backend{backend=\"openblas\"}"], 1);
  EXPECT_EQ(metrics.count("optstep_gemm_backend{backend=\"onednn\"}"), 0u);
}

}  // namespace
}  // namespace optstep
